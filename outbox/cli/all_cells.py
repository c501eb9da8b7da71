"""The commands' `--all-cells`: one line per cell of the cells file (`outbox.cells`), a cell's fault its own.

    OUTBOX_CELLS_FILE ─ load_cells ─ every cell's URL read and checked (nothing touched on a fault)
      status --all-cells ─▶ each cell read at once, in threads ─▶ one line per cell in the file's order:
                            its revision, backlog, oldest due, UNCERTAIN (24 h), executors, destinations
                            paused; a cell that cannot be read: its line says why, the others are printed,
                            exit 1
      erase-account --all-cells ─▶ every cell, each in its own transaction: the cell that holds the account
                            erases its actions, the others none; a cell that cannot be reached is named,
                            exit 1 (run it again: erasing twice erases nothing more)
      db upgrade --all-cells ─▶ cell by cell in the file's order; the first that fails stops the rolling
                            upgrade: every cell's revision is printed, exit 1

A cell's URL is never printed; a fault is the one line `outbox.cli.common.database_failure` makes of it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

from outbox.cells import Cells, load_cells
from outbox.cli.common import DatabaseProblem, database_failure, engine
from outbox.cli.options import Database, remember_cell_passwords
from outbox.errors import OutboxError
from outbox.ops import CellSummary

T = TypeVar("T")


@dataclass(frozen=True)
class CellLine:
    cell: str
    revision: str | None
    summary: CellSummary | None
    # why the cell could not be read: one line, never its URL
    fault: str | None


def cell_databases(connect_timeout: int, statement_timeout: float | None) -> tuple[Cells, dict[str, Database]]:
    """Every cell's Database, in the file's order; CellsError before any cell is touched."""
    cells = load_cells()
    urls = cells.urls()
    remember_cell_passwords(urls.values())
    return cells, {name: Database(url, connect_timeout, statement_timeout, name) for name, url in urls.items()}


def fault_line(error: Exception) -> str:
    """A cell's fault as one line, as the commands print a single database's."""
    failure = database_failure(error)
    if failure is not None:
        return failure[1]
    if isinstance(error, OutboxError):
        return str(error)
    raise error


def _guarded(read: Callable[[], T]) -> tuple[T | None, str | None]:
    try:
        return read(), None
    except (DBAPIError, OutboxError, OSError) as error:
        return None, fault_line(error)


def summaries(connect_timeout: int, statement_timeout: float | None) -> list[CellLine]:
    """Each cell's line, read side by side: a cell that does not answer costs the others nothing."""
    cells, databases = cell_databases(connect_timeout, statement_timeout)
    with ThreadPoolExecutor(max_workers=len(cells)) as pool:
        lines = list(pool.map(lambda name: _line(name, databases[name]), cells.names))
    return lines


def _line(name: str, db: Database) -> CellLine:
    from sqlalchemy.pool import NullPool

    from outbox import migrate, ops
    from outbox.cli.common import require_schema

    def read() -> tuple[str | None, CellSummary]:
        reading = engine(db, poolclass=NullPool)
        try:
            with reading.connect() as conn:
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                with conn.begin():
                    require_schema(conn)
                    return migrate.current(conn), ops.cell_summary(conn)
        finally:
            reading.dispose()

    found, fault = _guarded(read)
    if found is None:
        return CellLine(name, None, None, fault)
    return CellLine(name, found[0], found[1], None)


@dataclass(frozen=True)
class ErasureLine:
    cell: str
    erased: int | None
    fault: str | None


def erase_everywhere(account_id: int, connect_timeout: int, statement_timeout: float | None) -> list[ErasureLine]:
    """Erase the account's actions in every cell, side by side; a cell's fault is its own line."""
    import outbox
    from outbox.cli.common import connect

    cells, databases = cell_databases(connect_timeout, statement_timeout)

    def erase(name: str) -> ErasureLine:
        def run() -> int:
            with connect(databases[name]) as conn:
                return outbox.erase_account(conn, account_id)

        erased, fault = _guarded(run)
        return ErasureLine(name, erased, fault)

    with ThreadPoolExecutor(max_workers=len(cells)) as pool:
        return list(pool.map(erase, cells.names))


@dataclass(frozen=True)
class UpgradeLine:
    cell: str
    before: str | None
    after: str | None
    # the upgrade's fault, or why the revision could not be read; None when the cell was not reached
    fault: str | None
    upgraded: bool


def upgrade_all(revision: str, connect_timeout: int, statement_timeout: float | None) -> list[UpgradeLine]:
    """Upgrade the cells one by one in the file's order to `revision`, stopping at the first that fails; then
    each cell not upgraded is read for its revision, so the lines say which cell is on which."""
    cells, databases = cell_databases(connect_timeout, statement_timeout)
    lines: list[UpgradeLine] = []
    failed = False
    for name in cells.names:
        db = databases[name]
        if failed:
            now, fault = _guarded(partial(_revision, db))
            lines.append(UpgradeLine(name, now, now, fault, upgraded=False))
            continue
        before, fault = _guarded(partial(_revision, db))
        if fault is None:
            after, fault = _guarded(partial(_upgrade, db, revision))
        else:
            after = None
        failed = fault is not None
        lines.append(UpgradeLine(name, before, after if not failed else before, fault, upgraded=not failed))
    return lines


def _revision(db: Database) -> str | None:
    from outbox import migrate

    reading = engine(db)
    try:
        with reading.connect() as conn:
            return migrate.current(conn)
    finally:
        reading.dispose()


def _upgrade(db: Database, revision: str) -> str | None:
    from outbox import migrate

    migrating = engine(db)
    try:
        with migrating.begin() as conn:
            migrate.upgrade(conn, revision)
            return migrate.current(conn)
    finally:
        migrating.dispose()


class CellsFailed(DatabaseProblem):
    """Some cells could not be read or upgraded; their lines say which and why."""
