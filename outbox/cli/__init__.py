"""The `outbox` command: one typer app, one module per command group.

`main` turns every error outbox raises on purpose, every usage error (a bad option, a missing argument)
and a database that cannot be reached into one line on stderr and exit code 2, so scripts see a clear
failure and no traceback.
"""

from __future__ import annotations

import sys

import typer
from sqlalchemy.exc import OperationalError
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


def main() -> None:
    try:
        code = app(standalone_mode=False)  # usage errors come here instead of as typer's boxed report
    except TyperException as error:
        message = error.format_message()
        if message:  # empty after `outbox` alone: typer printed the help
            typer.echo(f"error: {message}", err=True)
        sys.exit(2)
    except (OutboxError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
    except OperationalError as error:
        typer.echo(f"error: cannot reach the database: {error.orig}", err=True)
        sys.exit(2)
    if isinstance(code, int) and code:
        sys.exit(code)
