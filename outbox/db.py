"""Database engines for an application's own code: the engines outbox makes on a URL, as its commands and flows use
them.

    sync_engine(url) / async_engine(url) ─▶ a SQLAlchemy engine on psycopg 3 that gives up connecting after
        `connect_timeout` seconds (10 by default), cancels a statement past `statement_timeout` (none by default),
        keeps TCP waits bounded and, behind a connection pooler, prepares nothing on the server
    psycopg_url(url) ─▶ the URL with the psycopg 3 driver (`postgresql+psycopg://`)
    InvalidDatabaseUrl ─ a URL that is not a PostgreSQL URL, named without its password

A URL may name several servers as libpq's does (`postgresql://u@db1,db2/app?target_session_attrs=read-write`):
a connection keeps the first that accepts writes, so after a failover the engine reaches the promoted server.
"""

from outbox._internal.connections.engines import InvalidDatabaseUrl, async_engine, psycopg_url, sync_engine

__all__ = ["InvalidDatabaseUrl", "async_engine", "psycopg_url", "sync_engine"]
