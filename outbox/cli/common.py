"""What the operator commands share once they run: the database connection, states, the text and JSON
they print, and the one line a failure of the database becomes. Commands import it in their bodies, never
at the top (see `outbox.cli.options`).

Bad input raises ValueError naming the option, which `outbox.cli.main` prints as one line (exit 2); a
database that cannot be reached or used is one line too (exit 1), see `database_failure`.

On a terminal, output is as wide as the terminal. Off one (a pipe, a file), a line is as wide as COLUMNS
when it is set and otherwise as long as what it holds: nothing wraps at 80 columns. A table printed with
`print_table` never cuts a word or a header in the middle there, even when COLUMNS is narrower.

Every value read from the database reaches the terminal through `printable` (from `outbox.cli.options`,
so that `main` prints an error line without loading the database layer): a lane key holding an escape
sequence or a line break is shown escaped (\\x1b, \\n, \\u2028), never obeyed. JSON escapes it the
JSON way, in ASCII only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import typer
from rich.cells import cell_len
from rich.console import Console, ConsoleDimensions
from rich.measure import Measurement
from rich.table import Table
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from outbox._internal.connections.engines import sync_engine
from outbox._internal.connections.faults import ended_by_the_server
from outbox.cli.options import Database, hide_passwords, printable
from outbox.errors import OutboxError
from outbox.states import ActionState
from outbox.store.operator import STORE_EXISTS

log = logging.getLogger(__name__)
# the width of a line off a terminal with no COLUMNS: wider than anything a command prints
UNBOUNDED_WIDTH = 100_000
# the lowest level a long-running command logs (`outbox run`, `outbox metrics serve`)
LOG_LEVEL_VARIABLE = "OUTBOX_LOG_LEVEL"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class OperatorConsole(Console):
    """A Console as wide as the terminal; off a terminal, as wide as COLUMNS when it is set, otherwise
    unbounded (each line as long as what it holds). Read when printing: where the output goes decides."""

    # a width the output must have at least while a table prints (see print_table)
    min_width = 0

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        width = size.width if self.is_terminal or columns_set() else UNBOUNDED_WIDTH
        return ConsoleDimensions(max(width, self.min_width), size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


def columns_set() -> bool:
    return os.environ.get("COLUMNS", "").isdigit()


def print_table(table: Table, console: OperatorConsole | None = None) -> None:
    """Print `table` (on `out` by default). Off a terminal it is at its natural width, or within COLUMNS
    when that is set and narrower, its cells wrapping between words; a word or a header longer than its
    share stays whole, so such a table is wider than COLUMNS rather than cut."""
    console = console or out
    if console.is_terminal:
        console.print(table)
        return
    console.min_width = fit_columns(table, console, console.width)
    try:
        console.print(table)
    finally:
        console.min_width = 0


def fit_columns(table: Table, console: Console, width: int) -> int:
    """Set the widths of `table`'s columns so that it is at most `width` wide when it can be with every
    word of its cells and headers whole (a no-wrap column: every cell whole); return the table's width."""
    natural = Measurement.get(console, console.options.update_width(UNBOUNDED_WIDTH), table).maximum
    if natural <= width:
        return natural
    cells = [[str(column.header), *map(str, column.cells)] for column in table.columns]
    longest = [max(cell_len(cell) for cell in column) for column in cells]
    whole = [
        max(cell_len(word) for cell in column_cells for word in ([cell] if column.no_wrap else cell.split()) or [""])
        for column, column_cells in zip(table.columns, cells, strict=True)
    ]
    frame = natural - sum(longest)  # borders and padding
    spare = [most - least for most, least in zip(longest, whole, strict=True)]
    room = max(0, width - frame - sum(whole))
    widths = [least + extra * room // max(1, sum(spare)) for least, extra in zip(whole, spare, strict=True)]
    for column, column_width in zip(table.columns, widths, strict=True):
        column.width = column_width
    return frame + sum(widths)


# markup, emoji codes and highlighting off: lane keys, kinds and payloads are printed as they are
out = OperatorConsole(markup=False, highlight=False, emoji=False)
# what a command says about itself (progress, where it listens), away from its output
err = OperatorConsole(stderr=True, markup=False, highlight=False, emoji=False)


class _HidingFormatter(logging.Formatter):
    """A log line with the database password as *** and control characters escaped (line breaks kept,
    so a traceback stays readable)."""

    def format(self, record: logging.LogRecord) -> str:
        lines = hide_passwords(super().format(record)).split("\n")
        return "\n".join(printable(line) for line in lines)


def log_to_stderr() -> None:
    """What a long-running command logs, on stderr, from the level OUTBOX_LOG_LEVEL names (INFO unless set),
    never holding the database password (nor a URL's secret: `outbox._internal.redaction.log_records`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_HidingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=log_level(os.environ.get(LOG_LEVEL_VARIABLE, "")), handlers=[handler], force=True)


def log_level(name: str) -> int:
    """The level OUTBOX_LOG_LEVEL names (case aside; empty: INFO), or ValueError naming the variable."""
    chosen = name.strip().upper() or "INFO"
    if chosen not in LOG_LEVELS:
        raise ValueError(f"{LOG_LEVEL_VARIABLE}: unknown level {name!r} (one of {', '.join(LOG_LEVELS)})")
    return logging.getLevelNamesMapping()[chosen]


def parse_state(value: str) -> ActionState:
    try:
        return ActionState(value.strip().upper())
    except ValueError:
        known = ", ".join(ActionState)
        raise ValueError(f"--state: unknown state {value!r} (one of {known})") from None


def format_age(seconds: float | None) -> str:
    """12s, 3m 12s, 2h 5m, 1d 3h."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


class DatabaseProblem(OutboxError):
    """The database is reachable but cannot serve the command: exit 1, like a database that is down."""

    exit_code = 1


class NotMigrated(DatabaseProblem):
    def __init__(self) -> None:
        super().__init__("the database has no outbox schema: run `outbox db upgrade` first")


def require_schema(conn: Connection) -> None:
    if not conn.execute(STORE_EXISTS).scalar_one():
        raise NotMigrated()


def engine(database: Database, **options: Any) -> Engine:
    """An engine on the operator's database, with the command's connect and statement timeouts."""
    return sync_engine(
        database.url,
        connect_timeout=database.connect_timeout,
        statement_timeout=database.statement_timeout,
        **options,
    )


def migrated_engine(database: Database, *, ask_seconds: float = 0.0, **options: Any) -> Engine:
    """An engine on a database that holds the outbox schema (checked now). When the server accepted the
    connection and then ended it before the check was done (terminated, crashed or shutting down: SQLSTATE
    57P01, 57P02, 57P03; the connection lost mid-statement, as a pooler that refuses logins for a while
    does; or closed as soon as it was accepted, as a restarting server does), the check is asked again on a
    new connection until the connect timeout or `ask_seconds` has passed, whichever is longer: a
    long-running command started as its database fails over or restarts waits for it. A connection that
    cannot be opened (refused, no answer, a wrong password) and a database without the schema raise at
    once."""
    checked = engine(database, **options)
    seconds = max(database.connect_timeout, ask_seconds)
    deadline = time.monotonic() + seconds
    said = False
    try:
        while True:
            try:
                with checked.connect() as conn:
                    require_schema(conn)
                return checked
            except DBAPIError as error:
                if not ended_by_the_server(error) or time.monotonic() >= deadline:
                    raise
                if not said:
                    reason = _one_line(str(error.orig))
                    log.warning("the database ended the session (%s): asking again for %d s", reason, seconds)
                    said = True
                time.sleep(_RECHECK_SECONDS)
    except BaseException:
        checked.dispose()
        raise


@contextmanager
def connect(database: Database, *, read_only: bool = False) -> Iterator[Connection]:
    """One transaction on the outbox database; a read-only one sees a single snapshot."""
    one = engine(database, poolclass=NullPool)
    try:
        with one.connect() as conn:
            if read_only:
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                require_schema(conn)
                yield conn
    finally:
        one.dispose()


_RECHECK_SECONDS = 0.5
# SQLSTATEs of a schema older (or other) than this release's statements expect
_SCHEMA_MISMATCH = {"42P01", "42703", "42883", "42704", "3F000"}
_BACKGROUND = re.compile(r"\s*\(Background on this error at: \S+\)")


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in _BACKGROUND.sub("", message).splitlines() if part.strip())


