"""Faults of outbox's own database before the fence, on a real PostgreSQL: they spend no attempt.

    adapter's database access fails (its backend terminated, a closed port, no pooled connection in time)
        ─▶ OutboxFault: ADMITTED again after 1 s doubling to 60 s, `attempt` unchanged, tallied OUTBOX_FAULT
    a bug before the fence (a missing table) ─▶ Retry: counts, and ends FAILED / ATTEMPTS_EXHAUSTED
    the fault ends ─▶ the next claim carries the action out, once

The fence is covered both ways: its connection dropped in its transaction (the committer tries again and
the provider is asked once), and an own fault reaching the adapter after the fence's COMMIT took effect
(the mark goes back, nothing was sent, a later claim sends it once).
"""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.sink import SmtpSink
from examples.accounts import notices, schema
from outbox._internal.connections.engines import async_engine, fault_text
from outbox._internal.connections.faults import ended_by_the_server, own_database_fault
from outbox.email import EmailAdapter, SmtpSettings, enqueue_email, message_id
from outbox.executor import ActionAttempt, Done, Result
from outbox.executor.backoff import OWN_FAULT_CAP_SECONDS, own_fault_delay
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter, fence_and_confirm
from tests.test_executor_results import enqueue, row

NOOP = kinds.NOOP.name
FAULT_LOG = "outbox's database failed before the fence"


def tallies(engine: Engine) -> dict[tuple[str, str, bool], int]:
    """action_attempts_total as the database holds it."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT kind, result, recorded, sum(n)::bigint FROM agent_action_attempt_tally GROUP BY 1, 2, 3")
        )
        return {(kind, result, recorded): n for kind, result, recorded, n in rows}


def fault_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if FAULT_LOG in r.getMessage()]


class OwnDatabase:
    """The adapter's own database access: a query on its own engine, which fails while `down`, for real:
    the session terminates its own backend, as a restart or a failover of the server would."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.down = True

    async def read(self) -> None:
        async with self.engine.connect() as conn:
            if self.down:
                await conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
            await conn.execute(text("SELECT 1"))


@pytest.fixture
async def own(database_url: str) -> AsyncIterator[OwnDatabase]:
    database = OwnDatabase(async_engine(database_url))
    yield database
    await database.engine.dispose()


async def test_a_lost_connection_before_the_fence_spends_no_attempt(
    engine: Engine, aengine: AsyncEngine, own: OwnDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    action_id = enqueue(engine, max_attempts=2)

    async def behaviour(attempt: ActionAttempt) -> Result:
        await own.read()
        return await fence_and_confirm(attempt)

    adapter = ScriptedAdapter(kinds.NOOP, behaviour)
    with caplog.at_level(logging.WARNING, logger="outbox.executor"):
        outcomes = await drain(aengine, [adapter], max_rounds=4)  # one claim a round at least

    faults = len(adapter.calls)
    assert faults > 2  # more than max_attempts
    waiting = row(engine, action_id)
    assert (waiting["state"], waiting["stop_reason"], waiting["attempt"], waiting["epoch"]) == (
        "ADMITTED",
        None,
        0,
        faults,
    )
    assert outcomes.attempts == {(NOOP, "OUTBOX_FAULT", True): faults}
    assert tallies(engine) == {(NOOP, "OUTBOX_FAULT", True): faults}
    # the last fault followed faults - 1 claims that did not count: a wait of [d/2, d], d = 2**(faults - 1)
    ceiling = min(OWN_FAULT_CAP_SECONDS, 2.0 ** (faults - 1))
    assert ceiling / 2 - 1 <= waiting["due_in"] <= ceiling
    lines = fault_lines(caplog)
    assert len(lines) == faults
    assert all(r.levelno == logging.WARNING and "AdminShutdown" in r.getMessage() for r in lines)

    own.down = False
    outcomes = await drain(aengine, [adapter])
    done = row(engine, action_id)
    assert (done["state"], done["stop_reason"], done["attempt"], done["epoch"]) == ("DONE", "CONFIRMED", 1, faults + 1)
    assert outcomes.attempts == {(NOOP, "DONE", True): 1}
    assert tallies(engine) == {(NOOP, "OUTBOX_FAULT", True): faults, (NOOP, "DONE", True): 1}


async def test_no_pooled_connection_in_time_spends_no_attempt(
    engine: Engine, aengine: AsyncEngine, database_url: str
) -> None:
    action_id = enqueue(engine, max_attempts=1)
    pool = async_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=0.05)

    async def behaviour(attempt: ActionAttempt) -> Result:
        async with pool.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return await fence_and_confirm(attempt)

    adapter = ScriptedAdapter(kinds.NOOP, behaviour)
    try:
        async with pool.connect() as held:  # the pool's only connection, busy elsewhere
            await held.execute(text("SELECT 1"))
            outcomes = await drain(aengine, [adapter], max_rounds=3)
        assert outcomes.attempts == {(NOOP, "OUTBOX_FAULT", True): len(adapter.calls)}
        assert len(adapter.calls) > 1
        assert (row(engine, action_id)["state"], row(engine, action_id)["attempt"]) == ("ADMITTED", 0)

        await drain(aengine, [adapter])  # the connection is free again
        assert (row(engine, action_id)["state"], row(engine, action_id)["attempt"]) == ("DONE", 1)
    finally:
        await pool.dispose()


