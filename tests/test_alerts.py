"""Every Grafana-managed alert rule, evaluated the way Grafana evaluates it, against a real Prometheus.

Each alert has a firing scenario and a quiet one: three hours of minute samples written into a TSDB with
`promtool tsdb create-blocks-from openmetrics`, each scenario in a window of its own, six hours from the
next. A real Prometheus serves that TSDB; tests/grafana_rules.py runs each rule's query A at every minute of
the rule's `for` period and a few minutes more, applies its expressions and Grafana's state machine, and
the test asserts Alerting for the firing scenario, Normal for the quiet one, and, where no series exists at
all (an exporter gone, a target lost), the state the rule's `noDataState` chose. The Prometheus rules are
proven on the same scenarios by `promtool test rules` (tests/test_dashboards.py, tests/promtool/).

Every alert keeps the `cell` label: in a third window of its own, the firing scenario's series belong to
cell "us" and the quiet one's to cell "eu"; the Grafana rule and the Prometheus rule (`promtool test rules`
on the same series) fire for "us" only, their summary naming it. The first two windows, without the label,
prove the same rules still fire for a single database.

The backlog alert is also proven on series the real collector read from a real database, minute by minute,
while its clock moves on (every due time of the unended actions moved a minute back): one kind's lane waits
out its head's backoff with due actions behind the head, another kind's head is due and nothing claims it.
Both the Grafana rule and the Prometheus rule (`promtool test rules` on the recorded series) are run on them.
"""

from __future__ import annotations

import contextlib
import copy
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from dashboards import build
from outbox.executor import ActionAttempt, Executor, Result, Retry
from tests import grafana_rules, kinds, test_metrics
from tests.adapters import ScriptedAdapter
from tests.support import until
from tests.test_dashboards import _answers, free_port
from tests.test_executor_results import enqueue

Scenario = dict[str, Callable[[int], float]]  # series ──▶ its value at each minute (-180 … 0) of the window

BASE = 1_700_000_000 - 1_700_000_000 % 3600
WINDOW = 6 * 3600
MINUTES = range(-180, 1)


def counter_step(at: int) -> Callable[[int], float]:
    """A counter at 0 that counts one at minute `at`."""
    return lambda m: 0.0 if m < at else 1.0


def constant(value: float) -> Callable[[int], float]:
    return lambda m: value


def rising(per_minute: float) -> Callable[[int], float]:
    return lambda m: (m + 180) * per_minute


EMAIL_DONE = 'action_ended_total{kind="EMAIL",state="DONE",reason="CONFIRMED"}'
UNCERTAIN = 'action_ended_total{kind="EMAIL",state="UNCERTAIN",reason="PROVIDER_UNCERTAIN"}'
FAILED = 'action_ended_total{kind="EMAIL",state="FAILED",reason="PROVIDER_REFUSED"}'
WEBHOOK_DONE = 'action_ended_total{kind="WEBHOOK",state="DONE",reason="CONFIRMED"}'
EVENT_UNCERTAIN = 'action_ended_total{kind="NATS_EVENT",state="UNCERTAIN",reason="PROVIDER_UNCERTAIN"}'
WEBHOOK_FAILED = 'action_ended_total{kind="WEBHOOK",state="FAILED",reason="ATTEMPTS_EXHAUSTED"}'
SMTP_PAUSED = 'outbox_destination_paused{kind="EMAIL",destination="smtp"}'
HOOK_PAUSED = 'outbox_destination_paused{kind="WEBHOOK",destination="webhook:billing"}'
HOOK_BROKEN = 'outbox_destination_broken_seconds{kind="WEBHOOK",destination="webhook:billing"}'
SMTP_BROKEN = 'outbox_destination_broken_seconds{kind="EMAIL",destination="smtp"}'
SLACK_REFUSED = 'outbox_destination_credentials_refused{kind="SLACK_MESSAGE",destination="slack:acme"}'
SMTP_REFUSED = 'outbox_destination_credentials_refused{kind="EMAIL",destination="smtp"}'
SMTP_DUE_AGE = 'outbox_destination_oldest_due_age_seconds{kind="EMAIL",destination="smtp"}'
NATS_DUE_AGE = 'outbox_destination_oldest_due_age_seconds{kind="NATS_EVENT",destination="nats"}'