def database_failure(error: BaseException) -> tuple[int, str] | None:
    """The exit code and line for an error of the database or its driver; None for any other error."""
    import psycopg
    from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

    if isinstance(error, DBAPIError):
        cause: BaseException = error.orig if error.orig is not None else error
    elif isinstance(error, psycopg.Error):
        cause = error
    elif isinstance(error, ArgumentError):
        return 2, f"the database URL or its options cannot be used: {_one_line(str(error))}"
    elif isinstance(error, SQLAlchemyError):  # a pool that ran out of connections, and the like
        return 1, f"the database failed: {_one_line(str(error))}"
    else:
        return None
    diagnostic = getattr(cause, "diag", None)  # a server's error: its primary message, without the SQL
    primary = getattr(diagnostic, "message_primary", None)
    message = _one_line(primary or str(cause)) or type(cause).__name__
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate == "57014":
        return 1, (
            f"the database cancelled a statement ({message}); the limit is --statement-timeout"
            " (OUTBOX_STATEMENT_TIMEOUT_SECONDS)"
        )
    if sqlstate == "42501":
        return 1, f"the database role lacks a privilege: {message}"
    if sqlstate in _SCHEMA_MISMATCH:
        return 1, f"the database's outbox schema does not match this release ({message}): run `outbox db check`"
    if sqlstate is not None and sqlstate.startswith("22"):
        return 2, f"the database refused a value: {message}"
    connecting = getattr(error, "statement", None) is None  # SQLAlchemy names the statement that failed
    if sqlstate is None and connecting and isinstance(cause, psycopg.ProgrammingError):
        return 2, f"the database URL or its options cannot be used: {message}"  # an unknown parameter
    if sqlstate is None and isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError):
        if "timeout expired" in message:
            message += " (the limit is --connect-timeout, OUTBOX_CONNECT_TIMEOUT_SECONDS)"
        return 1, f"cannot connect to the database: {message}"
    return 1, f"the database failed: {message}"


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot print {type(value).__name__} as JSON")


def print_json(data: Any) -> None:
    """`data` as JSON in ASCII only: a control character, a line separator or any non-ASCII character is a
    \\u escape, so the output is valid JSON whatever a value holds, and a terminal never obeys it."""
    typer.echo(json.dumps(data, default=_plain, indent=2, ensure_ascii=True))
