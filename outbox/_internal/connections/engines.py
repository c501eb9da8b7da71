"""Database engines: the sync and async SQLAlchemy engines on one URL.

Every URL is normalised to the psycopg 3 driver (`postgresql+psycopg://`), which serves both the
sync engine (enqueue, CLI, migrations) and the async one (the executor). Every engine gives up connecting
after `connect_timeout` seconds (10 by default; the driver alone would wait over two minutes for a host
that accepts the connection and never answers) and, when given one, cancels a statement that runs longer
than `statement_timeout` seconds (none by default: a library caller bounds its own work; the `outbox`
commands pass 30 s). Both travel in the engine's URL, so a connection made from `engine.url` has them too.
A URL is shown only as `shown_url` renders it: its password as ***.

An adapter's own query on the executor's engine (a notice's recipients, an event's rows) goes through
`answered_connection`: its block is answered within the engine's statement timeout (30 s when it sets none)
on outbox's side as well, whatever the server says. Behind a connection pooler, which refuses the startup
option, and on a network that keeps the connection open while it drops what it carries, nothing else ends
such a query: each one held a connection of the executor's pool for ever, and once the pool was taken every
later attempt of that executor waited 30 s for a connection and went back, for as long as it ran.

A URL may name several servers, as libpq's does (`postgresql://u@db1:5432,db2:5432/app?target_session_attrs=
read-write`): a connection tries them in turn and keeps the first that accepts writes, so after a failover
outbox reconnects to the promoted server. Every engine opens its connections by `opening`'s rules
(bounded TCP waits; behind a connection pooler, no server-side prepared statements).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from outbox._internal.config.defaults import SETTINGS
from outbox._internal.connections import opening
from outbox._internal.redaction.masking import hide, hide_credentials
from outbox.errors import OutboxError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# seconds an engine waits for a connection; libpq waits at least 2 s
CONNECT_TIMEOUT_SECONDS = float(SETTINGS.connect_timeout_seconds)
_MIN_CONNECT_TIMEOUT = 2


class InvalidDatabaseUrl(OutboxError, ValueError):
    """The database URL cannot be read, or names another database than PostgreSQL; the message never
    holds the password."""


def shown_url(url: URL) -> str:
    """`url` as it may be printed or logged: the password (in its place or as a parameter) as ***."""
    return hide_credentials(url.render_as_string(hide_password=False))


# scheme, user information, then a comma-separated list of host[:port] (libpq's multi-host URL)
_HOST_LIST = re.compile(r"^(?P<scheme>[\w+.-]+://)(?P<user>[^@/?]*@)?(?P<hosts>[^/?@]*,[^/?@]*)(?P<rest>[/?].*)?$")


def _with_host_list(url: str) -> str:
    """A libpq multi-host URL in SQLAlchemy's spelling (`@/db?host=h1:p1&host=h2:p2`); any other as it is."""
    found = _HOST_LIST.match(url.strip())
    if found is None:
        return url
    rest = found["rest"] or "/"
    path, _, query = rest.partition("?")
    hosts = "&".join(f"host={host.strip()}" for host in found["hosts"].split(",") if host.strip())
    return f"{found['scheme']}{found['user'] or ''}{path or '/'}?{hosts}{'&' + query if query else ''}"


def shown_database(url: str) -> str:
    """A database URL as the operator wrote it, for a log line: its password (in its place or as a
    parameter) as ***, every host of a multi-host URL kept."""
    return hide_credentials(url.strip())


def _parse(url: str) -> URL:
    try:
        parsed = make_url(_with_host_list(url))
    except ArgumentError:
        raise InvalidDatabaseUrl(
            "the database URL is not a URL; write postgresql://user:password@host:port/database"
        ) from None
    except ValueError:  # a port that is not a number, a host that cannot be read
        raise InvalidDatabaseUrl(
            "the database URL's host or port cannot be read; write postgresql://user:password@host:port/database"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "postgres"):
        raise InvalidDatabaseUrl(f"outbox needs PostgreSQL, not {backend!r} ({shown_url(parsed)})")
    if parsed.port is not None and not 1 <= parsed.port <= 65_535:
        raise InvalidDatabaseUrl(f"the database URL's port must be between 1 and 65535, not {parsed.port}")
    return parsed.set(drivername="postgresql+psycopg")


def parsed_database_url(url: str) -> URL:
    """`url` as outbox reads it: the psycopg driver, a multi-host URL's servers as `host` parameters;
    InvalidDatabaseUrl for a URL that cannot be read or names another database."""
    return _parse(url)