# alert ──▶ (firing, quiet); every alert's `noDataState` is asserted in NO_DATA
SCENARIOS: dict[str, tuple[Scenario, Scenario]] = {
    "OutboxEmailUncertain": (
        {UNCERTAIN: counter_step(-2), EMAIL_DONE: rising(5)},
        {UNCERTAIN: constant(0), EMAIL_DONE: rising(5)},
    ),
    "OutboxBacklogStale": (
        {
            'outbox_oldest_due_age_seconds{kind="EMAIL"}': rising(60),
            'outbox_oldest_due_age_seconds{kind="TEST"}': constant(0),
        },
        {
            'outbox_oldest_due_age_seconds{kind="EMAIL"}': constant(30),
            'outbox_oldest_due_age_seconds{kind="TEST"}': constant(0),
        },
    ),
    "OutboxExecutorsDown": (
        {'outbox_executors{instance="a"}': constant(0), 'outbox_executors{instance="b"}': constant(0)},
        {'outbox_executors{instance="a"}': constant(2), 'outbox_executors{instance="b"}': constant(2)},
    ),
    "OutboxPurgeFailing": (
        # the value is a time: set relative to the window's end in `openmetrics`
        {"outbox_purge_last_success_timestamp_seconds": constant(-3 * 86400)},
        {"outbox_purge_last_success_timestamp_seconds": constant(-3600)},
    ),
    "OutboxExporterDown": (
        {"outbox_exporter_up": constant(0)},
        {"outbox_exporter_up": constant(1)},
    ),
    "OutboxEmailFailed": (
        {FAILED: counter_step(-10), EMAIL_DONE: rising(5)},
        {FAILED: constant(0), EMAIL_DONE: rising(5)},
    ),
    # an email that ended UNCERTAIN or FAILED is not one of these (the quiet scenarios hold one)
    "OutboxEffectUncertain": (
        {EVENT_UNCERTAIN: counter_step(-2), WEBHOOK_DONE: rising(5)},
        {EVENT_UNCERTAIN: constant(0), UNCERTAIN: counter_step(-2), WEBHOOK_DONE: rising(5)},
    ),
    "OutboxEffectFailed": (
        {WEBHOOK_FAILED: counter_step(-10), WEBHOOK_DONE: rising(5)},
        {WEBHOOK_FAILED: constant(0), FAILED: counter_step(-10), WEBHOOK_DONE: rising(5)},
    ),
    "OutboxExpiredLeases": (
        {'outbox_expired_leases{kind="EMAIL"}': constant(1), 'outbox_expired_leases{kind="TEST"}': constant(0)},
        {'outbox_expired_leases{kind="EMAIL"}': constant(0), 'outbox_expired_leases{kind="TEST"}': constant(0)},
    ),
    # paused for half an hour, once open for a moment between two pauses; the quiet one paused for 8 minutes
    "OutboxDestinationPaused": (
        {
            SMTP_PAUSED: lambda m: 1.0 if m >= -30 and m != -10 else 0.0,
            HOOK_PAUSED: constant(0),
        },
        {SMTP_PAUSED: lambda m: 1.0 if -40 <= m <= -32 else 0.0, HOOK_PAUSED: constant(0)},
    ),
    # broken for 20 minutes; the quiet one was broken for 5 minutes, then mended
    "OutboxDestinationBroken": (
        {HOOK_BROKEN: lambda m: max(0.0, (m + 20) * 60.0), SMTP_BROKEN: constant(0)},
        {HOOK_BROKEN: lambda m: (m + 30) * 60.0 if -30 <= m <= -25 else 0.0, SMTP_BROKEN: constant(0)},
    ),
    # refused from 5 minutes ago on; the quiet one was refused for 10 minutes, then mended
    "OutboxDestinationCredentialsRefused": (
        {SLACK_REFUSED: lambda m: 1.0 if m >= -5 else 0.0, SMTP_REFUSED: constant(0)},
        {SLACK_REFUSED: lambda m: 1.0 if -40 <= m <= -30 else 0.0, SMTP_REFUSED: constant(0)},
    ),
    "OutboxDestinationBacklog": (
        {SMTP_DUE_AGE: rising(60), NATS_DUE_AGE: constant(0)},
        {SMTP_DUE_AGE: constant(60), NATS_DUE_AGE: constant(0)},
    ),
}
# what a rule says when its query returns nothing: an executor or exporter that vanished pages
NO_DATA = {
    "OutboxEmailUncertain": "Normal",
    "OutboxBacklogStale": "Normal",
    "OutboxExecutorsDown": "Alerting",
    "OutboxPurgeFailing": "Normal",
    "OutboxExporterDown": "Alerting",
    "OutboxEmailFailed": "Normal",
    "OutboxEffectUncertain": "Normal",
    "OutboxEffectFailed": "Normal",
    "OutboxExpiredLeases": "Normal",
    "OutboxDestinationPaused": "Normal",
    "OutboxDestinationBroken": "Normal",
    "OutboxDestinationCredentialsRefused": "Normal",
    "OutboxDestinationBacklog": "Normal",
}
EMPTY_AT = BASE  # no sample exists before the first window
STOPPED_CELL, RUNNING_CELL = "us", "eu"


