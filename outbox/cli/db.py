"""`outbox db upgrade|downgrade`: migrate the database at OUTBOX_DATABASE_URL."""

from __future__ import annotations

import typer
from rich.console import Console

from outbox import migrate
from outbox.cli.database import database_url
from outbox.db import sync_engine

app = typer.Typer(no_args_is_help=True, help="Migrate the outbox schema.")
console = Console(stderr=True)


@app.command()
def upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Create or update the outbox tables, constraints and triggers."""
    engine = sync_engine(database_url(console))
    with engine.begin() as conn:
        migrate.upgrade(conn, revision)
    engine.dispose()
    console.print(f"database at revision {revision}")


@app.command()
def downgrade(
    revision: str = typer.Argument("base", help="Target revision; base removes everything."),
) -> None:
    """Remove the outbox schema (down to `revision`)."""
    engine = sync_engine(database_url(console))
    with engine.begin() as conn:
        migrate.downgrade(conn, revision)
    engine.dispose()
    console.print(f"database at revision {revision}")
