"""The outbox dashboard and alert rules as code, and the files they generate.

    python -m dashboards.build  writes  dashboards/outbox-overview.json          the dashboard, uid outbox-overview
                                        deploy/grafana/alerting/outbox-rules.yaml  Grafana-managed alert rules
                                        deploy/prometheus/outbox-rules.yml         the same expressions, for promtool

Every panel's query and every alert's expression is written once here; `tests/test_dashboards.py` fails
when a committed file differs from what this module generates, evaluates every panel query against a real
Prometheus, and proves each alert with `promtool test rules`.

Cells: an exporter serving cells labels every series `cell` (`outbox metrics serve --all-cells`). Every
panel's query selects the dashboard's `cell` variable (`in_cells` adds `cell=~"$cell"` to each of its series
selectors; a series without the label matches it too, so a single database's dashboard works as before), and
the "All cells" row shows one line per cell. Every alert aggregates `by (..., cell)`, so it fires per cell,
and its summary and commands name the cell when the series have one (`IN_CELL`, `CELL_OPTION`).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import alerting, dashboard, expr, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.alerting import RelativeTimeRange
from grafana_foundation_sdk.models.dashboard import DataSourceRef, DataTransformerConfig, VariableOption
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_FILE = ROOT / "dashboards" / "outbox-overview.json"
GRAFANA_RULES_FILE = ROOT / "deploy" / "grafana" / "alerting" / "outbox-rules.yaml"
PROMETHEUS_RULES_FILE = ROOT / "deploy" / "prometheus" / "outbox-rules.yml"

DASHBOARD_UID = "outbox-overview"
PROMETHEUS_UID = "outbox-prometheus"  # fixed in deploy/grafana/datasources/outbox.yaml
POSTGRES_UID = "outbox-postgres"


def _source_url() -> str:
    """The repository's address, `[project.urls] Source` in pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return str(project["urls"]["Source"]).rstrip("/")


# Each alert links to its runbook, a section of docs/operations.md on the main branch.
RUNBOOKS_PAGE = "docs/operations.md"
RUNBOOK = f"{_source_url()}/blob/main/{RUNBOOKS_PAGE}#runbook"

PROM = DataSourceRef(type_val="prometheus", uid="${datasource}")
KIND = 'kind=~"$kind"'
CELL = 'cell=~"$cell"'
RATE = "$__rate_interval"
# a series selector of an outbox metric, with its matchers if it has any
_SELECTOR = re.compile(r"\b((?:action|outbox)_[a-z_]+)(?:\{([^}]*)\})?")
# in an alert's summary and description: the cell, when the series have one (Go templates)
IN_CELL = "{{ if $labels.cell }}Cell {{ $labels.cell }}: {{ end }}"
CELL_OPTION = "{{ if $labels.cell }} --cell {{ $labels.cell }}{{ end }}"


def in_cells(expr: str) -> str:
    """`expr` with every outbox series selector restricted to the dashboard's `cell` variable."""
    return _SELECTOR.sub(lambda m: f"{m[1]}{{{CELL}{',' + m[2] if m[2] else ''}}}", expr)


_COMMAND = re.compile(r"`outbox ([a-z-]+)")


def with_cell_option(description: str) -> str:
    """`description` with `--cell <the series' cell>` given to each outbox command, when there is a cell."""
    return _COMMAND.sub(lambda m: f"`outbox {m[1]}{CELL_OPTION}", description)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


def _target(query: Query, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(in_cells(query.expr)).legend_format(query.legend or "__auto").ref_id(ref)


def graph(title: str, unit: str, *queries: Query, description: str = "") -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(PROM).height(8).span(12).min(0)
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, chr(ord("A") + index)))
    return panel.description(description) if description else panel


def number(title: str, unit: str, query: Query, description: str = "") -> stat.Panel:
    panel = stat.Panel().title(title).unit(unit).datasource(PROM).height(4).span(6).with_target(_target(query, "A"))
    return panel.description(description) if description else panel