def window_end(alert: str, firing: bool) -> int:
    index = list(SCENARIOS).index(alert)
    return BASE + (2 * index + (1 if firing else 2)) * WINDOW


def cells_window_end(alert: str) -> int:
    """The end of the alert's window of two cells, after every scenario's two windows without cells."""
    return BASE + (2 * len(SCENARIOS) + list(SCENARIOS).index(alert) + 1) * WINDOW


def in_cell(series: str, cell: str) -> str:
    name, brace, matchers = series.partition("{")
    return f'{name}{{cell="{cell}",{matchers}' if brace else f'{name}{{cell="{cell}"}}'


def two_cells(alert: str) -> Scenario:
    """The firing scenario's series in the stopped cell, beside the quiet scenario's in the running one."""
    firing, quiet = SCENARIOS[alert]
    return {
        **{in_cell(series, STOPPED_CELL): value for series, value in firing.items()},
        **{in_cell(series, RUNNING_CELL): value for series, value in quiet.items()},
    }


def openmetrics() -> str:
    """Every scenario's samples, in OpenMetrics text: one series' samples together and in time order."""
    samples: dict[str, list[tuple[int, float]]] = {}
    for alert, (firing, quiet) in SCENARIOS.items():
        windows = ((firing, window_end(alert, True)), (quiet, window_end(alert, False)))
        for scenario, end in (*windows, (two_cells(alert), cells_window_end(alert))):
            for series, value in scenario.items():
                offset = end if series.startswith("outbox_purge_last_success") else 0
                samples.setdefault(series, []).extend((end + m * 60, offset + value(m)) for m in MINUTES)
    lines = []
    for series in sorted(samples, key=lambda s: s.split("{")[0]):
        lines += [f"{series} {value:g} {at}" for at, value in sorted(samples[series])]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(openmetrics(), tmp_path_factory.mktemp("alerts")) as url:
        yield url