async def test_a_bug_before_the_fence_still_spends_attempts(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine, max_attempts=3)

    async def behaviour(attempt: ActionAttempt) -> Result:
        async with aengine.connect() as conn:
            await conn.execute(text("SELECT * FROM no_such_table"))
        return await fence_and_confirm(attempt)

    adapter = ScriptedAdapter(kinds.NOOP, behaviour)
    outcomes = await drain(aengine, [adapter])
    failed = row(engine, action_id)
    assert (failed["state"], failed["stop_reason"], failed["attempt"]) == ("FAILED", "ATTEMPTS_EXHAUSTED", 3)
    assert len(adapter.calls) == 3
    assert outcomes.attempts == {(NOOP, "RETRY", True): 3}
    assert tallies(engine) == {(NOOP, "RETRY", True): 3}


async def test_a_fence_dropped_before_its_commit_is_tried_again_and_sends_once(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """The fence's connection is lost once, in the fence's own UPDATE: the committer tries again, the fence
    holds, and the at-most-once provider is asked exactly once."""
    with engine.begin() as conn:
        # a sequence is not rolled back: the trigger drops the session of the first fence only
        conn.execute(
            text("""
            CREATE SEQUENCE fence_drops;
            CREATE FUNCTION drop_first_fence() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.write_started_at IS NOT NULL AND OLD.write_started_at IS NULL
                   AND nextval('fence_drops') = 1 THEN
                    PERFORM pg_terminate_backend(pg_backend_pid());
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER drop_first_fence BEFORE UPDATE ON agent_action
                FOR EACH ROW EXECUTE FUNCTION drop_first_fence();
            """)
        )
    action_id = enqueue(engine, kind=kinds.ONCE)
    sent: list[int] = []

    async def behaviour(attempt: ActionAttempt) -> Result:
        (await attempt.fence().begin_write()).check()
        sent.append(attempt.action.id)  # the provider call
        return Done("sent")

    outcomes = await drain(aengine, [ScriptedAdapter(kinds.ONCE, behaviour)])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT last_value FROM fence_drops")).scalar_one() >= 2  # dropped, then held
    done = row(engine, action_id)
    assert (done["state"], done["attempt"], sent) == ("DONE", 1, [action_id])
    assert outcomes.attempts == {(kinds.ONCE.name, "DONE", True): 1}


async def test_a_fence_whose_answer_was_lost_goes_back_unmarked_and_sends_once(
    engine: Engine, aengine: AsyncEngine, own: OwnDatabase
) -> None:
    """The fence's COMMIT took effect, then an own fault reached the adapter instead of a window:
    write_started_at is set under the claim's epoch, the provider was not asked. The at-most-once action
    goes back with the mark the claim found (none), uncounted, and a later claim sends it once."""
    action_id = enqueue(engine, kind=kinds.ONCE)
    sent: list[int] = []
    marked: list[bool] = []

    async def answer_lost(attempt: ActionAttempt) -> Result:
        # what the database holds after such a fence: its UPDATE committed under this epoch...
        assert await attempt.committer.begin_write(attempt.action) is None
        marked.append(row(engine, action_id)["write_started_at"] is not None)
        # ...and what the adapter sees: no window, an own fault (a real lost connection)
        assert not attempt.fenced
        await own.read()
        raise AssertionError("the connection should have been lost")

    outcomes = await drain(aengine, [ScriptedAdapter(kinds.ONCE, answer_lost)], max_rounds=1)
    back = row(engine, action_id)
    assert marked == [True]
    assert (back["state"], back["attempt"], back["epoch"], back["write_started_at"]) == ("ADMITTED", 0, 1, None)
    assert outcomes.attempts == {(kinds.ONCE.name, "OUTBOX_FAULT", True): 1}

    async def send(attempt: ActionAttempt) -> Result:
        (await attempt.fence().begin_write()).check()
        sent.append(attempt.action.id)
        return Done("sent")

    await drain(aengine, [ScriptedAdapter(kinds.ONCE, send)])
    done = row(engine, action_id)
    assert (done["state"], done["attempt"], done["epoch"], sent) == ("DONE", 1, 2, [action_id])


# ---- the email adapter, end to end --------------------------------------------------------------------


@pytest.fixture
def app(engine: Engine) -> Engine:
    """The example application: workspace 10 with two admins and an alert."""
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(
            text("""
            INSERT INTO app_account VALUES (1, 'Alice', 'alice@example.com', true), (2, 'Bob', 'bob@example.com', true);
            INSERT INTO app_workspace VALUES (10, 'Research');
            INSERT INTO app_membership VALUES (10, 1, 'admin'), (10, 2, 'admin');
            INSERT INTO app_alert VALUES (100, 10, 'Disk full', 'The disk is full.');
            """)
        )
    return engine


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 bound and not listening, for the test's whole length: every connect is refused."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield int(bound.getsockname()[1])


async def test_an_email_whose_database_is_unreachable_waits_and_is_sent_once(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    smtp = SmtpSettings(host="127.0.0.1", port=sink.port, sender="outbox@example.com", timeout_seconds=2)
    with app.begin() as conn:
        action_id = enqueue_email(conn, notices.WORKSPACE_ALERT, {"workspace_id": 10, "alert_id": 100}).id
    max_attempts = row(app, action_id)["max_attempts"]
    unreachable = async_engine(f"postgresql://outbox:hunter2@127.0.0.1:{closed_port}/app")
    try:
        with caplog.at_level(logging.WARNING, logger="outbox.executor"):
            outcomes = await drain(aengine, [EmailAdapter(unreachable, smtp)], max_rounds=max_attempts + 2)
    finally:
        await unreachable.dispose()

    faults = outcomes.attempts[("EMAIL", "OUTBOX_FAULT", True)]
    assert faults > max_attempts
    assert outcomes.attempts == {("EMAIL", "OUTBOX_FAULT", True): faults}
    waiting = row(app, action_id)
    assert (waiting["state"], waiting["attempt"], waiting["write_started_at"]) == ("ADMITTED", 0, None)
    assert sink.received == []
    lines = fault_lines(caplog)
    assert len(lines) == faults and all("OperationalError" in r.getMessage() for r in lines)
    assert "hunter2" not in caplog.text

    outcomes = await drain(aengine, [EmailAdapter(aengine, smtp)])
    done = row(app, action_id)
    assert (done["state"], done["stop_reason"], done["attempt"]) == ("DONE", "CONFIRMED", 1)
    assert sink.count_by_message_id() == {message_id("workspace_alert:100", "example.com"): 1}
    assert tallies(app) == {("EMAIL", "OUTBOX_FAULT", True): faults, ("EMAIL", "DONE", True): 1}


# ---- which errors are own faults ----------------------------------------------------------------------


def _wrapped(wrapper: type[DBAPIError], orig: Exception, *, invalidated: bool = False) -> DBAPIError:
    statement = "SELECT email FROM app_account WHERE id = %(id)s"
    return wrapper(statement, {"id": 1}, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    ("error", "own"),
    [
        (_wrapped(OperationalError, psycopg.errors.AdminShutdown("terminating connection")), True),
        (_wrapped(InterfaceError, psycopg.InterfaceError("the connection is closed")), True),
        (PoolTimeout("QueuePool limit of size 1 overflow 0 reached"), True),
        (DisconnectionError("the connection was lost on checkout"), True),
        (psycopg.OperationalError("connection refused"), True),
        (psycopg.InterfaceError("the connection is lost"), True),
        (_wrapped(ProgrammingError, psycopg.errors.UndefinedTable("no_such_table"), invalidated=True), True),
        (_wrapped(ProgrammingError, psycopg.errors.UndefinedTable("no_such_table")), False),
        (_wrapped(IntegrityError, psycopg.errors.UniqueViolation("duplicate key")), False),
        (_wrapped(DataError, psycopg.errors.InvalidTextRepresentation("bad input")), False),
        (psycopg.errors.UndefinedTable("no_such_table"), False),
        (ValueError("a bug"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_which_errors_are_own_faults(error: Exception, own: bool) -> None:
    assert own_database_fault(error) is own


@pytest.mark.parametrize(
    ("error", "ended"),
    [
        (_wrapped(OperationalError, psycopg.errors.AdminShutdown("terminating connection")), True),
        (_wrapped(OperationalError, psycopg.errors.CrashShutdown("crash shutdown")), True),
        (_wrapped(OperationalError, psycopg.errors.CannotConnectNow("the database system is starting up")), True),
        (_wrapped(InterfaceError, psycopg.InterfaceError("the connection is lost"), invalidated=True), True),
        (OperationalError(None, None, psycopg.OperationalError("lost"), connection_invalidated=True), False),
        (_wrapped(OperationalError, psycopg.OperationalError("connection refused")), False),
        (_wrapped(ProgrammingError, psycopg.errors.UndefinedTable("no_such_table")), False),
    ],
    ids=lambda value: type(getattr(value, "orig", value)).__name__ if isinstance(value, Exception) else str(value),
)
def test_which_errors_are_a_server_ending_the_session(error: DBAPIError, ended: bool) -> None:
    """A command starting against its database asks again only for these; a refused connection raises at once."""
    assert ended_by_the_server(error) is ended


def test_a_fault_line_names_the_driver_error_without_the_statement_or_a_password() -> None:
    error = _wrapped(
        OperationalError, psycopg.OperationalError("connection to postgresql://outbox:hunter2@db/app failed\nmore")
    )
    line = fault_text(error)
    assert line == "OperationalError: connection to postgresql://outbox:***@db/app failed"
    assert "hunter2" not in line and "SELECT" not in line


@pytest.mark.parametrize(
    "message",
    [
        "connection to postgresql://outbox:hun@ter2@db/app failed",  # an @ left as it is
        "connection to postgresql://outbox@db/app?sslmode=require&password=hunter2 failed",
        "invalid connection option in host=db password=hunter2 user=outbox",
    ],
)
def test_a_fault_line_hides_a_password_wherever_the_driver_put_it(message: str) -> None:
    line = fault_text(psycopg.OperationalError(message))
    assert "hunter2" not in line and "ter2" not in line and "***" in line, line


def test_the_own_fault_wait_doubles_from_one_second_to_a_minute() -> None:
    class Top(random.Random):  # the top of each range
        def uniform(self, a: float, b: float) -> float:
            return b

    assert [own_fault_delay(n, Top()) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert own_fault_delay(10_000, Top()) == 60
    assert 0.5 <= own_fault_delay(0) <= 1
