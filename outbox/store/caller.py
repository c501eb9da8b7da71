"""The caller's connection, whichever library holds it: outbox's statements run inside the caller's transaction.

    SQLAlchemy Connection, Session                ─┐
    psycopg Connection (Django's, or your own)     ─┴─▶ fetch(conn, statement, params)       ─▶ rows as dicts
    SQLAlchemy AsyncConnection, AsyncSession      ─┐
    psycopg AsyncConnection                        ─┴─▶ fetch_async(conn, statement, params) ─▶ rows as dicts

A statement is written once, as a SQLAlchemy `text()` with named parameters (`outbox.store`); for psycopg
it is compiled once to psycopg's `%(name)s` style. On a psycopg connection outbox reads through a cursor of
its own whose JSON and timestamp loaders are psycopg's defaults (a framework may load `jsonb` as text or
timestamps without a zone on its connections, as Django does), so a row reads the same whichever connection
carried it. outbox never commits, rolls back or changes the connection's settings. A psycopg connection in
autocommit mode with no transaction open is refused: the action would commit on its own, apart from the
caller's change.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import JsonbLoader, JsonLoader
from sqlalchemy import Connection, TextClause
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from outbox.errors import OutboxError

if TYPE_CHECKING:
    from outbox.store.application import Query

T = TypeVar("T")

SyncConnection = Connection | Session | psycopg.Connection[Any]
AsyncConn = AsyncConnection | AsyncSession | psycopg.AsyncConnection[Any]
Row = dict[str, Any]

_SYNC_TYPES = "a SQLAlchemy Connection or Session, or a psycopg Connection"
_ASYNC_TYPES = "a SQLAlchemy AsyncConnection or AsyncSession, or a psycopg AsyncConnection"


class NoTransaction(OutboxError):
    def __init__(self) -> None:
        super().__init__(
            "the psycopg connection is in autocommit mode with no transaction open: outbox writes inside the"
            " caller's transaction; open one (`with conn.transaction():`, or Django's `transaction.atomic()`)"
        )


@cache
def psycopg_sql(statement: TextClause) -> str:
    """`statement` in psycopg's own parameter style (`%(name)s`), compiled once."""
    return str(statement.compile(dialect=PGDialect_psycopg()))  # type: ignore[no-untyped-call]


def require_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """NoTransaction when `conn` is in autocommit with no transaction open: a write would commit alone."""
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise NoTransaction()


def _own_loaders(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    cursor.adapters.register_loader("jsonb", JsonbLoader)
    cursor.adapters.register_loader("json", JsonLoader)
    cursor.adapters.register_loader("timestamptz", TimestamptzLoader)


def fetch(conn: SyncConnection, statement: TextClause, params: Mapping[str, Any]) -> list[Row]:
    """Run `statement` on the caller's connection, in its transaction; every row it returns."""
    if isinstance(conn, Connection | Session):
        return [dict(row) for row in conn.execute(statement, params).mappings()]
    if isinstance(conn, psycopg.Connection):
        require_transaction(conn)
        with conn.cursor(row_factory=dict_row) as cursor:
            _own_loaders(cursor)
            cursor.execute(psycopg_sql(statement), params)
            return cursor.fetchall() if cursor.description is not None else []
    raise TypeError(f"outbox needs {_SYNC_TYPES}, not {type(conn).__name__} (async ones: the *_async functions)")


async def fetch_async(conn: AsyncConn, statement: TextClause, params: Mapping[str, Any]) -> list[Row]:
    """`fetch` for an async connection."""
    if isinstance(conn, AsyncConnection | AsyncSession):
        return [dict(row) for row in (await conn.execute(statement, params)).mappings()]
    if isinstance(conn, psycopg.AsyncConnection):
        require_transaction(conn)
        async with conn.cursor(row_factory=dict_row) as cursor:
            _own_loaders(cursor)
            await cursor.execute(psycopg_sql(statement), params)
            return await cursor.fetchall() if cursor.description is not None else []
    raise TypeError(f"outbox needs {_ASYNC_TYPES}, not {type(conn).__name__}")


def run(conn: SyncConnection, query: Query[T]) -> T:
    """Run one store query on the caller's connection, in its transaction."""
    return query.read(fetch(conn, query.statement, query.params))


async def run_async(conn: AsyncConn, query: Query[T]) -> T:
    """`run` for an async connection."""
    return query.read(await fetch_async(conn, query.statement, query.params))