@contextlib.contextmanager
def serving(samples_text: str, home: Path) -> Iterator[str]:
    """A real Prometheus serving a TSDB made from `samples_text` (OpenMetrics) in `home`; its URL."""
    promtool, binary = shutil.which("promtool"), shutil.which("prometheus")
    assert promtool and binary, "promtool or prometheus is missing: .ci/run installs Debian's prometheus"
    (home / "scenarios.om").write_text(samples_text)
    made = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(home / "scenarios.om"), str(home / "data")],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    (home / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            "--storage.tsdb.retention.time=100y",
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


def rules() -> dict[str, dict[str, Any]]:
    loaded = yaml.safe_load(build.GRAFANA_RULES_FILE.read_text())
    return {r["title"]: r for g in loaded["groups"] for r in g["rules"]}


def run(rule: dict[str, Any], prometheus: str, end: int) -> str:
    """The rule's state at `end`, evaluated each minute from its `for` period and ten minutes more before."""
    return grafana_rules.verdict(run_states(rule, prometheus, end))


def test_every_alert_has_a_firing_a_quiet_and_a_no_data_scenario() -> None:
    assert set(rules()) == set(SCENARIOS) == set(NO_DATA)


@pytest.mark.parametrize("alert", list(SCENARIOS))
def test_the_grafana_rule_fires_stays_quiet_and_handles_no_data(prometheus: str, alert: str) -> None:
    rule = rules()[alert]
    assert run(rule, prometheus, window_end(alert, firing=True)) == "Alerting"
    assert run(rule, prometheus, window_end(alert, firing=False)) == "Normal"
    assert run(rule, prometheus, EMPTY_AT) == NO_DATA[alert]


def test_with_two_cells_every_rule_fires_for_the_stopped_cell_only_naming_it(prometheus: str, tmp_path: Path) -> None:
    """Each alert's Grafana rule, then its Prometheus rule in promtool on the same series: the stopped cell's
    instances alert, the running cell's do not, and the summary names the stopped cell."""
    prometheus_rules = {
        r["alert"]: r for g in yaml.safe_load(build.PROMETHEUS_RULES_FILE.read_text())["groups"] for r in g["rules"]
    }
    cases = []
    for alert in SCENARIOS:
        states = run_states(rules()[alert], prometheus, cells_window_end(alert))
        alerting = [dict(labels) for labels, state in states.items() if state == "Alerting"]
        assert alerting, f"{alert} does not fire for the stopped cell: {states}"
        assert {labels.get("cell") for labels in alerting} == {STOPPED_CELL}, f"{alert}: {states}"
        rule = prometheus_rules[alert]
        expected = []
        for labels in alerting:
            annotations = {name: render(text, labels) for name, text in rule["annotations"].items()}
            assert annotations["summary"].startswith(f"Cell {STOPPED_CELL}: "), annotations
            expected.append({"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations})
        end = len(MINUTES) - 1  # the window's last minute
        cases.append(
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": series,
                        "values": " ".join(
                            f"{value(m) + (end * 60 if series.startswith('outbox_purge_last_success') else 0):g}"
                            for m in MINUTES
                        ),
                    }
                    for series, value in two_cells(alert).items()
                ],
                "alert_rule_test": [{"eval_time": f"{end}m", "alertname": alert, "exp_alerts": expected}],
            }
        )
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs Debian's prometheus"
    tests = {"rule_files": [str(build.PROMETHEUS_RULES_FILE)], "evaluation_interval": "1m", "tests": cases}
    (tmp_path / "cells.test.yml").write_text(yaml.safe_dump(tests))
    checked = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "cells.test.yml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def run_states(rule: dict[str, Any], prometheus: str, end: int) -> dict[grafana_rules.Labels, str]:
    """Each instance's state at `end`, evaluated each minute from the rule's `for` period and ten minutes more."""
    start = end - grafana_rules.duration_seconds(rule["for"]) - 600
    return grafana_rules.evaluate(rule, prometheus, range(start, end + 1, 60))


