"""The options every command shares, their bounds, and the rule that a command never guesses its database.

This module imports only typer (and the standard library): the `outbox` command builds its help from the
command signatures alone, and each command loads the database layer, Alembic or the executor in its own
body, when it runs. Values are checked here, while the command line is read, so a bad value is one line
(exit 2) before anything connects.

The database URL and the two timeouts are read here, from `--database-url`/`OUTBOX_DATABASE_URL`,
`--connect-timeout`/`OUTBOX_CONNECT_TIMEOUT_SECONDS` and
`--statement-timeout`/`OUTBOX_STATEMENT_TIMEOUT_SECONDS`, with the defaults and variable names of
`outbox._internal.config.defaults` (which the library's `outbox.settings` has too), never through
`outbox.settings` itself (it loads pydantic): `outbox status` stays light.

What reaches the terminal is here too, for every command and for `main`'s one error line alike:
`printable` escapes the control characters of a value, and `hide_passwords` replaces the password of the
database URL the operator gave (as written or decoded, in its place or as a parameter) with ***.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import typer

from outbox._internal.config.defaults import SETTINGS, setting_variable
from outbox._internal.redaction.masking import hide, passwords_in
from outbox.errors import OutboxError

# PostgreSQL bigint: ids, account ids, counts
MAX_BIGINT = 2**63 - 1
# a duration or a number of seconds: at most 100 years (and a timedelta the database clock can take)
MAX_DAYS = 36_500
MAX_SECONDS = MAX_DAYS * 86_400
# libpq waits at least 2 s (it reads 1 as 2); an hour is more than any connection needs
MIN_CONNECT_TIMEOUT, MAX_CONNECT_TIMEOUT = 2, 3_600
MAX_STATEMENT_TIMEOUT = 86_400.0


def finite(value: float | None) -> float | None:
    """A typer callback: refuse nan and infinity (a range check lets nan through)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


DATABASE_URL_OPTION = typer.Option(
    SETTINGS.database_url,
    "--database-url",
    envvar=setting_variable("database_url"),
    show_envvar=True,
    help="URL of the outbox database (postgresql://user:password@host/db).",
)
CONNECT_TIMEOUT_OPTION = typer.Option(
    SETTINGS.connect_timeout_seconds,
    "--connect-timeout",
    envvar=setting_variable("connect_timeout_seconds"),
    show_envvar=True,
    min=MIN_CONNECT_TIMEOUT,
    max=MAX_CONNECT_TIMEOUT,
    help="Give up connecting to the database after this many seconds.",
)
STATEMENT_TIMEOUT_OPTION = typer.Option(
    SETTINGS.statement_timeout_seconds,
    "--statement-timeout",
    envvar=setting_variable("statement_timeout_seconds"),
    show_envvar=True,
    min=0,
    max=MAX_STATEMENT_TIMEOUT,
    callback=finite,
    help="Cancel a statement that runs longer than this many seconds (0: no limit).",
)
# a migration's index build on a large table takes its time, and a second upgrade waits for the first:
# no limit unless one is given here (the variable of the other commands does not apply)
MIGRATION_STATEMENT_TIMEOUT_OPTION = typer.Option(
    0.0,
    "--statement-timeout",
    min=0,
    max=MAX_STATEMENT_TIMEOUT,
    callback=finite,
    help="Cancel a statement of the migration that runs longer than this many seconds (0: no limit).",
)
CELL_OPTION = typer.Option(
    None,
    "--cell",
    envvar="OUTBOX_CELL",
    show_envvar=True,
    help="The cell whose database to use, named in the cells file (OUTBOX_CELLS_FILE); not with --database-url.",
)
ALL_CELLS_OPTION = typer.Option(
    False, "--all-cells", help="Every cell of the cells file (OUTBOX_CELLS_FILE), one by one; not with --cell."
)
JSON_OPTION = typer.Option(False, "--json", help="Print JSON for scripts instead of tables.")
ID_ARGUMENT = typer.Argument(..., metavar="ID", min=1, max=MAX_BIGINT, help="The action's id.")


class NoDatabase(OutboxError):
    def __init__(self) -> None:
        super().__init__("no database given: pass --database-url or set OUTBOX_DATABASE_URL (or --cell NAME)")


class AllCellsAndOne(OutboxError):
    def __init__(self) -> None:
        super().__init__(
            "--all-cells and --cell or --database-url (or OUTBOX_DATABASE_URL) both name databases: give one"
        )


class TwoDatabases(OutboxError):
    def __init__(self, cell: str) -> None:
        super().__init__(
            f"--cell {cell} and --database-url (or OUTBOX_DATABASE_URL) both name a database: give one of them"
        )


def required(database_url: str | None) -> str:
    """The URL the operator gave; never an embedded or default database."""
    if not database_url or not database_url.strip():
        raise NoDatabase()
    return database_url.strip()


@dataclass(frozen=True)
class Database:
    """The database a command works on, and how long it waits for it."""

    url: str
    connect_timeout: int
    # seconds; None: no limit
    statement_timeout: float | None
    # the cell it is, when the operator named one (`--cell`)
    cell: str | None = None


def database(
    database_url: str | None, connect_timeout: int, statement_timeout: float, cell: str | None = None
) -> Database:
    """The database the operator named: by its URL, or by its cell's name in the cells file, never both."""
    if cell is None:
        return Database(required(database_url), connect_timeout, statement_timeout or None)
    if database_url and database_url.strip():
        raise TwoDatabases(cell)
    _chosen_cell[:] = [cell]
    return Database(cell_url(cell), connect_timeout, statement_timeout or None, cell)


