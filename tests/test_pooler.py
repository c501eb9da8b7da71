"""outbox behind PgBouncer (Debian's 1.18, shipped defaults) in transaction and in session pooling.

    application (pooled SQLAlchemy engine) ──enqueue──▶ PgBouncer ──▶ PostgreSQL
    2 × `outbox run` (OUTBOX_DATABASE_URL = the pooler) ─┘        the SMTP sink ◀── each email once
    every operator command and the exporter ─────────────┘

In transaction pooling the pooler keeps two server connections per database, so the executors' many
client connections share them and a transaction lands on whichever is free: a statement prepared on one
is missing on (or, by name, already on) the next. Only the URL changes: outbox finds the pooler itself
(no server-side prepared statement, no LISTEN, no startup option), and the application sets
`prepare_threshold=None` on its own pooled connections in transaction pooling, as every psycopg
application behind such a pooler does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from demo.sink import SmtpSink
from examples.accounts import notices, schema
from outbox._internal.connections.engines import answered_connection, async_engine, psycopg_url
from outbox._internal.connections.opening import bind_pooled
from outbox.email import enqueue_email
from outbox.testing import install_kinds
from tests import kinds
from tests.conftest import CliResult
from tests.pgbouncer import PgBouncer
from tests.support import insert_ended, until
from tests.test_executor_results import enqueue

ROOT = Path(__file__).resolve().parent.parent
WORKSPACES = 20
ACTIONS = 400


@pytest.fixture(scope="module", params=["transaction", "session"])
def pooler(request: pytest.FixtureRequest, server_url: str) -> Iterator[PgBouncer]:
    # transaction pooling: two server connections for all the clients; session pooling holds one for each
    # client connection (an executor keeps up to 11: docs/operations.md)
    bouncer = PgBouncer(server_url, request.param, pool_size=2 if request.param == "transaction" else 30)
    yield bouncer
    bouncer.stop()


def pooled(pooler: PgBouncer, database_url: str) -> str:
    return psycopg_url(pooler.url(make_url(database_url).database or ""))


@pytest.fixture
def app(pooler: PgBouncer, database_url: str) -> Iterator[Engine]:
    """The example application's engine through the pooler: its workspaces, two admins each."""
    engine = create_engine(pooled(pooler, database_url), connect_args={"prepare_threshold": None})
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(
            text("INSERT INTO app_workspace SELECT g, 'w' || g FROM generate_series(1, :n) g"), {"n": WORKSPACES}
        )
        conn.execute(
            text(
                "INSERT INTO app_account SELECT g, 'A' || g, 'admin' || g || '@example.com', true"
                " FROM generate_series(1, :n) g"
            ),
            {"n": 2 * WORKSPACES},
        )
        conn.execute(
            text("INSERT INTO app_membership SELECT (g + 1) / 2, g, 'admin' FROM generate_series(1, :n) g"),
            {"n": 2 * WORKSPACES},
        )
        conn.execute(
            text("INSERT INTO app_alert SELECT g, g % :w + 1, 'alert', 'body' FROM generate_series(1, :n) g"),
            {"w": WORKSPACES, "n": ACTIONS},
        )
    yield engine
    engine.dispose()


def executor(url: str, sink: SmtpSink, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": url,
        "OUTBOX_SMTP_HOST": "127.0.0.1",
        "OUTBOX_SMTP_PORT": str(sink.port),
        "OUTBOX_SMTP_SENDER": "outbox@example.com",
        "PYTHONPATH": str(ROOT),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "outbox.cli",
                "run",
                "--adapters",
                "examples.accounts:adapters",
                "--concurrency",
                "16",
            ],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )


def states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY 1")).all())  # type: ignore[arg-type]


def all_done(engine: Engine) -> bool:
    return states(engine) == {"DONE": ACTIONS}