class SqlQuery(cogbuilder.Builder[variants.Dataquery]):
    """A PostgreSQL datasource query (the SDK has no typed builder for it)."""

    def __init__(self, sql: str, ref: str = "A") -> None:
        self._sql, self._ref = sql, ref

    def build(self) -> variants.Dataquery:
        return _Json(
            {
                "refId": self._ref,
                "rawSql": self._sql,
                "format": "table",
                "editorMode": "code",
                "datasource": {"type": "grafana-postgresql-datasource", "uid": POSTGRES_UID},
            }
        )


class _Json(variants.Dataquery):
    def __init__(self, payload: dict[str, Any]) -> None:
        self._payload = payload

    def to_json(self) -> dict[str, Any]:
        return self._payload


# The per-lane drill-down: lane keys never become Prometheus labels; Grafana reads them as outbox_reader.
# The deepest lanes on ix_agent_action_lane_pending; each one's head is its oldest action not started.
LANES_SQL = """WITH deepest AS MATERIALIZED (
    SELECT lane_key, count(*) AS depth FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED')
     GROUP BY lane_key ORDER BY depth DESC, lane_key LIMIT 20
)
SELECT d.lane_key AS lane, d.depth, h.id AS head, h.state AS head_state,
       extract(epoch FROM now() - h.due_at) AS head_waiting_seconds,
       EXISTS (SELECT 1 FROM agent_action AS x WHERE x.lane_key = d.lane_key AND x.state = 'EXECUTING') AS executing
  FROM deepest AS d
 CROSS JOIN LATERAL (
    SELECT p.id, p.state, p.due_at FROM agent_action AS p
     WHERE p.lane_key = d.lane_key AND p.state IN ('PROPOSED', 'ADMITTED') ORDER BY p.id LIMIT 1
 ) AS h
 ORDER BY d.depth DESC, head_waiting_seconds DESC"""


# Emails an operator must decide on, newest first: what finds each at the provider (the notice and the
# Message-ID) and why it ended. One branch per state, so the UNCERTAIN branch reads the partial index
# ix_agent_action_uncertain and the FAILED one ix_agent_action_ended; every column is one outbox_reader reads.
_EMAILS_ENDED = """SELECT id, trace->>'notice' AS notice, trace->>'message_id' AS message_id, state,
                stop_reason AS reason, last_error, ended_at
           FROM agent_action
          WHERE state = '{state}' AND kind = 'EMAIL' AND ended_at > now() - interval '7 days'
          ORDER BY ended_at DESC
          LIMIT 50"""
EMAILS_SQL = f"""SELECT id, notice, message_id, state, reason, last_error, ended_at
  FROM (({_EMAILS_ENDED.format(state="UNCERTAIN")})
        UNION ALL
        ({_EMAILS_ENDED.format(state="FAILED")})) AS e
 ORDER BY ended_at DESC
 LIMIT 50"""
# a fixed id, so the UNCERTAIN-email alert links to this panel (Grafana gives panels without one their own)
EMAILS_PANEL_ID = 100
EMAILS_PANEL_TITLE = "Recent UNCERTAIN and FAILED emails"


# Webhooks, events, Slack messages, GitLab and GitHub posts an operator must decide on: the same shape as the
# emails, with what finds each at its provider (the event type, the endpoint, subject, channel, project or
# repository, the webhook-id, Nats-Msg-Id or marker its adapter noted).
_EFFECTS_ENDED = """SELECT id, kind, trace->>'event_type' AS event_type,
                coalesce(trace->>'endpoint', trace->>'subject', trace->>'channel', trace->>'project',
                         trace->>'repo') AS destination,
                coalesce(trace->>'webhook_id', trace->>'msg_id', trace->>'marker') AS provider_id, state,
                stop_reason AS reason, last_error, ended_at
           FROM agent_action
          WHERE state = '{state}' AND kind IN ('WEBHOOK', 'NATS_EVENT', 'SLACK_MESSAGE', 'GITLAB_POST', 'GITHUB_POST')
            AND ended_at > now() - interval '7 days'
          ORDER BY ended_at DESC
          LIMIT 50"""
