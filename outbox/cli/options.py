"""The options every command shares, and the rule that a command never guesses its database.

This module imports only typer: the `outbox` command builds its help from the command signatures alone,
and each command loads the database layer, Alembic or the executor in its own body, when it runs.
"""

from __future__ import annotations

import typer

from outbox.errors import OutboxError

DATABASE_URL_OPTION = typer.Option(
    None,
    "--database-url",
    envvar="OUTBOX_DATABASE_URL",
    show_envvar=True,
    help="URL of the outbox database (postgresql://user:password@host/db).",
)
JSON_OPTION = typer.Option(False, "--json", help="Print JSON for scripts instead of tables.")


class NoDatabase(OutboxError):
    def __init__(self) -> None:
        super().__init__("no database given: pass --database-url or set OUTBOX_DATABASE_URL")


def required(database_url: str | None) -> str:
    """The URL the operator gave; never an embedded or default database."""
    if not database_url or not database_url.strip():
        raise NoDatabase()
    return database_url.strip()