def psycopg_url(url: str) -> str:
    """The same database as `url`, as the SQLAlchemy URL of psycopg 3, the driver outbox uses
    (`postgresql+psycopg://`), for the application's own `create_engine` or `create_async_engine`; exported
    as `outbox.psycopg_url`. `postgres://`, `postgresql://` and any other PostgreSQL driver's URL are read as
    the same database, its options kept; InvalidDatabaseUrl (a ValueError) for a URL that cannot be read or
    names another database."""
    return _parse(url).render_as_string(hide_password=False)


def engine_url(url: str, *, connect_timeout: float | None, statement_timeout: float | None) -> URL:
    """The psycopg URL with the two timeouts (seconds; None leaves the URL's own or the server's)."""
    parsed = _parse(url)
    query: dict[str, str] = {}
    if connect_timeout is not None:
        query["connect_timeout"] = str(max(_MIN_CONNECT_TIMEOUT, math.ceil(connect_timeout)))
    if statement_timeout is not None:
        given = parsed.query.get("options", ())
        # the long form has no space, so the option survives the URL's rendering as a libpq URI
        ours = f"--statement_timeout={max(1, round(statement_timeout * 1000))}"
        query["options"] = " ".join([*([given] if isinstance(given, str) else given), ours])
    return parsed.update_query_dict(query)


def sync_engine(
    url: str,
    *,
    connect_timeout: float | None = CONNECT_TIMEOUT_SECONDS,
    statement_timeout: float | None = None,
    **options: Any,
) -> Engine:
    bound = engine_url(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
    engine = create_engine(bound, **options)
    opening.install(engine)
    return engine


def async_engine(
    url: str,
    *,
    connect_timeout: float | None = CONNECT_TIMEOUT_SECONDS,
    statement_timeout: float | None = None,
    **options: Any,
) -> AsyncEngine:
    from sqlalchemy.ext.asyncio import create_async_engine  # loaded by the executor, not by the operator commands

    bound = engine_url(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
    engine = create_async_engine(bound, **options)
    opening.install(engine)
    return engine


@asynccontextmanager
async def answered_connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of `engine` whose block must end within `query_seconds(engine)`: past it the block is
    cancelled (psycopg asks the server to cancel, and closes a connection whose query does not end), the
    connection leaves the pool, and psycopg's OperationalError says so (outbox's own fault)."""
    seconds = query_seconds(engine)
    bound = asyncio.timeout(seconds)
    try:
        async with bound, engine.connect() as conn:
            yield conn
    except TimeoutError as error:
        if not bound.expired():
            raise
        raise psycopg.OperationalError(f"the database did not answer within {seconds:g} s") from error


def query_seconds(engine: AsyncEngine) -> float:
    """The statement timeout `engine` asks of the server (its URL's option), or the default one."""
    options = engine.url.query.get("options", "")
    found = opening.STATEMENT_TIMEOUT_OPTION.findall(" ".join(options) if isinstance(options, tuple) else options)
    return int(found[-1].split("=")[1]) / 1000 if found else SETTINGS.statement_timeout_seconds


def conninfo(engine: AsyncEngine | Engine) -> str:
    """The engine's database as libpq connection parameters (`host=... dbname=...`), its timeouts and every
    host of a multi-host URL included, for a psycopg connection of one's own (`opening`)."""
    return _conninfo(engine.url)


def url_conninfo(url: str, *, connect_timeout: float | None = CONNECT_TIMEOUT_SECONDS) -> str:
    """`url` (any PostgreSQL URL outbox reads) as libpq connection parameters, with its connect timeout."""
    return _conninfo(engine_url(url, connect_timeout=connect_timeout, statement_timeout=None))


def _conninfo(url: URL) -> str:
    from psycopg.conninfo import make_conninfo
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    _, params = PGDialect_psycopg().create_connect_args(url)  # type: ignore[no-untyped-call]
    return make_conninfo(**params)


def fault_text(error: BaseException, password: object = None) -> str:
    """The class and the first line of the driver's message, for a log line: never the statement, its
    parameters (they may hold a recipient) or a password (`password`, the engine's own, wherever it stands)."""
    cause = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    lines = str(cause).strip().splitlines()
    # user:password@ or password=..., should a driver ever put one in its message
    message = hide(hide_credentials(lines[0].strip()), [str(password)] if password else []) if lines else ""
    message = message[:200]
    return f"{type(cause).__name__}: {message}" if message else type(cause).__name__