EFFECTS_SQL = f"""SELECT id, kind, event_type, destination, provider_id, state, reason, last_error, ended_at
  FROM (({_EFFECTS_ENDED.format(state="UNCERTAIN")})
        UNION ALL
        ({_EFFECTS_ENDED.format(state="FAILED")})) AS e
 ORDER BY ended_at DESC
 LIMIT 50"""
EFFECTS_PANEL_ID = 101
EFFECTS_PANEL_TITLE = "Recent UNCERTAIN and FAILED webhooks and events"
# the kinds whose effects reach a receiver or a stream, and read back
EFFECT_KINDS = 'kind=~"WEBHOOK|NATS_EVENT|SLACK_MESSAGE|GITLAB_POST|GITHUB_POST"'


def quantiles(metric: str, by: str = "le") -> list[Query]:
    return [
        Query(f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{{{KIND}}}[{RATE}])))", f"p{int(q * 100)}")
        for q in (0.5, 0.95, 0.99)
    ]


# The "All cells" table: one line per cell, the figures `outbox status --all-cells` prints, as of now. A cell
# whose exporter cannot read its database has its line with only "reads its database: no". With no cell
# label, one line for the one database.
CELL_COLUMNS = {
    "reads its database": "min by (cell) (outbox_exporter_up)",
    "backlog": "sum by (cell) (outbox_due_actions) + sum by (cell) (outbox_lane_waiting_actions)",
    "oldest due (s)": "max by (cell) (outbox_oldest_due_age_seconds)",
    "UNCERTAIN, 24 h": 'sum by (cell) (increase(action_ended_total{state="UNCERTAIN"}[24h]))',
    "executors": "sum by (cell) (outbox_executors)",
    # every destination held back, whatever the cause; 0 for a cell read without any
    "destinations paused": "sum by (cell) (clamp_max(outbox_destination_paused + outbox_destination_broken"
    " + outbox_destination_credentials_refused, 1)) or sum by (cell) (0 * outbox_executors)",
}
CELLS_PANEL_TITLE = "All cells"


def cells_table() -> table.Panel:
    panel = (
        table.Panel()
        .title(CELLS_PANEL_TITLE)
        .unit("short")
        .height(8)
        .span(24)
        .datasource(PROM)
        .description(
            "One line per cell, as `outbox status --all-cells` prints: the backlog (due, and due behind their"
            " lane's head), how long the oldest due action has waited, actions ended UNCERTAIN in 24 h, the"
            " executors that beat, and the destinations paused or broken."
        )
    )
    refs = [chr(ord("A") + index) for index in range(len(CELL_COLUMNS))]
    for ref, promql in zip(refs, CELL_COLUMNS.values(), strict=True):
        panel = panel.with_target(
            prometheus.Dataquery().expr(in_cells(promql)).instant().format(PromQueryFormat.TABLE).ref_id(ref)
        )
    names = {f"Value #{ref}": column for ref, column in zip(refs, CELL_COLUMNS, strict=True)}
    return panel.with_transformation(DataTransformerConfig(id_val="merge", options={})).with_transformation(
        DataTransformerConfig(
            id_val="organize", options={"excludeByName": {"Time": True}, "renameByName": names, "indexByName": {}}
        )
    )


