"""How outbox opens a connection to its database: bounded waits, and the rules of a connection pooler.

    connection parameters (libpq's; one host, or a list with target_session_attrs)
      ─▶ with_tcp_bounds: TCP keepalives and tcp_user_timeout, unless the URL sets its own
      ─▶ connect ─ refused for the `options` startup parameter? ─▶ connect again without outbox's
                   statement timeout option (PgBouncer refuses every startup option it does not know)
      ─▶ behind a pooler? (the server process that answers a query is not the one the handshake named)
             ─▶ no server-side prepared statements on this connection

Every engine of `engines` opens its connections through `install` (SQLAlchemy's connect events); the
executor's own connections through `connect_async`.

Why each rule:
- A host that vanishes from the network (a stalled VM, a changed firewall) sends neither data nor a reset:
  keepalives (idle after 5 s, 2 probes 2 s apart) and tcp_user_timeout (5 s of unacknowledged data) end
  such a connection in about 10 s instead of the system's minutes.
- psycopg prepares a statement on the server after it has run it five times on a connection. Behind a
  transaction pooler the next transaction may run on another server connection, where the statement is
  missing or, worse, exists under the same name ("prepared statement "_pg3_0" already exists"). A pooler
  is recognised by the process id the server gives: a pooler hands its clients a key of its own, so the
  handshake's process id and `pg_backend_pid()` differ. Such a connection never prepares.
- A pooler that refuses the startup option carrying outbox's statement timeout gets the connection without
  it, and outbox says so once: the statement timeout then comes from the role (`ALTER ROLE ... SET
  statement_timeout`) or the pooler's own `query_timeout`. The executor bounds its statements on its side
  as well (`outbox.executor.store`), whatever the server says.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import Engine, event

if TYPE_CHECKING:  # the operator commands load no asyncio layer
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("outbox.db")

# libpq settings of every outbox connection, unless its URL sets them (no effect on a Unix socket)
TCP_BOUNDS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 2,
    "tcp_user_timeout": 5000,
}
# the option `engines.engine_url` adds to the startup options; the only one outbox takes back
STATEMENT_TIMEOUT_OPTION = re.compile(r"\s*--statement_timeout=\d+")
_REFUSED_OPTION = "unsupported startup parameter"
_said_refused = False


def with_tcp_bounds(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with TCP_BOUNDS for every setting they leave unset."""
    return {**TCP_BOUNDS, **params}


def without_own_options(params: dict[str, Any]) -> dict[str, Any] | None:
    """`params` without outbox's statement timeout in their startup options; None when they hold none."""
    options = params.get("options")
    if not isinstance(options, str) or not STATEMENT_TIMEOUT_OPTION.search(options):
        return None
    rest = STATEMENT_TIMEOUT_OPTION.sub("", options).strip()
    return {**{k: v for k, v in params.items() if k != "options"}, **({"options": rest} if rest else {})}


def refused_options(error: BaseException) -> bool:
    """The server (a pooler) refused a startup parameter, such as `options`."""
    return isinstance(error, psycopg.OperationalError) and _REFUSED_OPTION in str(error)


def _second_try(error: psycopg.OperationalError, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters to connect with again after `error`: `params` without outbox's startup option when a
    pooler refused it (said once); any other error is raised as it is."""
    fewer = without_own_options(params) if refused_options(error) else None
    if fewer is None:
        raise error
    _say_refused(params)
    return fewer


def _say_refused(params: dict[str, Any]) -> None:
    global _said_refused
    if not _said_refused:
        _said_refused = True
        found = STATEMENT_TIMEOUT_OPTION.search(str(params.get("options", "")))
        shown = found.group(0).strip() if found else "its statement timeout"
        log.warning(
            "the database (a connection pooler) refuses startup options: outbox connects without %s;"
            " set a statement timeout for the role (ALTER ROLE ... SET statement_timeout) or the pooler's"
            " query_timeout",
            shown,
        )


_PID_QUERY = "SELECT pg_backend_pid()"


def _pooled(handshake_pid: int, backend_pid: int) -> bool:
    return handshake_pid != backend_pid


def bind_pooled(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn` reaches PostgreSQL through a pooler; if so, it will not prepare statements."""
    with conn.cursor() as cursor:
        cursor.execute(_PID_QUERY, prepare=False)
        row = cursor.fetchone()
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        conn.rollback()  # the probe opened a transaction on a connection not in autocommit
    pooled = row is not None and _pooled(conn.info.backend_pid, int(row[0]))
    if pooled:
        conn.prepare_threshold = None
    return pooled


async def bind_pooled_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """`bind_pooled` for an async connection."""
    async with conn.cursor() as cursor:
        await cursor.execute(_PID_QUERY, prepare=False)
        row = await cursor.fetchone()
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        await conn.rollback()
    pooled = row is not None and _pooled(conn.info.backend_pid, int(row[0]))
    if pooled:
        conn.prepare_threshold = None
    return pooled


def behind_pooler(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether a connection of `connect_async` reaches PostgreSQL through a pooler: exactly those prepare
    nothing."""
    return conn.prepare_threshold is None


async def connect_async(conninfo: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """A psycopg async connection on `conninfo` by the rules above (`kwargs`: psycopg's, such as autocommit)."""
    params = with_tcp_bounds(dict(psycopg.conninfo.conninfo_to_dict(conninfo)))
    try:
        conn = await psycopg.AsyncConnection.connect(**params, **kwargs)
    except psycopg.OperationalError as error:
        conn = await psycopg.AsyncConnection.connect(**_second_try(error, params), **kwargs)
    try:
        await bind_pooled_async(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


def install(engine: Engine | AsyncEngine) -> None:
    """Open every new connection of `engine` by the rules above. Again on the same engine, the hook moves
    after those added since, so that it connects with the parameters they set."""
    sync = engine if isinstance(engine, Engine) else engine.sync_engine
    if event.contains(sync, "do_connect", _do_connect):
        event.remove(sync, "do_connect", _do_connect)
    event.listen(sync, "do_connect", _do_connect)
    if not event.contains(sync, "connect", _on_connect):
        event.listen(sync, "connect", _on_connect)


def _do_connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
    cparams.update(with_tcp_bounds(cparams))
    try:
        return dialect.connect(*cargs, **cparams)
    except psycopg.OperationalError as error:
        return dialect.connect(*cargs, **_second_try(error, cparams))


def _on_connect(dbapi_connection: Any, record: Any) -> None:
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    if isinstance(driver, psycopg.AsyncConnection):
        from sqlalchemy.util import await_only

        await_only(bind_pooled_async(driver))
    else:
        bind_pooled(driver)
