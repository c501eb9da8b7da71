"""The metrics: counters equal the database's outcomes, survive a killed worker and the purge, and every
series passes `promtool check metrics`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox._internal.connections.engines import conninfo
from outbox.executor import Abandoned, ActionAttempt, Done, Executor, Failed, Result, Retry, Uncertain
from outbox.executor.store import ExecutorStore
from outbox.kinds import ActionKind
from outbox.metrics.exporter import registry_for
from outbox.retention import purge_ended
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.support import until
from tests.test_executor_results import enqueue

ROOT = Path(__file__).resolve().parent.parent
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(engine: Engine) -> str:
    return generate_latest(registry_for(engine, cache_seconds=0)).decode()


def samples(exposition: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


async def mixed_workload(engine: Engine, aengine: AsyncEngine) -> None:
    """Six actions: DONE, FAILED, UNCERTAIN, a RETRY then DONE, an ABANDONED one and one left waiting."""
    script: dict[int, list[Result]] = {}
    for lane, results in enumerate(
        [[Done("ok")], [Failed("refused")], [Uncertain("timeout")], [Retry("busy"), Done("ok")], [Abandoned("x")]]
    ):
        script[enqueue(engine, lane=f"lane-{lane}")] = results

    async def scripted(attempt: ActionAttempt) -> Result:
        results = script[attempt.action.id]
        result = results.pop(0) if len(results) > 1 else results[0]
        if not isinstance(result, Abandoned):
            (await attempt.fence().begin_write()).check()
        return result

    await drain(aengine, [ScriptedAdapter(kinds.NOOP, scripted)])
    enqueue(engine, lane="waiting", proposed=True)


def ended_in_database(engine: Engine) -> dict[tuple[str, str, str], int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT kind, state, stop_reason, count(*) FROM agent_action"
                " WHERE ended_at IS NOT NULL GROUP BY 1, 2, 3"
            )
        )
        return {(k, s, r): n for k, s, r, n in rows}


async def test_counters_equal_the_outcomes_in_the_database(engine: Engine, aengine: AsyncEngine) -> None:
    await mixed_workload(engine, aengine)
    found = samples(scrape(engine))
    noop = kinds.NOOP.name
    for (kind, state, reason), count in ended_in_database(engine).items():
        assert value(found, "action_ended_total", kind=kind, state=state, reason=reason) == count
    assert value(found, "action_attempts_total", kind=noop, result="DONE", recorded="true") == 2
    assert value(found, "action_attempts_total", kind=noop, result="RETRY", recorded="true") == 1
    assert value(found, "action_attempts_total", kind=noop, result="ABANDONED", recorded="false") == 1
    assert value(found, "action_attempt_duration_seconds_count", kind=noop) == 6
    assert value(found, "action_pickup_delay_seconds_count", kind=noop) == 6
    assert value(found, "outbox_actions", kind=noop, state="PROPOSED") == 1
    assert value(found, "outbox_actions", kind=noop, state="EXECUTING") == 1  # the abandoned one
    assert value(found, "outbox_lanes_with_backlog") == 1
    assert value(found, "outbox_lane_depth_max") == 1
    assert value(found, "outbox_exporter_up") == 1


def test_alerted_label_sets_exist_before_anything_happens(engine: Engine) -> None:
    found = samples(scrape(engine))
    for reason in ("PROVIDER_UNCERTAIN", "ERROR_AFTER_WRITE", "LEASE_LOST_AFTER_WRITE"):
        assert value(found, "action_ended_total", kind="EMAIL", state="UNCERTAIN", reason=reason) == 0
    assert value(found, "action_attempts_total", kind="EMAIL", result="UNCERTAIN", recorded="true") == 0
    assert value(found, "outbox_oldest_due_age_seconds", kind="EMAIL") == 0
    assert value(found, "outbox_lane_waiting_actions", kind="EMAIL") == 0
    assert value(found, "outbox_executors") == 0
    assert value(found, "outbox_purge_last_success_timestamp_seconds") > 0  # the install counts as a purge


async def test_the_purge_never_makes_a_counter_go_backwards(engine: Engine, aengine: AsyncEngine) -> None:
    await mixed_workload(engine, aengine)
    before = samples(scrape(engine))
    with engine.begin() as conn:
        purge_at = conn.execute(text("SELECT extract(epoch FROM now())")).scalar_one()
    assert purge_ended(engine, older_than=timedelta(0)) == 4
    after = samples(scrape(engine))
    counters = [k for k in before if k[0].endswith("_total") or k[0].endswith("_count")]
    assert counters and all(after[k] == before[k] for k in counters)
    assert value(after, "outbox_purge_last_success_timestamp_seconds") >= float(purge_at)


async def lanes_in_every_state(engine: Engine, aengine: AsyncEngine) -> None:
    """TEST_NOOP lanes whose heads are each in another state, and the due actions waiting behind them:

    backoff   head in a one-hour backoff, 4 due actions behind it, enqueued an hour ago
    held      head EXECUTING under a live lease, 1 due action behind it
    proposed  head PROPOSED, 1 due action behind it
    ready     head due with nothing executing (claimable), 1 due action behind it
    lost      EXECUTING, its lease expired 90 s ago (taken back: claimable)
    last      EXECUTING at its last attempt, lease expired (the sweep ends it FAILED: no claim)
    expired   head past its expires_at (the sweep cancels it: no claim)
    and a TEST_ONCE action whose write started, lease expired (the sweep ends it UNCERTAIN: no claim).
    """
    backoff = [enqueue(engine, lane="backoff") for _ in range(5)]
    abandoned = {
        enqueue(engine, lane="held"),
        enqueue(engine, lane="lost"),
        enqueue(engine, lane="last", max_attempts=1),
        once := enqueue(engine, lane="once", kind=kinds.ONCE),
    }

    async def scripted(attempt: ActionAttempt) -> Result:
        if attempt.action.id not in abandoned:
            return Retry("busy", after=3600)
        if attempt.action.id == once:
            (await attempt.fence().begin_write()).check()
        return Abandoned("frozen")

    await Executor(
        aengine, [ScriptedAdapter(kinds.NOOP, scripted), ScriptedAdapter(kinds.ONCE, scripted)], listen=False
    ).run(until_idle=True)
    enqueue(engine, lane="held")
    enqueue(engine, lane="proposed", proposed=True)
    enqueue(engine, lane="proposed")
    enqueue(engine, lane="ready")
    enqueue(engine, lane="ready")
    expired = enqueue(engine, lane="expired")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE agent_action SET due_at = now() - interval '1 hour' WHERE id = ANY (:ids)"),
            {"ids": backoff[1:]},
        )
        conn.execute(
            text(
                "UPDATE agent_action SET lease_expires_at = now() - interval '90 seconds'"
                " WHERE lane_key IN ('lost', 'last', 'once')"
            )
        )
        conn.execute(
            text("UPDATE agent_action SET expires_at = now() - interval '1 second' WHERE id = :id"), {"id": expired}
        )


async def test_due_counts_what_an_executor_could_claim_now(engine: Engine, aengine: AsyncEngine) -> None:
    """Due is the ready lane heads and the leases to take back, exactly what a claim and a sweep take;
    the due actions behind a head (in a backoff, PROPOSED, EXECUTING) are outbox_lane_waiting_actions."""
    await lanes_in_every_state(engine, aengine)
    found = samples(scrape(engine))
    noop, once = kinds.NOOP.name, kinds.ONCE.name
    assert value(found, "outbox_due_actions", kind=noop) == 2  # the ready lane's head, the lost lease
    assert value(found, "outbox_lane_waiting_actions", kind=noop) == 4 + 1 + 1 + 1  # backoff, held, proposed, ready
    assert 90 <= value(found, "outbox_oldest_due_age_seconds", kind=noop) < 900  # the lost lease, not the backoff
    assert value(found, "outbox_due_actions", kind=once) == 0
    assert value(found, "outbox_oldest_due_age_seconds", kind=once) == 0

    store = ExecutorStore(conninfo(aengine))
    try:
        names = [k.name for k in kinds.ALL]
        claimed = await store.claim(100, 300, names)
        swept = await store.sweep("probe", 100, 300, names, [k.name for k in ActionKind.all() if k.at_most_once])
    finally:
        await store.close()
    assert len(claimed) + len(swept.claimed_again) == 2
    assert len(swept.ended) == 3  # the expired head, the last attempt, the write that started
    found = samples(scrape(engine))
    assert value(found, "outbox_due_actions", kind=noop) == 0
    assert value(found, "outbox_oldest_due_age_seconds", kind=noop) == 0
    assert (
        value(found, "outbox_lane_waiting_actions", kind=noop) == 7
    )  # the ready lane's second: behind an executing head


def test_no_label_holds_a_lane_key_an_id_or_free_text(engine: Engine) -> None:
    enqueue(engine, lane="customer-4711")
    exposition = scrape(engine)
    assert "customer-4711" not in exposition
    labels = {
        name for family in text_string_to_metric_families(exposition) for s in family.samples for name in s.labels
    }
    assert labels <= {"kind", "result", "recorded", "state", "reason", "le", "destination"}


def test_promtool_finds_nothing_to_fix(engine: Engine) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs Debian's prometheus"
    enqueue(engine)
    checked = subprocess.run([promtool, "check", "metrics"], input=scrape(engine).encode(), capture_output=True)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout.decode() + checked.stderr.decode()


def test_an_unreachable_database_reads_as_down() -> None:
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    found = samples(scrape(engine))
    assert value(found, "outbox_exporter_up") == 0
    assert not any(name.startswith("action_") for name, _ in found)


@pytest.fixture
def executor_process(database_url: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "OUTBOX_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.adapters:uncertain_adapters"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield process
    if process.poll() is None:
        process.kill()
        process.wait(10)


def state_of(engine: Engine, action_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT state FROM agent_action WHERE id = :id"), {"id": action_id}).scalar_one()


def test_a_worker_killed_right_after_an_uncertain_end_still_counts_it(
    engine: Engine, executor_process: subprocess.Popen[bytes]
) -> None:
    until(lambda: value(samples(scrape(engine)), "outbox_executors") == 1, what="the executor's heartbeat")
    action_id = enqueue(engine)
    until(lambda: state_of(engine, action_id) == "UNCERTAIN", what="the action to end UNCERTAIN")
    executor_process.send_signal(signal.SIGKILL)
    executor_process.wait(10)
    found = samples(scrape(engine))
    noop = kinds.NOOP.name
    assert value(found, "action_ended_total", kind=noop, state="UNCERTAIN", reason="PROVIDER_UNCERTAIN") == 1
    assert value(found, "action_attempts_total", kind=noop, result="UNCERTAIN", recorded="true") == 1