def test_every_action_is_carried_out_once_through_the_pooler(
    pooler: PgBouncer, database_url: str, app: Engine, sink: SmtpSink, engine: Engine, tmp_path: Path
) -> None:
    url = pooled(pooler, database_url)
    logs = [tmp_path / f"executor-{n}.log" for n in range(2)]
    runs = [executor(url, sink, log) for log in logs]
    try:
        for n in range(1, ACTIONS + 1):  # one transaction each, while the executors run
            with app.begin() as conn:
                alert = {"workspace_id": n % WORKSPACES + 1, "alert_id": n}
                enqueue_email(conn, notices.WORKSPACE_ALERT, alert)
        # an executor that stops (a database error it cannot survive) ends the wait; its output says why
        until(lambda: all_done(engine) or any(run.poll() is not None for run in runs), 120, f"{ACTIONS} DONE")
    finally:
        for run in runs:
            run.send_signal(signal.SIGTERM)
        codes = [run.wait(60) for run in runs]
    output = "\n".join(log.read_text() for log in logs)
    assert codes == [0, 0], output
    assert all_done(engine)
    assert "prepared statement" not in output
    assert "polling every 1 s" in output  # behind a pooler the executors do not LISTEN
    by_id = sink.count_by_message_id()
    assert len(by_id) == ACTIONS and set(by_id.values()) == {1}
    with engine.connect() as conn:
        attempts = conn.execute(text("SELECT max(attempt) FROM agent_action")).scalar_one()
    assert attempts == 1


def test_the_executor_listens_on_the_listen_url(
    pooler: PgBouncer, database_url: str, app: Engine, sink: SmtpSink, engine: Engine, tmp_path: Path
) -> None:
    """With OUTBOX_LISTEN_DATABASE_URL a direct connection, the executor LISTENs there and wakes on NOTIFY."""
    log = tmp_path / "executor.log"
    os.environ["OUTBOX_LISTEN_DATABASE_URL"] = database_url
    try:
        run = executor(pooled(pooler, database_url), sink, log)
    finally:
        del os.environ["OUTBOX_LISTEN_DATABASE_URL"]
    try:

        def listening() -> bool:
            # behind the pooler alone the executor never LISTENs: a LISTEN is on the direct connection
            with engine.connect() as conn:
                query = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN outbox%'"
                return bool(conn.execute(text(query)).scalar_one())

        until(listening, timeout=30, what="the executor's LISTEN on the direct connection")
        with app.begin() as conn:
            enqueue_email(conn, notices.WORKSPACE_ALERT, {"workspace_id": 1, "alert_id": 1})
        until(lambda: states(engine) == {"DONE": 1}, timeout=30, what="the action DONE")
    finally:
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) == 0, log.read_text()
    assert "polling every" not in log.read_text()


def test_an_application_connection_that_prepares_is_refused_by_the_pooler_not_by_outbox(
    pooler: PgBouncer, database_url: str, app: Engine
) -> None:
    """outbox's statements on the caller's connection follow the caller's setting; a connection of its own
    (`bind_pooled`) finds the pooler and prepares nothing, however often a statement runs."""
    with psycopg.connect(pooler.url(make_url(database_url).database or ""), autocommit=True) as conn:
        assert bind_pooled(conn)
        assert conn.prepare_threshold is None
        for n in range(10):
            assert conn.execute("SELECT %s::int", [n]).fetchone() == (n,)
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert prepared == (0,)


