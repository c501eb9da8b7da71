"""outbox_reader, as a real login role: the exporter reads every metric through it, the dashboard's lane table
reads, and it can neither read personal data (payload, keys, subjects, provider replies) nor write anything."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

from dashboards.build import LANES_SQL
from outbox import migrate
from outbox.store import metrics as store_metrics
from tests.test_metrics import mixed_workload, samples, scrape, value

# what migrations 0004 and 0006 leave readable of agent_action; everything else of it is refused
READABLE = {
    "id",
    "kind",
    "lane_key",
    "state",
    "stop_reason",
    "attempt",
    "max_attempts",
    "epoch",
    "due_at",
    "due_since",
    "expires_at",
    "lease_expires_at",
    "write_started_at",
    "created_at",
    "ended_at",
    "last_error",
    "trace",
    "trace_context",
    "lane_head",
    "destination",
}
PERSONAL = {"payload", "idempotency_key", "subject_account_id", "workspace_id", "readback_ref"}
OUTBOX_TABLES = (
    "agent_action",
    "agent_action_attempt_tally",
    "agent_action_ended_tally",
    "agent_action_latency_tally",
    "agent_executor",
    "agent_maintenance",
    "agent_action_kind",
)
# the exporter's own series, which differ between two exporters by design
OWN_SERIES = ("outbox_exporter_scrape_duration_seconds", "outbox_exporter_snapshots_total")

_roles = itertools.count()


@contextmanager
def reader_login(admin_engine: Engine, database_url: str) -> Iterator[str]:
    """A LOGIN role granted outbox_reader and nothing else; yields the database's URL as that role."""
    role, password = f"outbox_reader_login_{os.getpid()}_{next(_roles)}", "reader-s3cret"
    with admin_engine.connect() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE outbox_reader"))
    try:
        yield make_url(database_url).set(username=role, password=password).render_as_string(hide_password=False)
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"), {"r": role})
            conn.execute(text(f"DROP ROLE {role}"))


@pytest.fixture
def reader(admin_engine: Engine, database_url: str) -> Iterator[Engine]:
    with reader_login(admin_engine, database_url) as url:
        engine = create_engine(url)
        yield engine
        engine.dispose()


async def test_the_exporter_reads_every_metric_as_the_reader(
    engine: Engine, aengine: AsyncEngine, reader: Engine
) -> None:
    await mixed_workload(engine, aengine)
    as_owner, as_reader = samples(scrape(engine)), samples(scrape(reader))
    assert value(as_reader, "outbox_exporter_up") == 1
    assert {k: v for k, v in as_reader.items() if k[0] not in OWN_SERIES} == {
        k: v for k, v in as_owner.items() if k[0] not in OWN_SERIES
    }
    with engine.connect() as conn:
        ended = conn.execute(text("SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL")).scalar_one()
    assert sum(v for (name, _), v in as_reader.items() if name == "action_ended_total") == ended == 4


def test_the_reader_reads_what_dashboards_read_and_no_personal_column(engine: Engine, reader: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                " subject_account_id, max_attempts, state)"
                " VALUES ('TEST_NOOP', 7, 'account:42', 'k-1', '{\"to\": \"a@example.com\"}', 42, 5, 'ADMITTED')"
            )
        )
        columns = set(
            conn.execute(
                text("SELECT column_name FROM information_schema.columns WHERE table_name = 'agent_action'")
            ).scalars()
        )
    assert columns == READABLE | PERSONAL, "a new column of agent_action: decide whether outbox_reader may read it"
    with reader.connect() as conn:
        readable = ", ".join(sorted(READABLE))
        assert conn.execute(text(f"SELECT {readable} FROM agent_action")).mappings().one()["lane_key"] == "account:42"
        assert conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one() == 1
        assert [r.lane for r in conn.execute(text(LANES_SQL))] == ["account:42"]
        for table in OUTBOX_TABLES[1:]:
            conn.execute(text(f"SELECT * FROM {table}")).all()
    for query in ["SELECT * FROM agent_action", *(f"SELECT {column} FROM agent_action" for column in PERSONAL)]:
        with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text(query))


def test_the_reader_writes_nothing(engine: Engine, reader: Engine) -> None:
    writes = [
        "INSERT INTO agent_action (kind, lane_key, idempotency_key, max_attempts, state)"
        " VALUES ('TEST_NOOP', 'l', 'k', 5, 'ADMITTED')",
        "UPDATE agent_action SET due_at = now()",
        "DELETE FROM agent_action",
        "INSERT INTO agent_action_ended_tally (kind, state, reason, n) VALUES ('EMAIL', 'DONE', 'CONFIRMED', 1)",
        "CREATE TABLE outbox_reader_was_here (id int)",
        *(f"DELETE FROM {table}" for table in OUTBOX_TABLES),
        *(f"TRUNCATE {table}" for table in OUTBOX_TABLES),
        *(merge.text for merge in store_metrics.MERGE_TALLIES),
    ]
    for statement in writes:
        with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text(statement))


def test_downgrade_gives_back_the_whole_table_and_upgrade_takes_it_again(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    payload = text("SELECT has_column_privilege('outbox_reader', 'agent_action', 'payload', 'SELECT')")
    whole = text("SELECT has_table_privilege('outbox_reader', 'agent_action', 'SELECT')")
    try:
        with engine.begin() as conn:
            migrate.upgrade(conn)
            assert (conn.execute(payload).scalar_one(), conn.execute(whole).scalar_one()) == (False, False)
            migrate.downgrade(conn, "0003")
            assert (conn.execute(payload).scalar_one(), conn.execute(whole).scalar_one()) == (True, True)
            migrate.upgrade(conn)
            assert (conn.execute(payload).scalar_one(), conn.execute(whole).scalar_one()) == (False, False)
    finally:
        engine.dispose()
