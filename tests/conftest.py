"""Test harness: one PostgreSQL per test session, one migrated template, one fresh database per test.

The server is `OUTBOX_TEST_DATABASE_URL` when set, otherwise an embedded PostgreSQL started here and
stopped at the end of the session. The template is migrated once and gets the test kinds (step 2 of
"Add a kind"); each test gets `CREATE DATABASE ... TEMPLATE`, which takes milliseconds. `cli` runs the
`outbox` command in this process, through the console script's entry point, on the test's database.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.nats import NatsServer
from demo.postgres import embedded_postgres_server
from demo.sink import SmtpSink
from outbox import migrate
from outbox.cli import main
from outbox.db import async_engine, psycopg_url
from outbox.testing import install_kinds
from tests import kinds as test_kinds
from tests.prefect_server import prefect_server  # noqa: F401 (a fixture for the modules that ask for it)

_counter = itertools.count()

# `make test` runs the files in two worker processes (pytest-xdist), which start with COLUMNS=80 set; the
# commands' output off a terminal is unbounded without it, as in a plain `pytest` run, and the tests that
# mean a width set it themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """An administrative URL on the test server (its maintenance database)."""
    configured = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    if configured:
        yield psycopg_url(configured)
        return
    # The server runs as a user of its own, so its data lives outside pytest's base temporary folder:
    # another pytest run on this machine resets that folder's mode to 0700, which would lock it out.
    # Stopped when the session ends (Ctrl-C included), before the exit handlers run.
    data_dir = Path(tempfile.mkdtemp(prefix="outbox-test-pg-"))
    data_dir.chmod(0o755)
    server = embedded_postgres_server(data_dir)
    try:
        yield psycopg_url(server.get_uri())
    finally:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


def _database_url(server_url: str, name: str) -> str:
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def admin_engine(server_url: str) -> Iterator[Engine]:
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT", pool_size=1)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def template_name(admin_engine: Engine, server_url: str) -> Iterator[str]:
    name = f"outbox_template_{os.getpid()}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(_database_url(server_url, name))
    with engine.begin() as conn:
        migrate.upgrade(conn)
        install_kinds(conn, test_kinds.ALL)
    engine.dispose()
    yield name
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def database_url(admin_engine: Engine, server_url: str, template_name: str) -> Iterator[str]:
    """A fresh, migrated database with the test kinds installed, dropped after the test."""
    name = f"outbox_test_{os.getpid()}_{next(_counter)}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"'))
    yield _database_url(server_url, name)
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def empty_database_url(admin_engine: Engine, server_url: str) -> Iterator[str]:
    """A database with nothing in it, for the migration tests."""
    name = f"outbox_empty_{os.getpid()}_{next(_counter)}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield _database_url(server_url, name)
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
async def aengine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = async_engine(database_url)
    yield engine
    await engine.dispose()


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Callable[..., CliResult]]:
    """`outbox ARGS...` through the console script's entry point, on the test's database. A long-running
    command sets up the root logger on stderr, the test's captured one: it is set back afterwards, or every
    later log line of the session (an SMTP sink's thread) would be written to a closed file. The record
    factory every command installs (`outbox._internal.redaction.log_records`) is set back too."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    factory = logging.getLogRecordFactory()

    def invoke(*args: str) -> CliResult:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["outbox", *args])
        try:
            main()
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    yield invoke
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.setLogRecordFactory(factory)


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    """A local SMTP relay that keeps every message it accepts (faults on demand)."""
    server = SmtpSink().start()
    yield server
    server.stop()


@pytest.fixture
def outbox_env(monkeypatch: pytest.MonkeyPatch, database_url: str, sink: SmtpSink) -> None:
    """The settings a flow reads from the environment: the test's database and `sink` as the relay."""
    for name, value in {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SMTP_PORT": str(sink.port),
        "OUTBOX_SMTP_SENDER": "outbox@example.com",
        "OUTBOX_SMTP_TIMEOUT_SECONDS": "2",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def outbox_logger_restored() -> Iterator[None]:
    """A drain run hands the `outbox` loggers to Prefect's run logs for the rest of its process; the tests
    after it must find the logger as it was."""
    logger = logging.getLogger("outbox")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream for one test, stopped after it."""
    server = NatsServer()
    yield server
    server.stop()