def overview() -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard("Outbox overview")
        .uid(DASHBOARD_UID)
        .tags(["outbox"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("cell")
            .label("Cell")
            .datasource(PROM)
            .query("label_values(outbox_exporter_up, cell)")
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all"))
        )
        .with_variable(
            dashboard.QueryVariable("kind")
            .label("Kind")
            .datasource(PROM)
            .query(f"label_values(action_attempts_total{{{CELL}}}, kind)")
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    board = (
        board.with_row(dashboard.Row("All cells"))
        .with_panel(cells_table())
        .with_row(dashboard.Row("Health"))
        .with_panel(number("Exporter reads the database", "bool_yes_no", Query("min(outbox_exporter_up)")))
        .with_panel(number("Executors alive", "short", Query("sum(outbox_executors)")))
        .with_panel(
            number(
                "UNCERTAIN emails, 24 h",
                "short",
                Query('sum(increase(action_ended_total{kind="EMAIL",state="UNCERTAIN"}[24h]))'),
                f"Emails that may or may not have gone out: see [the runbook]({RUNBOOK}-uncertain-email).",
            )
        )
        .with_panel(
            number(
                "UNCERTAIN webhooks and events, 24 h",
                "short",
                Query(f'sum(increase(action_ended_total{{{EFFECT_KINDS},state="UNCERTAIN"}}[24h]))'),
                "Webhooks and events that may or may not have reached their receiver or stream: see"
                f" [the runbook]({RUNBOOK}-uncertain-webhook-or-event).",
            )
        )
        .with_panel(
            number("Since the last purge", "s", Query("time() - max(outbox_purge_last_success_timestamp_seconds)"))
        )
        .with_row(dashboard.Row("Throughput and outcomes"))
        .with_panel(
            graph(
                "Attempts by kind and result",
                "ops",
                Query(f"sum by (kind, result) (rate(action_attempts_total{{{KIND}}}[{RATE}]))", "{{kind}} {{result}}"),
            )
        )
        .with_panel(
            graph(
                "Writes not recorded (a newer claim or an erasure)",
                "ops",
                Query(f'sum by (kind) (rate(action_attempts_total{{{KIND},recorded="false"}}[{RATE}]))', "{{kind}}"),
            )
        )
        .with_panel(
            graph(
                "Ended by state and reason",
                "ops",
                Query(f"sum by (state, reason) (rate(action_ended_total{{{KIND}}}[{RATE}]))", "{{state}} {{reason}}"),
            )
        )
        .with_panel(
            graph(
                "UNCERTAIN emails",
                "short",
                Query(
                    f'sum by (reason) (increase(action_ended_total{{kind="EMAIL",state="UNCERTAIN"}}[{RATE}]))',
                    "{{reason}}",
                ),
            )
        )
        .with_row(dashboard.Row("Latency"))
        .with_panel(graph("Attempt duration (claim to result)", "s", *quantiles("action_attempt_duration_seconds")))
        .with_panel(graph("Pickup delay (due to claim)", "s", *quantiles("action_pickup_delay_seconds")))
        .with_row(dashboard.Row("Backlog"))
        .with_panel(
            graph(
                "Actions not ended, by state", "short", Query(f"sum by (state) (outbox_actions{{{KIND}}})", "{{state}}")
            )
        )
        .with_panel(
            graph(
                "Oldest due action",
                "s",
                Query(f"max by (kind) (outbox_oldest_due_age_seconds{{{KIND}}})", "{{kind}}"),
                description="How long the oldest action an executor could claim now has waited to be claimed.",
            )
        )
        .with_panel(
            graph(
                "Due actions, and those waiting for their lane",
                "short",
                Query(f"sum by (kind) (outbox_due_actions{{{KIND}}})", "{{kind}} due"),
                Query(f"sum by (kind) (outbox_lane_waiting_actions{{{KIND}}})", "{{kind}} waiting for their lane"),
                description="Due: what an executor could claim now (lane heads with nothing of their lane executing,"
                " expired leases to take back). Waiting for their lane: due actions behind their lane's head (in a"
                " backoff, PROPOSED) or behind its executing action; they start in lane order.",
            )
        )
        .with_panel(
            graph(
                "Lanes with a backlog, and the deepest lane",
                "short",
                Query("max(outbox_lanes_with_backlog)", "lanes with a backlog"),
                Query("max(outbox_lane_depth_max)", "deepest lane"),
            )
        )
        .with_panel(
            graph(
                "Lane depth",
                "short",
                Query("histogram_quantile(0.5, max by (le) (outbox_lane_depth_bucket))", "p50"),
                Query("histogram_quantile(0.99, max by (le) (outbox_lane_depth_bucket))", "p99"),
            )
        )
        .with_panel(
            graph(
                "Executing, and leases expired",
                "short",
                Query(f"sum(outbox_executing_actions{{{KIND}}})", "executing"),
                Query(f"sum(outbox_expired_leases{{{KIND}}})", "lease expired"),
            )
        )
        .with_row(dashboard.Row("Destinations"))
        .with_panel(
            graph(
                "Destinations paused or broken",
                "short",
                Query(f"max by (destination) (outbox_destination_paused{{{KIND}}})", "{{destination}} paused"),
                Query(f"max by (destination) (outbox_destination_broken{{{KIND}}})", "{{destination}} broken"),
                description="1 while no executor claims for the destination (a provider's slow-down or an"
                " operator's pause), or while it is broken (one probe at a time). `outbox destinations` lists"
                f" them with the reason; see [the runbook]({RUNBOOK}-destination-paused).",
            )
        )
        .with_panel(
            graph(
                "Destination rate and pace",
                "ops",
                Query(f"max by (destination) (outbox_destination_rate{{{KIND}}})", "{{destination}} rate"),
                Query(f"max by (destination) (outbox_destination_pace{{{KIND}}})", "{{destination}} pace"),
                description="The configured rate all executors hold together, and the pace a provider's"
                " slow-downs set (it rises again while the provider accepts); attempts a second.",
            )
        )
        .with_panel(
            graph(
                "Waiting actions by destination",
                "short",
                Query(f"sum by (destination) (outbox_destination_waiting_actions{{{KIND}}})", "{{destination}}"),
                description="Actions not started (PROPOSED or ADMITTED), by where they go.",
            )
        )
        .with_panel(
            graph(
                "Oldest due action by destination",
                "s",
                Query(f"max by (destination) (outbox_destination_oldest_due_age_seconds{{{KIND}}})", "{{destination}}"),
                description="How long the oldest due lane head of each destination has waited to be claimed:"
                " a paused or broken destination's grows. An action waits at most until its expires_at; see"
                f" [the runbook]({RUNBOOK}-destination-backlog).",
            )
        )
        .with_row(dashboard.Row("Emails to decide on"))
        .with_panel(
            table.Panel()
            .id(EMAILS_PANEL_ID)
            .title(EMAILS_PANEL_TITLE)
            .unit("short")
            .height(10)
            .span(24)
            .datasource(DataSourceRef(type_val="grafana-postgresql-datasource", uid=POSTGRES_UID))
            .description(
                "The last 7 days, newest first, read through outbox_reader. Search the provider's logs for the"
                f" Message-ID; see [the runbook]({RUNBOOK}-uncertain-email)."
            )
            .with_target(SqlQuery(EMAILS_SQL))
        )
        .with_row(dashboard.Row("Webhooks and events to decide on"))
        .with_panel(
            table.Panel()
            .id(EFFECTS_PANEL_ID)
            .title(EFFECTS_PANEL_TITLE)
            .unit("short")
            .height(10)
            .span(24)
            .datasource(DataSourceRef(type_val="grafana-postgresql-datasource", uid=POSTGRES_UID))
            .description(
                "The last 7 days, newest first, read through outbox_reader. provider_id is the webhook-id the"
                " receiver deduplicates by, or the event's Nats-Msg-Id in its stream; see"
                f" [the runbook]({RUNBOOK}-uncertain-webhook-or-event)."
            )
            .with_target(SqlQuery(EFFECTS_SQL))
        )
        .with_row(dashboard.Row("Lanes"))
        .with_panel(
            table.Panel()
            .title("Deepest lanes (PostgreSQL)")
            .unit("short")
            .height(10)
            .span(24)
            .datasource(DataSourceRef(type_val="grafana-postgresql-datasource", uid=POSTGRES_UID))
            .description("Read through the read-only role outbox_reader; lane keys never become metric labels.")
            .with_target(SqlQuery(LANES_SQL))
        )
        .with_row(dashboard.Row("Executors and purge"))
        .with_panel(graph("Executors alive", "short", Query("sum(outbox_executors)", "executors")))
        .with_panel(
            graph(
                "Since the last purge",
                "s",
                Query("time() - max(outbox_purge_last_success_timestamp_seconds)", "since last purge"),
            )
        )
        .with_panel(
            graph("Exporter scrape duration", "s", Query("max(outbox_exporter_scrape_duration_seconds)", "scrape"))
        )
    )
    return board.build()


@dataclass(frozen=True)
class Alert:
    """One alert, written once for Grafana and for Prometheus.

    Grafana runs `query` (instant) as its query A and fires each series whose value passes `op threshold`
    (expression B); when A returns no series the rule takes `no_data` ("OK", or "Alerting" for what must
    page when it vanishes). The Prometheus rule is `query op threshold`, with `or absent(query)` when a
    missing series must page too.
    """

    uid: str
    title: str
    query: str
    op: str  # "gt" or "lt"
    threshold: float
    for_: str
    severity: str
    summary: str
    description: str
    runbook: str
    no_data: str = "OK"
    panel_id: int | None = None  # the overview panel Grafana links the alert to

    @property
    def annotations(self) -> dict[str, str]:
        """The summary and description, naming the cell when the series have one, and the runbook."""
        return {
            "summary": f"{IN_CELL}{self.summary}",
            "description": with_cell_option(self.description),
            "runbook_url": f"{RUNBOOK}-{self.runbook}",
        }

    @property
    def expr(self) -> str:
        condition = f"{self.query} {'>' if self.op == 'gt' else '<'} {self.threshold:g}"
        return f"{condition} or absent({self.query})" if self.no_data == "Alerting" else condition


ALERTS = [
    Alert(
        "outbox-email-uncertain",
        "OutboxEmailUncertain",
        'sum by (reason, cell) (increase(action_ended_total{kind="EMAIL",state="UNCERTAIN"}[5m]))',
        "gt",
        0,
        "0m",
        "page",
        "An email ended UNCERTAIN ({{ $labels.reason }})",
        "outbox cannot know whether an email went out, and will not send it again. Find it with "
        "`outbox list --state UNCERTAIN --kind EMAIL --since 1h` and decide with the recipient's team.",
        "uncertain-email",
        panel_id=EMAILS_PANEL_ID,
    ),
    Alert(
        "outbox-backlog-stale",
        "OutboxBacklogStale",
        "max by (kind, cell) (outbox_oldest_due_age_seconds)",
        "gt",
        900,
        "5m",
        "page",
        "{{ $labels.kind }} actions have waited more than 15 minutes",
        "An action an executor could claim has not been claimed for 15 minutes: executors are down, too few, "
        "or none carries this kind (actions waiting behind their lane's head do not count). `outbox status` "
        "shows whether executors run and leases expire.",
        "backlog",
    ),
    Alert(
        "outbox-executors-down",
        "OutboxExecutorsDown",
        "sum by (cell) (outbox_executors)",
        "lt",
        1,
        "5m",
        "page",
        "No outbox executor is running",
        "No executor has beaten for 5 minutes, or no exporter reports them: nothing is being sent. Check the "
        "Prefect workers and the outbox-drain deployment's runs.",
        "executors-down",
        no_data="Alerting",
    ),
    Alert(
        "outbox-purge-failing",
        "OutboxPurgeFailing",
        "time() - max by (cell) (outbox_purge_last_success_timestamp_seconds)",
        "gt",
        172800,
        "1h",
        "ticket",
        "The retention purge has not succeeded for two days",
        "Ended actions pile up. Check the outbox-purge deployment's runs, or run `outbox purge` by hand.",
        "purge",
    ),
    Alert(
        "outbox-exporter-down",
        "OutboxExporterDown",
        "min by (cell) (outbox_exporter_up)",
        "lt",
        1,
        "5m",
        "page",
        "The outbox exporter cannot read the database, or Prometheus does not scrape it",
        "For 5 minutes an exporter has reported outbox_exporter_up 0, or no exporter has been scraped: every "
        "other outbox alert is blind. Check the exporter's log and Prometheus's targets.",
        "exporter-down",
        no_data="Alerting",
    ),
    Alert(
        "outbox-email-failed",
        "OutboxEmailFailed",
        'sum by (reason, cell) (increase(action_ended_total{kind="EMAIL",state="FAILED"}[1h]))',
        "gt",
        0,
        "0m",
        "ticket",
        "An email ended FAILED ({{ $labels.reason }})",
        "outbox will not send it again: the relay refused it or its attempts ran out. Find it with "
        "`outbox list --state FAILED --kind EMAIL --since 1h`.",
        "failed-email",
    ),
    Alert(
        "outbox-effect-uncertain",
        "OutboxEffectUncertain",
        f'sum by (kind, reason, cell) (increase(action_ended_total{{{EFFECT_KINDS},state="UNCERTAIN"}}[5m]))',
        "gt",
        0,
        "0m",
        "page",
        "A {{ $labels.kind }} action ended UNCERTAIN ({{ $labels.reason }})",
        "outbox cannot tell whether the receiver or the stream holds it, and will not send it again. Find it "
        "with `outbox list --state UNCERTAIN --kind {{ $labels.kind }} --since 1h`; `outbox show ID` gives its "
        "webhook-id or message id to look for.",
        "uncertain-webhook-or-event",
        panel_id=EFFECTS_PANEL_ID,
    ),
    Alert(
        "outbox-effect-failed",
        "OutboxEffectFailed",
        f'sum by (kind, reason, cell) (increase(action_ended_total{{{EFFECT_KINDS},state="FAILED"}}[1h]))',
        "gt",
        0,
        "0m",
        "ticket",
        "A {{ $labels.kind }} action ended FAILED ({{ $labels.reason }})",
        "outbox will not send it again: the receiver refused it for good (410) or its retry schedule ran out. "
        "Find it with `outbox list --state FAILED --kind {{ $labels.kind }} --since 1h`.",
        "failed-webhook-or-event",
    ),
    Alert(
        "outbox-expired-leases",
        "OutboxExpiredLeases",
        "max by (kind, cell) (outbox_expired_leases)",
        "gt",
        0,
        "5m",
        "ticket",
        "{{ $labels.kind }} actions have held an expired lease for 5 minutes",
        "Actions stay EXECUTING after their lease expired and no executor takes them back: their lanes are "
        "blocked. `outbox status` shows the expired leases and whether executors run.",
        "expired-leases",
    ),
    Alert(
        "outbox-destination-paused",
        "OutboxDestinationPaused",
        # a provider that keeps slowing down pauses the destination again as soon as a pause ends: the window
        # bridges the moments between two pauses
        "max by (kind, destination, cell) (max_over_time(outbox_destination_paused[2m]))",
        "gt",
        0,
        "15m",
        "ticket",
        "Destination {{ $labels.destination }} has been paused for 15 minutes",
        "No executor has claimed a {{ $labels.kind }} action for {{ $labels.destination }} for 15 minutes: an "
        "operator paused it, or its provider keeps asking to slow down. `outbox destinations` says who paused "
        "it, until when and why.",
        "destination-paused",
    ),
    Alert(
        "outbox-destination-broken",
        "OutboxDestinationBroken",
        # broken already means a run of failures as long as the breaker's window (2 minutes by default): it
        # pages at once
        "max by (kind, destination, cell) (outbox_destination_broken_seconds)",
        "gt",
        0,
        "0m",
        "page",
        "Destination {{ $labels.destination }} is broken",
        "Every attempt to {{ $labels.destination }} failed or was asked to slow down for the breaker's window, "
        "with none accepted: its {{ $labels.kind }} actions wait, one probe at a time. Check the provider; "
        "`outbox destinations` shows since when.",
        "destination-broken",
    ),
    Alert(
        "outbox-destination-credentials-refused",
        "OutboxDestinationCredentialsRefused",
        "max by (kind, destination, cell) (outbox_destination_credentials_refused)",
        "gt",
        0,
        "0m",
        "page",
        "The provider refuses the credentials of {{ $labels.destination }}",
        "{{ $labels.destination }} answered that its credentials are invalid, revoked or its account inactive: no "
        "{{ $labels.kind }} action can be carried out there until the secret is mended. They wait, their attempts "
        "not counted, with one probe every 5 minutes; `outbox destinations` shows the provider's answer.",
        "destination-credentials-refused",
    ),
    Alert(
        "outbox-destination-backlog",
        "OutboxDestinationBacklog",
        "max by (kind, destination, cell) (outbox_destination_oldest_due_age_seconds)",
        "gt",
        1800,
        "5m",
        "ticket",
        "Actions for {{ $labels.destination }} have waited more than 30 minutes",
        "The oldest due {{ $labels.kind }} action for {{ $labels.destination }} has waited 30 minutes to be "
        "claimed: the destination is held back (paused, broken, or paced below what arrives). An action whose "
        "expires_at passes while it waits ends CANCELLED (EXPIRED) and never runs.",
        "destination-backlog",
    ),
]


def grafana_rules() -> dict[str, Any]:
    rules = []
    for alert in ALERTS:
        annotations = alert.annotations
        if alert.panel_id is not None:
            annotations |= {"__dashboardUid__": DASHBOARD_UID, "__panelId__": str(alert.panel_id)}
        rule = (
            alerting.Rule(alert.title)
            .uid(alert.uid)
            .condition("B")
            .for_val(alert.for_)
            .labels({"severity": alert.severity, "service": "outbox"})
            .annotations(annotations)
            .no_data_state(alert.no_data)
            .exec_err_state("Error")
            .with_query(
                alerting.Query("A")
                .datasource_uid(PROMETHEUS_UID)
                .relative_time_range(RelativeTimeRange(600, 0))
                .model(prometheus.Dataquery().expr(alert.query).instant().ref_id("A"))
            )
            .with_query(
                alerting.Query("B")
                .datasource_uid("__expr__")
                .model(
                    expr.TypeThreshold()
                    .ref_id("B")
                    .expression("A")
                    .conditions(
                        [
                            expr.ExprTypeThresholdConditions().evaluator(
                                expr.ExprTypeThresholdConditionsEvaluator()
                                .type(alert.op)
                                .params([float(alert.threshold)])
                            )
                        ]
                    )
                )
            )
        )
        # the group carries the folder, org and group name: drop the rule's empty copies of them
        rules.append({k: v for k, v in _plain(rule.build()).items() if k not in ("folderUID", "orgID", "ruleGroup")})
    return {
        "apiVersion": 1,
        "groups": [{"orgId": 1, "name": "outbox", "folder": "outbox", "interval": "1m", "rules": rules}],
    }


def prometheus_rules() -> dict[str, Any]:
    return {
        "groups": [
            {
                "name": "outbox",
                "interval": "1m",
                "rules": [
                    {
                        "alert": a.title,
                        "expr": a.expr,
                        "for": a.for_,
                        "labels": {"severity": a.severity, "service": "outbox"},
                        "annotations": a.annotations,
                    }
                    for a in ALERTS
                ],
            }
        ]
    }


def _plain(model: Any) -> Any:
    return json.loads(json.dumps(model, cls=JSONEncoder))


def rendered() -> dict[Path, str]:
    """Each generated file's exact text."""
    return {
        DASHBOARD_FILE: json.dumps(_plain(overview()), indent=2, sort_keys=True) + "\n",
        GRAFANA_RULES_FILE: "# generated by `python -m dashboards.build`; do not edit\n"
        + yaml.safe_dump(grafana_rules(), sort_keys=False, width=120),
        PROMETHEUS_RULES_FILE: "# generated by `python -m dashboards.build`; do not edit\n"
        + yaml.safe_dump(prometheus_rules(), sort_keys=False, width=120),
    }


def main() -> None:
    for path, content in rendered().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
