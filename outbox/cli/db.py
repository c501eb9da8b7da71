"""`outbox db upgrade|downgrade|current|check`: the outbox schema, next to an application's own migrations.

outbox keeps its revision in `outbox_alembic_version`, so these commands never read or change an
application's `alembic_version`. `upgrade --sql` renders the DDL for a DBA without touching a database;
`check` exits 1 while the schema is behind, for a deploy pipeline. `upgrade` and `downgrade` set no
statement timeout unless given one: an index build on a large table takes its time, and a second upgrade
waits for the first on purpose.
"""

from __future__ import annotations

import re

import typer

from outbox.cli.options import (
    MIGRATION_STATEMENT_TIMEOUT_OPTION,
    AllCells,
    Database,
    NoDatabase,
    database_options,
    printable,
)

app = typer.Typer(no_args_is_help=True, help="Migrate the outbox schema (its own version table).")


def _stderr(message: str) -> None:
    typer.echo(message, err=True)


# a revision id, head or base, optionally relative (head-1, +2, -1)
_REVISION = re.compile(r"[A-Za-z0-9_]+(?:[+-][0-9]+)?|[+-][0-9]+")


def _revision(value: str, *, span: bool = False) -> str:
    """A revision as written (head, base, 0002, -1), or with `span` FROM:TO."""
    parts = [part.strip() for part in value.split(":")] if span else [value.strip()]
    if len(parts) > 2 or not all(_REVISION.fullmatch(part) for part in parts):
        wanted = "a revision (head, base, 0002, -1) or FROM:TO" if span else "a revision (head, base, 0002, -1)"
        raise ValueError(f"REVISION: {value!r} is not {wanted}")
    return ":".join(parts)


@app.command()
@database_options(statement_timeout=MIGRATION_STATEMENT_TIMEOUT_OPTION, optional=True, all_cells=True)
def upgrade(
    revision: str = typer.Argument("head", help="Target revision; with --sql also FROM:TO."),
    sql: bool = typer.Option(False, "--sql", help="Print the SQL for a DBA to apply; connect to no database."),
    *,
    db: Database | AllCells | None,
) -> None:
    """Create or update the outbox tables, constraints and triggers (one transaction). With --all-cells: cell
    by cell in the cells file's order, stopping at the first that fails."""
    if sql:
        from outbox import migrate

        typer.echo(migrate.upgrade_sql(_revision(revision, span=True)), nl=False)
        return
    if db is None:
        raise NoDatabase()
    revision = _revision(revision)
    if isinstance(db, AllCells):
        return _upgrade_all_cells(db, revision)
    from outbox import migrate
    from outbox.cli.common import engine

    migrating = engine(db)
    try:
        with migrating.begin() as conn:
            migrate.upgrade(conn, revision)
            now = migrate.current(conn)
    finally:
        migrating.dispose()
    _stderr(f"outbox schema at revision {printable(now)}")


def _upgrade_all_cells(cells: AllCells, revision: str) -> None:
    """One line per cell: upgraded (to, from), failed (why), or not reached (its revision); exit 1 on a
    failure, after the lines."""
    from outbox.cli.all_cells import CellsFailed, upgrade_all

    lines = upgrade_all(revision, cells.connect_timeout, cells.statement_timeout)
    failed = next((line for line in lines if line.fault is not None), None)
    for line in lines:
        before, after = printable(line.before or "none"), printable(line.after or "none")
        if line.upgraded:
            _stderr(f"cell {line.cell}: outbox schema at revision {after} (was {before})")
        elif line is failed:
            _stderr(f"cell {line.cell}: the upgrade failed at revision {before}: {printable(line.fault)}")
        elif line.fault is not None:
            _stderr(f"cell {line.cell}: not upgraded; its revision cannot be read: {printable(line.fault)}")
        else:
            _stderr(f"cell {line.cell}: not upgraded, at revision {after}")
    if failed is not None:
        raise CellsFailed(f"the upgrade stopped at cell {failed.cell}; the cells after it were not upgraded")


@app.command()
@database_options(statement_timeout=MIGRATION_STATEMENT_TIMEOUT_OPTION)
def downgrade(
    revision: str = typer.Argument("base", help="Target revision; base removes everything outbox created."),
    force: bool = typer.Option(False, "--force", help="Go ahead although actions have not ended."),
    *,
    db: Database,
) -> None:
    """Remove the outbox schema (down to `revision`); refused while actions have not ended."""
    from outbox import migrate
    from outbox.cli.common import engine

    revision = _revision(revision)
    migrating = engine(db)
    try:
        with migrating.begin() as conn:
            if revision != "base" or migrate.current(conn) is not None:  # never migrated: at base already
                migrate.downgrade(conn, revision, force=force)
            now = migrate.current(conn)
    finally:
        migrating.dispose()
    _stderr(f"outbox schema at revision {printable(now or 'base (none)')}")


def _revisions(db: Database) -> tuple[str | None, str]:
    from outbox import migrate
    from outbox.cli.common import engine

    reading = engine(db)
    try:
        with reading.connect() as conn:
            return migrate.current(conn), migrate.head()
    finally:
        reading.dispose()


@app.command()
@database_options()
def current(
    *,
    db: Database,
) -> None:
    """Print the database's outbox revision and whether it is the newest."""
    now, head = _revisions(db)
    if now is None:
        typer.echo(f"none (never migrated; the newest is {head})")
    else:
        shown = printable(now)
        typer.echo(f"{shown} (the newest)" if now == head else f"{shown} (behind: the newest is {head})")


@app.command()
@database_options()
def check(
    *,
    db: Database,
) -> None:
    """Exit 0 when the schema is the newest, 1 while it is behind (run `outbox db upgrade`)."""
    now, head = _revisions(db)
    if now != head:
        _stderr(f"outbox schema at {printable(now or 'none')}, the newest is {head}: run `outbox db upgrade`")
        raise typer.Exit(1)
    _stderr(f"outbox schema at {printable(now)}, the newest")
