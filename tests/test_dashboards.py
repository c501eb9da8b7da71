"""Dashboards and alerts as code, proven against real parts.

The committed files equal what `dashboards/build.py` generates; every alert fires and stays silent as
`promtool test rules` expects; and, with a real workload, a real exporter and a real Prometheus scraping it,
every panel query of the committed dashboard returns data and the scraped counters equal the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from dashboards import build
from demo.sink import Faults, SmtpSink
from examples.accounts import notices, schema
from outbox.email import EmailAdapter, SmtpSettings, enqueue_email
from outbox.executor import Executor
from outbox.store import destinations as store_destinations
from tests.support import insert_ended, until
from tests.test_destinations_operator import pace_lowered
from tests.test_reader_role import reader_login

ROOT = Path(__file__).resolve().parent.parent
# an outbox series selector and its matchers
SELECTOR = re.compile(r"\b((?:action|outbox)_[a-z_]+)(\{[^}]*\})?")
DASHBOARD = json.loads(build.DASHBOARD_FILE.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def test_the_committed_files_are_what_the_code_generates() -> None:
    for path, content in build.rendered().items():
        assert path.read_text() == content, f"{path.relative_to(ROOT)} is stale: run `python -m dashboards.build`"


def test_every_panel_has_a_unit_a_fixed_uid_and_the_template_variables() -> None:
    assert DASHBOARD["uid"] == "outbox-overview"
    assert {v["name"] for v in DASHBOARD["templating"]["list"]} == {"datasource", "cell", "kind"}
    for panel in panels():
        assert panel["fieldConfig"]["defaults"].get("unit"), f"panel {panel['title']!r} has no unit"
        assert panel["targets"], f"panel {panel['title']!r} has no query"


def test_every_series_a_panel_selects_is_of_the_chosen_cells_all_by_default() -> None:
    (cell,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "cell"]
    assert (cell["includeAll"], cell["allValue"], cell["current"]["value"]) == (True, ".*", "$__all")
    selectors = 0
    for panel in panels():
        for target in panel["targets"]:
            for name, matchers in SELECTOR.findall(target.get("expr", "")):
                assert 'cell=~"$cell"' in matchers, f"panel {panel['title']!r}: {name} is not of $cell"
                selectors += 1
    assert selectors > 40


def test_every_alert_fires_when_it_should_and_stays_silent_otherwise() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs Debian's prometheus"
    checked = subprocess.run(
        [promtool, "test", "rules", str(ROOT / "tests/promtool/outbox-rules.test.yml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(build.PROMETHEUS_RULES_FILE.read_text())["groups"]
        for rule in group["rules"]
    }
    tested = yaml.safe_load((ROOT / "tests/promtool/outbox-rules.test.yml").read_text())
    assert alerts == {t["alertname"] for case in tested["tests"] for t in case["alert_rule_test"]}


def test_grafana_rules_carry_the_same_expressions_and_a_runbook() -> None:
    """Grafana's query and threshold and Prometheus's expression come from one `Alert`; both link the same
    runbook (tests/test_docs.py checks that its section exists). tests/test_alerts.py evaluates the Grafana
    rules as Grafana does."""
    grafana = yaml.safe_load(build.GRAFANA_RULES_FILE.read_text())
    prometheus = yaml.safe_load(build.PROMETHEUS_RULES_FILE.read_text())
    by_title = {r["title"]: r for g in grafana["groups"] for r in g["rules"]}
    alerts = {a.title: a for a in build.ALERTS}
    for rule in prometheus["groups"][0]["rules"]:
        alert, grafana_rule = alerts[rule["alert"]], by_title[rule["alert"]]
        assert grafana_rule["data"][0]["model"]["expr"] == alert.query
        assert grafana_rule["data"][1]["model"]["conditions"][0]["evaluator"] == {
            "type": alert.op,
            "params": [alert.threshold],
        }
        assert grafana_rule["noDataState"] == alert.no_data
        assert rule["expr"] == alert.expr
        runbook = rule["annotations"]["runbook_url"]
        assert grafana_rule["annotations"]["runbook_url"] == runbook
        assert runbook.startswith(f"{build.RUNBOOK}-"), f"{rule['alert']} links to {runbook}, not a runbook"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_lane_table_reads_as_the_read_only_role(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                " max_attempts, state) SELECT 'TEST_NOOP', 1, 'deep', 'k' || g, '{}', 5, 'ADMITTED'"
                " FROM generate_series(1, 3) g"
            )
        )
    with engine.connect() as conn:
        conn.execute(text("SET ROLE outbox_reader"))
        rows = conn.execute(text(build.LANES_SQL)).mappings().all()
        with pytest.raises(Exception, match="permission denied"):
            conn.execute(text("DELETE FROM agent_action"))
    assert [(r["lane"], r["depth"], r["head_state"]) for r in rows] == [("deep", 3, "ADMITTED")]


def test_the_email_table_reads_uncertain_and_failed_emails_as_a_reader_login(
    engine: Engine, admin_engine: Engine, database_url: str
) -> None:
    """The panel's SQL as a LOGIN role granted outbox_reader: the UNCERTAIN and FAILED emails of the last
    7 days come back with what finds them at the provider, newest first; nothing else does."""
    uncertain = insert_ended(engine, ended_ago=timedelta(hours=1), state="UNCERTAIN", stop_reason="PROVIDER_UNCERTAIN")
    failed = insert_ended(engine, ended_ago=timedelta(hours=2), state="FAILED", stop_reason="PROVIDER_REFUSED")
    done = insert_ended(engine, ended_ago=timedelta(hours=1))
    old = insert_ended(engine, ended_ago=timedelta(days=8), state="UNCERTAIN", stop_reason="PROVIDER_UNCERTAIN")
    other_kind = insert_ended(engine, ended_ago=timedelta(hours=1), state="FAILED", stop_reason="PROVIDER_REFUSED")
    traced = {
        uncertain[0]: ("workspace_alert", "<outbox.u@example.com>", "data: TimeoutError during or after DATA"),
        failed[0]: ("verify_address", "<outbox.f@example.com>", "mail: 550; the relay refused it"),
    }
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))  # ended rows are guarded
        for ident in [*uncertain, *failed, *done, *old]:
            notice, message_id, error = traced.get(ident, ("n", "<m>", "e"))
            conn.execute(
                text(
                    "UPDATE agent_action SET kind = 'EMAIL', last_error = :error,"
                    " trace = jsonb_build_object('notice', CAST(:notice AS text),"
                    " 'message_id', CAST(:message_id AS text)) WHERE id = :id"
                ),
                {"id": ident, "notice": notice, "message_id": message_id, "error": error},
            )
    assert other_kind
    with reader_login(admin_engine, database_url) as url:
        reader = create_engine(url)
        try:
            with reader.connect() as conn:
                rows = conn.execute(text(build.EMAILS_SQL)).mappings().all()
                conn.execute(text("SET enable_seqscan = off"))
                plan = "\n".join(conn.execute(text(f"EXPLAIN {build.EMAILS_SQL}")).scalars())
        finally:
            reader.dispose()
    assert [
        (r["id"], r["notice"], r["message_id"], r["state"], r["reason"], r["last_error"], r["ended_at"] is not None)
        for r in rows
    ] == [
        (uncertain[0], *traced[uncertain[0]][:2], "UNCERTAIN", "PROVIDER_UNCERTAIN", traced[uncertain[0]][2], True),
        (failed[0], *traced[failed[0]][:2], "FAILED", "PROVIDER_REFUSED", traced[failed[0]][2], True),
    ]
    assert "ix_agent_action_uncertain" in plan, plan


def test_the_effects_table_reads_uncertain_and_failed_webhooks_and_events_as_a_reader_login(
    engine: Engine, admin_engine: Engine, database_url: str
) -> None:
    """The webhooks-and-events panel's SQL as a reader login: each UNCERTAIN or FAILED WEBHOOK and
    NATS_EVENT of the last 7 days with where it went and the id its provider knows it by; no email."""
    hook = insert_ended(engine, ended_ago=timedelta(hours=1), state="UNCERTAIN", stop_reason="PROVIDER_UNCERTAIN")
    event = insert_ended(engine, ended_ago=timedelta(hours=2), state="FAILED", stop_reason="ATTEMPTS_EXHAUSTED")
    email = insert_ended(engine, ended_ago=timedelta(hours=1), state="UNCERTAIN", stop_reason="PROVIDER_UNCERTAIN")
    done = insert_ended(engine, ended_ago=timedelta(hours=1))
    traces = {
        hook[0]: ("WEBHOOK", {"event_type": "invoice.paid", "endpoint": "billing", "webhook_id": "msg_1"}),
        event[0]: ("NATS_EVENT", {"event_type": "order.created", "subject": "orders.created.ev1", "msg_id": "ev1"}),
        email[0]: ("EMAIL", {"notice": "n", "message_id": "<m>"}),
        done[0]: ("WEBHOOK", {"event_type": "invoice.paid", "endpoint": "billing", "webhook_id": "msg_2"}),
    }
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))  # ended rows are guarded
        for ident, (kind, trace) in traces.items():
            conn.execute(
                text("UPDATE agent_action SET kind = :kind, trace = CAST(:trace AS jsonb) WHERE id = :id"),
                {"id": ident, "kind": kind, "trace": json.dumps(trace)},
            )
    with reader_login(admin_engine, database_url) as url:
        reader = create_engine(url)
        try:
            with reader.connect() as conn:
                rows = conn.execute(text(build.EFFECTS_SQL)).mappings().all()
        finally:
            reader.dispose()
    assert [(r["id"], r["kind"], r["event_type"], r["destination"], r["provider_id"], r["state"]) for r in rows] == [
        (hook[0], "WEBHOOK", "invoice.paid", "billing", "msg_1", "UNCERTAIN"),
        (event[0], "NATS_EVENT", "order.created", "orders.created.ev1", "ev1", "FAILED"),
    ]


def test_the_uncertain_effect_alert_links_to_the_effects_table() -> None:
    grafana = yaml.safe_load(build.GRAFANA_RULES_FILE.read_text())
    rule = {r["uid"]: r for g in grafana["groups"] for r in g["rules"]}["outbox-effect-uncertain"]
    linked = [p for p in DASHBOARD["panels"] if str(p.get("id")) == rule["annotations"]["__panelId__"]]
    assert [t["rawSql"] for t in linked[0]["targets"]] == [build.EFFECTS_SQL]


def test_the_uncertain_email_alert_links_to_the_email_table() -> None:
    grafana = yaml.safe_load(build.GRAFANA_RULES_FILE.read_text())
    rule = {r["uid"]: r for g in grafana["groups"] for r in g["rules"]}["outbox-email-uncertain"]
    annotations = rule["annotations"]
    assert annotations["__dashboardUid__"] == DASHBOARD["uid"]
    linked = [p for p in DASHBOARD["panels"] if str(p.get("id")) == annotations["__panelId__"]]
    assert [p["title"] for p in linked] == ["Recent UNCERTAIN and FAILED emails"]
    assert [t["rawSql"] for t in linked[0]["targets"]] == [build.EMAILS_SQL]


@pytest.fixture
def exporter(database_url: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "OUTBOX_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "metrics", "serve", "--port", str(port), "--cache-seconds", "0"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    until(lambda: _answers(url), what="the exporter to answer")
    yield url
    process.terminate()
    process.wait(10)


@pytest.fixture
def prometheus(exporter: str, tmp_path: Path) -> Iterator[str]:
    with scraping(exporter, tmp_path) as url:
        yield url


@contextlib.contextmanager
def scraping(exporter: str, home: Path, rules: Path = build.PROMETHEUS_RULES_FILE) -> Iterator[str]:
    """A real Prometheus in `home` scraping `exporter` (its /metrics URL) every second, with the alert rules
    (`rules`: the shipped ones unless given) loaded; its URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: .ci/run installs Debian's prometheus"
    port = free_port()
    target = exporter.removeprefix("http://").removesuffix("/metrics")
    config = home / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [{"job_name": "outbox", "static_configs": [{"targets": [target]}]}],
            }
        )
    )
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _answers(f"{url}/-/ready"), what="Prometheus to be ready")
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", (expr, answer)
    return list(answer["data"]["result"])


