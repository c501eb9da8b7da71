"""The `outbox` command: one typer app, one module per command group.

`main` turns every error outbox raises on purpose (and a database that cannot be reached) into one
line on stderr and exit code 2, so scripts see a clear failure and no traceback.
"""

from __future__ import annotations

import sys

import typer
from sqlalchemy.exc import OperationalError

from outbox.cli import db, demo, run
from outbox.errors import OutboxError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Carry out effects reliably from PostgreSQL.")
app.add_typer(db.app, name="db")
app.command("demo")(demo.demo)
app.command("run")(run.run)


def main() -> None:
    try:
        app()  # typer reports usage errors itself, with exit code 2
    except (OutboxError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
    except OperationalError as error:
        typer.echo(f"error: cannot reach the database: {error.orig}", err=True)
        sys.exit(2)
