"""The `outbox` command: one typer app, one module per command group.

Each command module imports only typer at its top and loads what it needs when it runs, so `outbox --help`
starts at once and `outbox status` loads the database layer but never Alembic, the executor or the demo.
`main` turns every error outbox raises on purpose, every usage error (a bad option, a missing argument)
and a database that cannot be reached into one line on stderr and exit code 2, so scripts see a clear
failure and no traceback.
"""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from outbox.cli import changes, db, demo, metrics, ops, run
from outbox.errors import OutboxError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Carry out effects reliably from PostgreSQL.")
app.add_typer(db.app, name="db")
app.add_typer(metrics.app, name="metrics")
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


def _one_line(error: Exception) -> str | None:
    """The error as the line the operator reads, or None for a fault of outbox's own (a traceback)."""
    if isinstance(error, OutboxError | ValueError):
        return str(error)
    database_errors = sys.modules.get("sqlalchemy.exc")  # loaded only by a command that used the database
    if database_errors is not None and isinstance(error, database_errors.OperationalError):
        return f"cannot reach the database: {error.orig}"
    return None


def main() -> None:
    try:
        code = app(standalone_mode=False)  # usage errors come here instead of as typer's boxed report
    except TyperException as error:
        message = error.format_message()
        if message:  # empty after `outbox` alone: typer printed the help
            typer.echo(f"error: {message}", err=True)
        sys.exit(2)
    except Exception as error:
        line = _one_line(error)
        if line is None:
            raise
        typer.echo(f"error: {line}", err=True)
        sys.exit(2)
    if isinstance(code, int) and code:
        sys.exit(code)
