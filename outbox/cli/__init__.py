"""The `outbox` command: one typer app, one module per command group.

Each command module imports only typer at its top and loads what it needs when it runs, so `outbox --help`
starts at once and `outbox status` loads the database layer but never Alembic, the executor or the demo.
`main` turns every failure into one line on stderr (one JSON object with `--json`) and an exit code a
script can act on:

    2  bad input: a usage error, a bad value, an unknown id or state, a refused change, no database given
    1  the database: it cannot be reached (or not in time), refuses the role, or its outbox schema is
       missing or behind

A password of the database URL (from `--database-url` or `OUTBOX_DATABASE_URL`) never reaches the line, and
no log record of a command shows a URL's query or the secret of its user information, whichever library
logs it (`outbox._internal.redaction.log_records`).
Any other error is a fault of outbox's own and keeps its traceback.
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

import typer
from typer.exceptions import TyperException

from outbox._internal.redaction.log_records import hide_secrets_in_logs
from outbox.cli import changes, db, demo, destinations, metrics, nats, ops, prefect, run, worker
from outbox.cli.help import WholeHelpGroup, help_width
from outbox.cli.options import chosen_cell, forget_chosen_cell, hide_passwords, printable, remember_passwords
from outbox.errors import OutboxError

# a traceback (a fault of outbox's own) never shows local values: a URL and its password are among them;
# help is plain text that no word is cut from (see outbox.cli.help)
app = typer.Typer(
    cls=WholeHelpGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    context_settings={"terminal_width": help_width()},
    help="Carry out effects reliably from PostgreSQL.",
)
app.add_typer(db.app, name="db", cls=WholeHelpGroup)
app.add_typer(destinations.app, name="destinations", cls=WholeHelpGroup)
app.add_typer(metrics.app, name="metrics", cls=WholeHelpGroup)
app.add_typer(nats.app, name="nats", cls=WholeHelpGroup)
app.add_typer(prefect.app, name="prefect", cls=WholeHelpGroup)
app.command("demo")(demo.demo)
app.command("run")(run.run)
app.command("status")(ops.status)
app.command("lanes")(ops.lanes)
app.command("show")(ops.show)
app.command("list")(ops.list_)
app.command("admit")(changes.admit)
app.command("refuse")(changes.refuse)
app.command("cancel")(changes.cancel)
app.command("erase-account")(changes.erase_account)
app.command("purge")(changes.purge)
app.command("worker", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(worker.worker)


def _failure(error: Exception) -> tuple[int, str] | None:
    """The exit code and line for `error`, or None for a fault of outbox's own (a traceback)."""
    if isinstance(error, TyperException):  # a usage error, a value the command line cannot take
        return 2, error.format_message()
    if isinstance(error, OutboxError):
        return getattr(error, "exit_code", 2), str(error)
    if "sqlalchemy.exc" in sys.modules or "psycopg" in sys.modules:  # only a command that used the database
        from outbox.cli.common import database_failure

        failure = database_failure(error)
        if failure is not None:
            return failure
    if isinstance(error, ValueError):
        return 2, str(error)
    return None


def _report(code: int, message: str) -> NoReturn:
    cell = chosen_cell()
    message = hide_passwords(f"cell {cell}: {message}" if cell and message else message)
    if "--json" in sys.argv[1:]:
        typer.echo(json.dumps({"error": message, "exit_code": code}, ensure_ascii=True), err=True)
    elif message:  # empty after `outbox` alone: typer printed the help
        typer.echo(f"error: {printable(message)}", err=True)
    sys.exit(code)


def main() -> None:
    remember_passwords(sys.argv[1:], os.environ)
    forget_chosen_cell()
    hide_secrets_in_logs()
    try:
        code = app(standalone_mode=False)  # usage errors come here instead of as typer's boxed report
    except Exception as error:
        failure = _failure(error)
        if failure is None:
            raise
        _report(*failure)
    if isinstance(code, int) and code:
        sys.exit(code)