def test_every_operator_command_works_through_the_pooler(
    pooler: PgBouncer, empty_database_url: str, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The migrations (their advisory lock is a transaction's) and every command on the operator's side,
    each with a statement timeout that the pooler refuses as a startup option."""
    url = pooled(pooler, empty_database_url)
    monkeypatch.setenv("OUTBOX_DATABASE_URL", url)
    assert cli("db", "upgrade").code == 0
    engine = create_engine(url, connect_args={"prepare_threshold": None})
    try:
        with engine.begin() as conn:
            install_kinds(conn, kinds.ALL)
        ids = [enqueue(engine, lane=f"lane-{n}", proposed=True, subject_account_id=n + 1) for n in range(4)]
        insert_ended(engine, ended_ago=timedelta(days=40))
    finally:
        engine.dispose()
    commands = [
        ("status",),
        ("status", "--json"),
        ("lanes",),
        ("show", str(ids[0])),
        ("list", "--state", "PROPOSED"),
        ("admit", str(ids[0])),
        ("refuse", str(ids[1])),
        ("cancel", str(ids[2])),
        ("erase-account", str(4)),
        ("purge", "--older-than", "30d"),
    ]
    for args in commands:
        result = cli(*args, "--statement-timeout", "5")
        assert result.code == 0, (args, result.err)
    assert cli("db", "current").code == 0
    engine = create_engine(url, connect_args={"prepare_threshold": None})
    try:
        with engine.connect() as conn:
            found = dict(conn.execute(text("SELECT id, state FROM agent_action")).all())  # type: ignore[arg-type]
    finally:
        engine.dispose()
    assert found == {ids[0]: "ADMITTED", ids[1]: "CANCELLED", ids[2]: "CANCELLED"}


def test_the_exporter_reads_through_the_pooler(
    pooler: PgBouncer, database_url: str, app: Engine, tmp_path: Path
) -> None:
    """`outbox metrics serve` on the pooler, scraped more often than psycopg runs a statement before it
    would prepare it: every scrape reads the database."""
    from tests.chaos.postgres import free_port

    with app.begin() as conn:
        enqueue_email(conn, notices.WORKSPACE_ALERT, {"workspace_id": 1, "alert_id": 1})
    port = free_port()
    env = {**os.environ, "OUTBOX_DATABASE_URL": pooled(pooler, database_url), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "outbox.cli", "metrics", "serve", "--port", str(port), "--cache-seconds", "0"]
    with (tmp_path / "exporter.log").open("wb") as out:
        exporter = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=out)
    scrapes: list[str] = []

    def scraped() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                scrapes.append(answer.read().decode())
        except OSError:
            return False
        return len(scrapes) >= 8

    try:
        until(scraped, timeout=60, what="eight scrapes")
    finally:
        exporter.terminate()
        exporter.wait(30)
    for exposed in scrapes:
        assert "outbox_exporter_up 1.0" in exposed, (tmp_path / "exporter.log").read_text()
        assert 'outbox_due_actions{kind="EMAIL"} 1.0' in exposed


def test_a_multi_host_url_skips_a_server_that_is_down(
    pooler: PgBouncer,
    database_url: str,
    sink: SmtpSink,
    cli: Callable[..., CliResult],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A libpq multi-host URL: the first host refuses connections, the second (the pooler) serves the
    commands and an executor."""
    from tests.chaos.postgres import free_port

    database = make_url(database_url).database
    url = f"postgresql://{pooler.user}@127.0.0.1:{free_port()},127.0.0.1:{pooler.port}/{database}"
    monkeypatch.setenv("OUTBOX_DATABASE_URL", url + "?target_session_attrs=read-write")
    result = cli("status")
    assert result.code == 0, result.err
    for name, value in {"HOST": "127.0.0.1", "PORT": str(sink.port), "SENDER": "outbox@example.com"}.items():
        monkeypatch.setenv(f"OUTBOX_SMTP_{name}", value)
    ran = cli("run", "--adapters", "examples.accounts:adapters", "--max-seconds", "1")
    assert ran.code == 0, ran.err
    assert f"on {url}?target_session_attrs=read-write: concurrency" in ran.err  # as given, every host


def test_an_adapter_s_query_that_the_pooler_never_ends_is_bounded_on_outbox_s_side(
    pooler: PgBouncer, database_url: str
) -> None:
    """Through the pooler the server gets no statement timeout (the startup option is refused), so a query
    that never answers held its connection for ever: the executor's pool of 8 ran out after a network fault
    and every later attempt waited for a connection. `answered_connection` ends the block at the engine's
    statement timeout as outbox's own fault, and the pool's one connection serves the next query."""

    async def scenario() -> None:
        engine = async_engine(pooled(pooler, database_url), statement_timeout=1, pool_size=1, max_overflow=0)
        try:
            with pytest.raises(psycopg.OperationalError, match="did not answer within 1 s"):
                async with answered_connection(engine) as conn:
                    await conn.execute(text("SELECT pg_sleep(3600)"))
            async with answered_connection(engine) as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
        finally:
            await engine.dispose()

    asyncio.run(asyncio.wait_for(scenario(), 30))