def render(template: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it, for the two forms the rules use: `{{ $labels.x }}` and
    `{{ if $labels.x }}...{{ end }}`."""
    shown = re.sub(
        r"\{\{ if \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}", lambda m: m[2] if labels.get(m[1]) else "", template
    )
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), shown)


def test_a_condition_that_has_not_held_for_the_whole_period_is_pending(prometheus: str) -> None:
    """An expired lease two minutes old is no alert yet: Grafana's `for` holds it Pending."""
    rule = rules()["OutboxExpiredLeases"]
    end = window_end("OutboxExpiredLeases", firing=True)
    states = grafana_rules.evaluate(rule, prometheus, range(end - 120, end + 1, 60))
    assert grafana_rules.verdict(states) == "Pending"


def test_the_expressions_follow_grafanas_semantics() -> None:
    nan = float("nan")
    assert grafana_rules.reduce([1.0, nan, 3.0], "max") != grafana_rules.reduce([1.0, nan, 3.0], "max")  # NaN
    assert grafana_rules.reduce([1.0, nan, None, 3.0], "mean", "dropNN") == 2.0
    assert grafana_rules.reduce([1.0, nan, 3.0], "sum", "replaceNN", 10.0) == 14.0
    assert grafana_rules.reduce([nan], "count", "dropNN") == 0.0
    assert grafana_rules.reduce([4.0, 2.0], "last") == 2.0
    assert grafana_rules.threshold(0.0, "lt", [1.0]) and not grafana_rules.threshold(0.0, "gt", [0.0])
    assert grafana_rules.threshold(5.0, "within_range", [1.0, 10.0])
    assert grafana_rules.threshold(11.0, "outside_range", [1.0, 10.0])
    assert not grafana_rules.threshold(nan, "outside_range", [1.0, 10.0])
    values: grafana_rules.Values = {(("kind", "EMAIL"),): 3.0, (("kind", "TEST"),): 0.0}
    assert grafana_rules.math_expression("$A > 0", {"A": values}) == {
        (("kind", "EMAIL"),): 1.0,
        (("kind", "TEST"),): 0.0,
    }
    assert grafana_rules.math_expression("1 <= ${A}", {"A": values})[(("kind", "EMAIL"),)] == 1.0


def test_a_comparison_inside_the_query_never_fires_under_a_gt_0_threshold(prometheus: str) -> None:
    """`sum(outbox_executors) == 0` answers the value 0 when no executor runs, and 0 is not above 0: the
    evaluator sees what Grafana would, a rule that can never fire."""
    rule = copy.deepcopy(rules()["OutboxExecutorsDown"])
    rule["data"][0]["model"]["expr"] = "sum(outbox_executors) == 0"
    rule["data"][1]["model"]["conditions"][0]["evaluator"] = {"type": "gt", "params": [0.0]}
    assert run(rule, prometheus, window_end("OutboxExecutorsDown", firing=True)) == "Normal"


# ---- the backlog alert on what the collector reads from a real database --------------------------------

BACKOFF_KIND, STUCK_KIND, PAUSED_KIND = kinds.NOOP.name, kinds.READBACK.name, kinds.ONCE.name
BACKLOG_SERIES = ("outbox_oldest_due_age_seconds", "outbox_due_actions", "outbox_lane_waiting_actions")
RECORDED_MINUTES = 30
MOVE_CLOCK_A_MINUTE = text(
    "UPDATE agent_action SET due_at = due_at - interval '1 minute' WHERE state IN ('PROPOSED', 'ADMITTED')"
)


async def recorded_backlog(engine: Engine, aengine: AsyncEngine) -> dict[str, list[float]]:
    """The collector's backlog series, one scrape per minute for RECORDED_MINUTES minutes and the last one.

    TEST_NOOP: one lane, its head retried with a four-hour backoff (an executor ran it), four due actions
    behind it. TEST_READBACK: one lane whose head is due, and no executor claims it (its executor is stuck).
    TEST_ONCE: one lane whose head is due, its destination paused by an operator (OutboxDestinationPaused's).
    """
    for _ in range(5):
        enqueue(engine, lane="backoff")

    async def backoff(attempt: ActionAttempt) -> Result:
        return Retry("rate limited", after=4 * 3600)

    await Executor(aengine, [ScriptedAdapter(kinds.NOOP, backoff)], listen=False).run(until_idle=True)
    enqueue(engine, lane="stuck", kind=kinds.READBACK, workspace_id=None)
    enqueue(engine, lane="paused", kind=kinds.ONCE)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, paused_until, paused_by)"
                " VALUES (:name, :kind, 'infinity', 'operator')"
            ),
            {"name": kinds.ONCE.destination, "kind": PAUSED_KIND},
        )
    recorded: dict[str, list[float]] = {}
    for minute in range(RECORDED_MINUTES + 1):
        if minute:
            with engine.begin() as conn:
                conn.execute(MOVE_CLOCK_A_MINUTE)
        found = test_metrics.samples(test_metrics.scrape(engine))
        for name in BACKLOG_SERIES:
            for kind in (BACKOFF_KIND, STUCK_KIND, PAUSED_KIND):
                recorded.setdefault(f'{name}{{kind="{kind}"}}', []).append(test_metrics.value(found, name, kind=kind))
    return recorded


