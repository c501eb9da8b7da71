"""`outbox db upgrade|downgrade|current|check`: the outbox schema, next to an application's own migrations.

outbox keeps its revision in `outbox_alembic_version`, so these commands never read or change an
application's `alembic_version`. `upgrade --sql` renders the DDL for a DBA without touching a database;
`check` exits 1 while the schema is behind, for a deploy pipeline.
"""

from __future__ import annotations

import typer

from outbox.cli.options import DATABASE_URL_OPTION, required

app = typer.Typer(no_args_is_help=True, help="Migrate the outbox schema (its own version table).")


def _stderr(message: str) -> None:
    typer.echo(message, err=True)


@app.command()
def upgrade(
    revision: str = typer.Argument("head", help="Target revision; with --sql also FROM:TO."),
    sql: bool = typer.Option(False, "--sql", help="Print the SQL for a DBA to apply; connect to no database."),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Create or update the outbox tables, constraints and triggers (one transaction)."""
    from outbox import migrate

    if sql:
        typer.echo(migrate.upgrade_sql(revision), nl=False)
        return
    from outbox.db import sync_engine

    engine = sync_engine(required(database_url))
    try:
        with engine.begin() as conn:
            migrate.upgrade(conn, revision)
            now = migrate.current(conn)
    finally:
        engine.dispose()
    _stderr(f"outbox schema at revision {now}")


@app.command()
def downgrade(
    revision: str = typer.Argument("base", help="Target revision; base removes everything outbox created."),
    force: bool = typer.Option(False, "--force", help="Go ahead although actions have not ended."),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Remove the outbox schema (down to `revision`); refused while actions have not ended."""
    from outbox import migrate
    from outbox.db import sync_engine

    engine = sync_engine(required(database_url))
    try:
        with engine.begin() as conn:
            migrate.downgrade(conn, revision, force=force)
            now = migrate.current(conn)
    finally:
        engine.dispose()
    _stderr(f"outbox schema at revision {now or 'base (none)'}")


def _revisions(database_url: str | None) -> tuple[str | None, str]:
    from outbox import migrate
    from outbox.db import sync_engine

    engine = sync_engine(required(database_url))
    try:
        with engine.connect() as conn:
            return migrate.current(conn), migrate.head()
    finally:
        engine.dispose()


@app.command()
def current(database_url: str | None = DATABASE_URL_OPTION) -> None:
    """Print the database's outbox revision and whether it is the newest."""
    now, head = _revisions(database_url)
    if now is None:
        typer.echo(f"none (never migrated; the newest is {head})")
    else:
        typer.echo(f"{now} (the newest)" if now == head else f"{now} (behind: the newest is {head})")


@app.command()
def check(database_url: str | None = DATABASE_URL_OPTION) -> None:
    """Exit 0 when the schema is the newest, 1 while it is behind (run `outbox db upgrade`)."""
    now, head = _revisions(database_url)
    if now != head:
        _stderr(f"outbox schema at {now or 'none'}, the newest is {head}: run `outbox db upgrade`")
        raise typer.Exit(1)
    _stderr(f"outbox schema at {now}, the newest")
