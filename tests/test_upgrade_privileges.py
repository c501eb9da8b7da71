"""`outbox db upgrade` run by a role that owns its database but lacks CREATEROLE, on a PostgreSQL server of
this module's own (the role outbox_reader is the whole server's, so the suite's server, where it exists
already, cannot show its absence).

Without outbox_reader, the upgrade stops in one line naming CREATEROLE and the two ways on, and leaves
nothing behind; once an administrator has created outbox_reader, the same role upgrades; a role with
CREATEROLE creates it itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from demo.postgres import embedded_postgres_server
from outbox.db import psycopg_url

ROOT = Path(__file__).resolve().parent.parent
REFUSED = (
    "error: the upgrade creates the role outbox_reader (what dashboards and the metrics exporter read with),"
    " which needs the CREATEROLE attribute, and the role that runs it lacks it: have an administrator run"
    " `CREATE ROLE outbox_reader NOLOGIN` once on this server, or `ALTER ROLE <this role> CREATEROLE`, then"
    " upgrade again (nothing was changed)\n"
)


@pytest.fixture(scope="module")
def own_server() -> Iterator[Engine]:
    """An administrative engine on a PostgreSQL server started for this module, stopped by it."""
    data_dir = Path(tempfile.mkdtemp(prefix="outbox-privileges-pg-"))
    data_dir.chmod(0o755)
    server = embedded_postgres_server(data_dir)
    admin = create_engine(psycopg_url(server.get_uri()), isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        yield admin
    finally:
        admin.dispose()
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def owner_url(own_server: Engine, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of `app_owner`, a role without CREATEROLE that owns the empty database `app`, on a server
    where outbox_reader does not exist."""
    with own_server.connect() as conn:
        conn.execute(text("CREATE ROLE app_owner LOGIN NOCREATEROLE"))
        conn.execute(text("CREATE DATABASE app OWNER app_owner"))
    yield make_url(str(own_server.url)).set(username="app_owner", database="app").render_as_string(False)
    with own_server.connect() as conn:
        conn.execute(text("DROP DATABASE app WITH (FORCE)"))
        conn.execute(text("DROP ROLE app_owner"))
        conn.execute(text("DROP ROLE IF EXISTS outbox_reader"))


def upgrade(url: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OUTBOX_DATABASE_URL": url, "COLUMNS": "500"}
    command = [str(Path(sys.executable).parent / "outbox"), "db", "upgrade"]
    return subprocess.run(command, env=environment, cwd=ROOT, capture_output=True, text=True, timeout=120)


def reader_exists(admin: Engine) -> bool:
    with admin.connect() as conn:
        return bool(conn.execute(text("SELECT count(*) FROM pg_roles WHERE rolname = 'outbox_reader'")).scalar())


def tables(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"))
            return list(found.scalars())
    finally:
        engine.dispose()


def test_a_role_without_createrole_is_told_in_one_line_and_nothing_is_left(own_server: Engine, owner_url: str) -> None:
    assert not reader_exists(own_server)
    done = upgrade(owner_url)
    assert (done.returncode, done.stderr) == (1, REFUSED)
    assert tables(owner_url) == [], "the upgrade's transaction left no table, not even its version table"
    assert not reader_exists(own_server)


def test_once_an_administrator_created_outbox_reader_the_same_role_upgrades(own_server: Engine, owner_url: str) -> None:
    with own_server.connect() as conn:
        conn.execute(text("CREATE ROLE outbox_reader NOLOGIN"))
    done = upgrade(owner_url)
    assert done.returncode == 0, done.stderr
    assert "agent_action" in tables(owner_url)
    engine = create_engine(owner_url)
    try:
        with engine.connect() as conn:
            readable = "SELECT has_any_column_privilege('outbox_reader', 'agent_action', 'SELECT')"
            assert conn.execute(text(readable)).scalar() is True
    finally:
        engine.dispose()


def test_a_role_with_createrole_creates_outbox_reader_itself(own_server: Engine, owner_url: str) -> None:
    with own_server.connect() as conn:
        conn.execute(text("ALTER ROLE app_owner CREATEROLE"))
    done = upgrade(owner_url)
    assert done.returncode == 0, done.stderr
    assert reader_exists(own_server)