def recorded_openmetrics(recorded: dict[str, list[float]], end: int) -> str:
    lines = [
        f"{series} {v:g} {end + (minute - RECORDED_MINUTES) * 60}"
        for series in sorted(recorded, key=lambda s: s.split("{")[0])
        for minute, v in enumerate(recorded[series])
    ]
    return "\n".join([*lines, "# EOF"]) + "\n"


def promtool_case(recorded: dict[str, list[float]]) -> dict[str, Any]:
    """A `promtool test rules` case on the recorded series: at the last minute only the stuck kind alerts."""
    rule = next(
        r
        for g in yaml.safe_load(build.PROMETHEUS_RULES_FILE.read_text())["groups"]
        for r in g["rules"]
        if r["alert"] == "OutboxBacklogStale"
    )
    annotations = {k: render(v, {"kind": STUCK_KIND}) for k, v in rule["annotations"].items()}
    return {
        "rule_files": [str(build.PROMETHEUS_RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series, "values": " ".join(f"{v:g}" for v in values)}
                    for series, values in recorded.items()
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{RECORDED_MINUTES}m",
                        "alertname": "OutboxBacklogStale",
                        "exp_alerts": [
                            {"exp_labels": {**rule["labels"], "kind": STUCK_KIND}, "exp_annotations": annotations}
                        ],
                    }
                ],
            }
        ],
    }


async def test_a_lane_behind_a_backoff_or_a_paused_destination_is_quiet_beside_a_kind_nothing_claims(
    engine: Engine, aengine: AsyncEngine, tmp_path: Path
) -> None:
    recorded = await recorded_backlog(engine, aengine)
    # what the database held throughout: the backoff lane's four due actions wait behind its head
    assert set(recorded[f'outbox_lane_waiting_actions{{kind="{BACKOFF_KIND}"}}']) == {4}
    assert set(recorded[f'outbox_due_actions{{kind="{BACKOFF_KIND}"}}']) == {0}
    assert set(recorded[f'outbox_due_actions{{kind="{STUCK_KIND}"}}']) == {1}
    # the paused destination's head waits for its destination, not for an executor
    assert set(recorded[f'outbox_due_actions{{kind="{PAUSED_KIND}"}}']) == {0}
    assert set(recorded[f'outbox_lane_waiting_actions{{kind="{PAUSED_KIND}"}}']) == {0}
    assert_only_the_stuck_kind_alerts(recorded, tmp_path)


def assert_only_the_stuck_kind_alerts(recorded: dict[str, list[float]], tmp_path: Path) -> None:
    """The Grafana rule on a real Prometheus serving the recorded series, and the Prometheus rule in promtool."""
    end = BASE + WINDOW
    with serving(recorded_openmetrics(recorded, end), tmp_path) as url:
        states = grafana_rules.evaluate(rules()["OutboxBacklogStale"], url, range(end - 20 * 60, end + 1, 60))
    assert states == {
        (("kind", BACKOFF_KIND),): "Normal",
        (("kind", STUCK_KIND),): "Alerting",
        (("kind", PAUSED_KIND),): "Normal",
    }

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs Debian's prometheus"
    (tmp_path / "backlog.test.yml").write_text(yaml.safe_dump(promtool_case(recorded)))
    checked = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "backlog.test.yml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
