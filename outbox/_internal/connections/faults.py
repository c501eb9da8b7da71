"""Which errors are failures of outbox's own database or connection, one answer for every part of outbox.

    an error ─▶ own_database_fault?   the database or its pool failed (down, restarting, failing over, a
                                      dropped connection, no pooled connection free in time): the executor
                                      hands the attempt back without counting it, the claim loop and the
                                      group commit try again; a bug or bad data is not one
             ─▶ ended_by_the_server?  the narrower case of a server that accepted the session and ended it
                                      (terminated, crashed, shutting down, the connection lost
                                      mid-statement, or closed by the server right after it was accepted,
                                      as a restarting server does): a command starting against it asks
                                      again

Both take what SQLAlchemy raises (a DBAPIError wrapping the driver's error, a pool timeout) and what
psycopg raises on a connection of its own.
"""

from __future__ import annotations

import psycopg
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# psycopg's OperationalError covers a refused or dropped connection, a server shutting down, a statement
# or lock timeout and a serialization failure; SQLAlchemy wraps it under the same name
_OWN_FAULTS: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    PoolTimeout,
    DisconnectionError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
# SQLSTATEs of a server that ended this session: admin_shutdown (a terminated backend), crash_shutdown,
# cannot_connect_now (starting up or shutting down)
_ENDED_BY_THE_SERVER = {"57P01", "57P02", "57P03"}
# what libpq says of a connection the server accepted and closed before it answered the startup (a server
# restarting, or a proxy in front of one); a refused connection or one never answered says otherwise
_CLOSED_AT_CONNECT = ("server closed the connection unexpectedly", "Connection reset by peer")


def own_database_fault(error: BaseException) -> bool:
    """A failure of outbox's own database or connection pool, not of a caller's logic or its data: the
    classes above, and any error on which SQLAlchemy found its connection lost. ProgrammingError,
    IntegrityError and DataError (a bug or bad data) are not."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, _OWN_FAULTS)


def ended_by_the_server(error: DBAPIError) -> bool:
    """The server ended the session: its SQLSTATE says so, the connection was lost mid-statement, or the
    server closed it as soon as it was accepted."""
    lost_mid_statement = error.connection_invalidated and error.statement is not None
    closed_at_connect = isinstance(error.orig, psycopg.OperationalError) and any(
        words in str(error.orig) for words in _CLOSED_AT_CONNECT
    )
    return lost_mid_statement or closed_at_connect or getattr(error.orig, "sqlstate", None) in _ENDED_BY_THE_SERVER
