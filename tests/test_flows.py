"""The Prefect flows on Prefect's test harness (a real Prefect API on a temporary database), against a real
PostgreSQL and a real SMTP sink: the drain's summary, its artifact and its UNCERTAIN warning in the run's
logs; the purge's count."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler
from prefect.testing.utilities import prefect_test_harness
from sqlalchemy import Engine, text

from demo.sink import Faults, SmtpSink
from examples.accounts import notices, schema
from flows.drain import drain
from flows.purge import purge
from outbox._internal.checks.kind_rows import KindsNotDeclared
from outbox.email import enqueue_email

pytestmark = pytest.mark.usefixtures("outbox_logger_restored")


@pytest.fixture(scope="module", autouse=True)
def prefect_api() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield


def enqueue_alerts(engine: Engine, count: int) -> None:
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(text("INSERT INTO app_account VALUES (1, 'Alice', 'alice@example.com', true)"))
        conn.execute(text("INSERT INTO app_workspace VALUES (10, 'Research')"))
        conn.execute(text("INSERT INTO app_membership VALUES (10, 1, 'admin')"))
        conn.execute(
            text("INSERT INTO app_alert SELECT g, 10, 'alert', 'body' FROM generate_series(1, :n) g"), {"n": count}
        )
        for alert in range(1, count + 1):
            enqueue_email(conn, notices.WORKSPACE_ALERT, {"workspace_id": 10, "alert_id": alert})


async def run_logs(flow_run_id: Any) -> list[str]:
    await APILogHandler.aflush()
    async with get_client() as client:
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [log.message for log in logs]


async def test_a_drain_run_summarises_and_shows_uncertain_emails_in_its_logs(
    engine: Engine, sink: SmtpSink, outbox_env: None
) -> None:
    enqueue_alerts(engine, 3)
    sink.faults = Faults(after_data="drop")  # every send may or may not have gone out
    state = await drain(max_seconds=5, max_actions=3, adapters="examples.accounts:adapters", return_state=True)
    summary = await state.result()
    assert summary["attempts"] == 3 and summary["uncertain"] == 3 and summary["by_result"] == {"UNCERTAIN": 3}
    flow_run_id = state.state_details.flow_run_id
    for _ in range(100):
        messages = await run_logs(flow_run_id)
        if sum("ended UNCERTAIN" in m for m in messages) == 3:
            break
        await asyncio.sleep(0.1)  # the API ingests logs in batches: poll until they are there
    assert sum("ended UNCERTAIN" in m for m in messages) == 3
    assert not any("alice@example.com" in m for m in messages)
    assert any(m.startswith("drained 3 attempts") for m in messages)
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["outbox-drain-summary"]))
        )
    assert any(a.flow_run_id == flow_run_id for a in artifacts)


async def test_a_drain_run_ends_when_its_budget_is_spent(engine: Engine, sink: SmtpSink, outbox_env: None) -> None:
    enqueue_alerts(engine, 5)
    summary = await drain(max_seconds=30, max_actions=2, adapters="examples.accounts:adapters")
    assert summary["by_result"] == {"DONE": 2} and len(sink.received) == 2


def test_the_purge_flow_reports_what_it_removed(engine: Engine, outbox_env: None) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                " max_attempts, state) VALUES ('TEST_NOOP', 1, 'l', 'k', '{}', 1, 'ADMITTED')"
            )
        )
        conn.execute(text("UPDATE agent_action SET state = 'CANCELLED', stop_reason = 'OPERATOR_CANCELLED'"))
    assert purge(retention_days=0) == {"removed": 1, "retention_days": 0}


def test_a_purge_run_of_a_cell_without_a_cells_file_fails_in_one_line_naming_it(
    outbox_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No traceback, the cell and the setting named (the run is retried as any failed purge: not waited for here)."""
    monkeypatch.delenv("OUTBOX_CELLS_FILE", raising=False)
    state = purge.with_options(retries=0)(retention_days=0, cell="eu", return_state=True)
    assert state.is_failed()
    assert state.message == "a run of cell eu needs the cells file: set OUTBOX_CELLS_FILE on the worker"


async def test_a_drain_run_refuses_to_start_when_its_kinds_row_differs(engine: Engine, outbox_env: None) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE agent_action_kind SET at_most_once = false WHERE name = 'EMAIL'"))
    with pytest.raises(KindsNotDeclared) as refused:
        await drain(max_seconds=5, adapters="examples.accounts:adapters")
    assert refused.value.lines == [
        "kind EMAIL: its row in agent_action_kind declares at_most_once=false (the code: true); declare it again"
        " in a new migration with outbox.migrate.declare_kinds(op, [EMAIL]), or change the code to match"
    ]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM agent_executor")).scalar_one() == 0  # never registered