def scrapes(prometheus: str) -> int:
    found = query(prometheus, "count_over_time(outbox_exporter_up[10m])")
    return int(float(found[0]["value"][1])) if found else 0


async def email_workload(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    """DONE, a RETRY then DONE, FAILED and UNCERTAIN, each through the real SMTP sink."""
    with app.begin() as conn:
        schema.create(conn)
        conn.execute(
            text(
                "INSERT INTO app_account SELECT g, 'A' || g, 'a' || g || '@example.com', false"
                " FROM generate_series(1, 4) g"
            )
        )
    smtp = SmtpSettings(host="127.0.0.1", port=sink.port, sender="outbox@example.com", timeout_seconds=2)
    phases = [
        Faults(),
        Faults(mail="451 4.3.0 later"),
        Faults(rcpt={"a3@example.com": "550 5.1.1 no"}),
        Faults(after_data="drop"),
    ]
    for account, faults in enumerate(phases, start=1):
        with app.begin() as conn:
            enqueue_email(conn, notices.VERIFY_ADDRESS, {"account_id": account})
        sink.faults = faults
        await Executor(aengine, [EmailAdapter(aengine, smtp)], listen=False).run(until_idle=True)
    sink.faults = Faults()
    with app.begin() as conn:
        conn.execute(text("UPDATE agent_action SET due_at = now() WHERE state = 'ADMITTED'"))
    await Executor(aengine, [EmailAdapter(aengine, smtp)], listen=False).run(until_idle=True)


async def test_every_panel_query_returns_data_from_a_real_prometheus(
    engine: Engine, aengine: AsyncEngine, prometheus: str
) -> None:
    sink = SmtpSink().start()
    try:
        await email_workload(engine, aengine, sink)
    finally:
        sink.stop()
    with engine.begin() as conn:  # for the destination panels: a rate and a pace the relay's slow-downs set
        conn.execute(
            store_destinations.SET_RATES, {"names": ["smtp"], "kinds": ["EMAIL"], "rates": [10.0], "bursts": [1.0]}
        )
        pace_lowered(conn, "smtp", "EMAIL")
    seen = scrapes(prometheus)
    until(lambda: scrapes(prometheus) >= seen + 2, what="two scrapes after the workload")

    for panel in panels():
        for target in panel["targets"]:
            if "expr" not in target:
                continue  # the lane table reads PostgreSQL (test_the_lane_table_reads_as_the_read_only_role)
            expr = target["expr"].replace("$kind", ".*").replace("$cell", ".*").replace("$__rate_interval", "1m")
            assert query(prometheus, expr), f"panel {panel['title']!r}: {expr} returned nothing"

    with engine.connect() as conn:
        ended = {
            (s, r): n
            for s, r, n in conn.execute(
                text("SELECT state, stop_reason, count(*) FROM agent_action WHERE ended_at IS NOT NULL GROUP BY 1, 2")
            )
        }
    assert ended == {
        ("DONE", "CONFIRMED"): 2,
        ("FAILED", "PROVIDER_REFUSED"): 1,
        ("UNCERTAIN", "PROVIDER_UNCERTAIN"): 1,
    }
    scraped = {
        (r["metric"]["state"], r["metric"]["reason"]): int(float(r["value"][1]))
        for r in query(prometheus, 'action_ended_total{kind="EMAIL"} > 0')
    }
    assert scraped == ended
    retries = query(prometheus, 'action_attempts_total{kind="EMAIL",result="RETRY",recorded="true"}')
    assert [int(float(r["value"][1])) for r in retries] == [1]