# the cell a command was given (`--cell`): its error line names it
_chosen_cell: list[str] = []


def chosen_cell() -> str | None:
    return _chosen_cell[0] if _chosen_cell else None


def forget_chosen_cell() -> None:
    """A new command line: no cell chosen yet."""
    _chosen_cell.clear()


def cell_url(name: str) -> str:
    """The database URL of cell `name` (every cell's URL read and checked first); its password is
    remembered, so no line printed shows it."""
    from outbox.cells import load_cells

    url = load_cells().url(name)
    remember_cell_passwords([url])
    return url


def remember_cell_passwords(urls: Iterable[str]) -> None:
    """Note the passwords of cells' database URLs, so no line printed shows them."""
    for url in urls:
        _secrets.update(passwords_in(url))


_Command = Callable[..., None]


@dataclass(frozen=True)
class AllCells:
    """Every cell of the cells file (`--all-cells`), and how long the command waits for each."""

    connect_timeout: int
    # seconds; None: no limit
    statement_timeout: float | None


def database_options(
    *, statement_timeout: Any = STATEMENT_TIMEOUT_OPTION, optional: bool = False, all_cells: bool = False
) -> Callable[[_Command], _Command]:
    """A decorator that gives a command the database options, declared here once: --database-url,
    --connect-timeout, `statement_timeout` (--statement-timeout, the migrations' own by their choice) and
    --cell (a database named by its cell, `outbox.cells`), after the command's own options in its --help.
    The command takes them as one parameter, `db: Database`, built (and the URL required) before its body
    runs; with `optional`, `db` is None when no URL was given, for a command that may run without a database
    (`db upgrade --sql`); with `all_cells`, the command takes --all-cells too, and `db` is then `AllCells`."""
    shared = [
        inspect.Parameter("database_url", inspect.Parameter.KEYWORD_ONLY, default=DATABASE_URL_OPTION),
        inspect.Parameter("connect_timeout", inspect.Parameter.KEYWORD_ONLY, default=CONNECT_TIMEOUT_OPTION),
        inspect.Parameter("statement_timeout", inspect.Parameter.KEYWORD_ONLY, default=statement_timeout),
        inspect.Parameter("cell", inspect.Parameter.KEYWORD_ONLY, default=CELL_OPTION),
    ]
    if all_cells:
        shared.append(inspect.Parameter("all_cells", inspect.Parameter.KEYWORD_ONLY, default=ALL_CELLS_OPTION))
    types = {
        "database_url": str | None,
        "connect_timeout": int,
        "statement_timeout": float,
        "cell": str | None,
        "all_cells": bool,
    }

    def decorate(command: _Command) -> _Command:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "db"]

        @functools.wraps(command)
        def with_database(
            *args: Any,
            database_url: str | None,
            connect_timeout: int,
            statement_timeout: float,
            cell: str | None,
            all_cells: bool = False,
            **kwargs: Any,
        ) -> None:
            url_given = bool(database_url and database_url.strip())
            db: Database | AllCells | None
            if all_cells:
                if url_given or cell is not None:
                    raise AllCellsAndOne()
                db = AllCells(connect_timeout, statement_timeout or None)
            elif not optional or url_given or cell is not None:
                db = database(database_url, connect_timeout, statement_timeout, cell)
            else:
                db = None
            command(*args, db=db, **kwargs)

        parameters = own + [p.replace(annotation=types[p.name]) for p in shared]
        with_database.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
        with_database.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_database

    return decorate


# ---- durations ---------------------------------------------------------------------------------------

_DURATION = re.compile(r"([0-9]{1,12})([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_duration(option: str, value: str) -> timedelta:
    """`30d`, `24h`, `15m`, `90s`: a whole number and one unit, at most 100 years."""
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"{option}: {value!r} is not a duration; write a whole number and s, m, h or d (30d, 24h)")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds > MAX_SECONDS:
        raise ValueError(f"{option}: {value!r} is more than 100 years ({MAX_DAYS}d)")
    return timedelta(seconds=seconds)


def duration(option: str) -> Callable[[str | None], str | None]:
    """A typer callback that checks the duration option `option` while the command line is read (an
    option not given, None, is left to the command)."""

    def check(value: str | None) -> str | None:
        if value is not None:
            parse_duration(option, value)  # a ValueError naming the option: one line, exit 2
        return value

    return check


# ---- what reaches the terminal -----------------------------------------------------------------------

# C0 controls, DEL, C1 controls, the line and paragraph separators, and the bidirectional controls
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def printable(value: object) -> str:
    """`value` as text a terminal shows and never obeys: control characters escaped (\\x1b, \\n, \\u2028)."""
    return _UNSAFE.sub(_escape, str(value))


# ---- passwords never printed -------------------------------------------------------------------------

_secrets: set[str] = set()


def remember_passwords(argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """Note the passwords of the database URLs on the command line and in the environment."""
    urls: list[str] = [environ.get(setting_variable("database_url"), "")]
    for index, arg in enumerate(argv):
        if arg == "--database-url" and index + 1 < len(argv):
            urls.append(argv[index + 1])
        elif arg.startswith("--database-url="):
            urls.append(arg.partition("=")[2])
    _secrets.clear()
    for url in urls:
        _secrets.update(passwords_in(url))


def hide_passwords(text: str) -> str:
    """`text` with every remembered password replaced by ***."""
    return hide(text, _secrets)
