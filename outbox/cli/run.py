"""`outbox run`: one executor process. SIGTERM or SIGINT stops it the way the executor stops.

outbox run [--cell NAME]  ─▶ one executor on one database (a cell's: its start line names the cell)
outbox run --all-cells    ─▶ every cell of the cells file (outbox.cells), each URL read and checked first
    one event loop, per cell: its own engine, adapters (the factory called with that engine) and executor
    (concurrency as given, per cell), side by side
    a cell's database down or not ready (no schema, a kind not declared) at start ─▶ that cell asks again
        every CELL_ASK_SECONDS, one warning per new reason, until it answers or the process stops; later
        outages are the executor's own (it rides them out, as a single executor does a restart)
    every log line of a cell's executor begins `cell NAME:`
    SIGTERM or SIGINT ─▶ every executor stops the outbox way ─▶ one summary table, a row per cell
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import TYPE_CHECKING

import typer

from outbox._internal.config.defaults import setting_variable
from outbox._internal.config.limits import MAX_PAGE
from outbox.cli.options import (
    MAX_BIGINT,
    MAX_SECONDS,
    AllCells,
    Database,
    database_options,
    finite,
    printable,
)
from outbox.executor.config import DEFAULTS

# attempts in flight in one executor process; more belongs in more processes
MAX_CONCURRENCY = 10_000
# a claim's lease: more than the 60 s write window, at most a day
MAX_LEASE_SECONDS = 86_400
# how often a cell of `--all-cells` whose database is not ready asks again
CELL_ASK_SECONDS = 2.0
# how long an executor starting while its database ends every session (a restart, a failover, a pooler
# refusing logins for its server_login_retry of 15 s) asks again before it exits 1
START_ASK_SECONDS = 60.0

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Callable

    from rich.table import Table
    from sqlalchemy.ext.asyncio import AsyncEngine

    from outbox.executor import Executor, ExecutorConfig
    from outbox.executor.adapter import ActionAdapter, AdapterFactory
    from outbox.executor.outcomes import Outcomes


@database_options(all_cells=True)
def run(
    adapters: str = typer.Option(
        "outbox.email:email_adapters",
        help="module:factory(engine) returning the adapters, one per kind; the module registers your kinds"
        " and email notices.",
    ),
    concurrency: int = typer.Option(
        DEFAULTS.concurrency, min=1, max=MAX_CONCURRENCY, help="Attempts in flight at once."
    ),
    claim_batch: int | None = typer.Option(
        DEFAULTS.claim_batch,
        min=1,
        max=MAX_PAGE,
        help="The most lane heads one claim takes (default: as many as --concurrency). A claim takes as many"
        " as there are free slots: few when busy or idle, many under a burst.",
    ),
    lease_seconds: float = typer.Option(
        DEFAULTS.lease_seconds,
        min=0,
        max=MAX_LEASE_SECONDS,
        callback=finite,
        help="A claim's lease in seconds (more than the 60 s write window).",
    ),
    break_seconds: float = typer.Option(
        DEFAULTS.break_seconds,
        min=1,
        max=MAX_LEASE_SECONDS,
        callback=finite,
        help="A destination whose attempts all failed or were asked to slow down this many seconds, none"
        " accepted, is broken: one probe every 15 s until one succeeds.",
    ),
    listen_database_url: str | None = typer.Option(
        None,
        envvar=setting_variable("listen_database_url"),
        show_envvar=True,
        help="URL to LISTEN on for new actions when --database-url goes through a pooler in transaction mode:"
        " a direct connection, or the pooler in session mode (unset there: poll every second).",
    ),
    max_actions: int | None = typer.Option(
        None, min=1, max=MAX_BIGINT, help="Stop after claiming this many actions (with --all-cells: per cell)."
    ),
    max_seconds: float | None = typer.Option(
        None, min=0, max=MAX_SECONDS, callback=finite, help="Stop claiming after this many seconds."
    ),
    *,
    db: Database | AllCells,
) -> None:
    """Run one executor until SIGTERM (or a budget), then print what it did.

    With --all-cells, one executor per cell of the cells file in this one process, each with --concurrency of
    its own."""
    import asyncio

    from outbox._internal.checks.kind_rows import KindsNotDeclared
    from outbox.cli.common import err, log_to_stderr, migrated_engine
    from outbox.executor import ExecutorConfig
    from outbox.executor.adapter import load_adapters
    from outbox.executor.config import WRITE_WINDOW_SECONDS

    if lease_seconds <= WRITE_WINDOW_SECONDS:
        window = f"the {WRITE_WINDOW_SECONDS:g} s write window"
        raise ValueError(f"--lease-seconds must exceed {window}, not {lease_seconds:g}")
    config = ExecutorConfig(
        concurrency=concurrency, claim_batch=claim_batch, lease_seconds=lease_seconds, break_seconds=break_seconds
    )
    factory = load_adapters(adapters)
    if not isinstance(db, Database):
        if listen_database_url:
            raise ValueError(
                "--listen-database-url names one database: with --all-cells each executor listens on its own"
                " cell's URL (a cell behind a pooler in transaction mode polls)"
            )
        from outbox.cli.all_cells import cell_databases

        _, databases = cell_databases(db.connect_timeout, db.statement_timeout)
        log_to_stderr()
        each = asyncio.run(_run_cells(databases, factory, config, max_actions, max_seconds))
        err.print(summary_table(*each.items()))
        return
    log_to_stderr()
    migrated_engine(db, ask_seconds=START_ASK_SECONDS).dispose()
    try:
        outcomes = asyncio.run(_run(db, factory, config, max_actions, max_seconds, listen_database_url))
    except KindsNotDeclared as refused:  # one line per kind, then nothing claimed
        for line in refused.lines:
            typer.echo(f"error: {printable(line)}", err=True)
        raise typer.Exit(1) from None
    err.print(summary_table((db.cell, outcomes)))


async def _run(
    db: Database,
    factory: AdapterFactory,
    config: ExecutorConfig,
    max_actions: int | None,
    max_seconds: float | None,
    listen_url: str | None,
) -> Outcomes:
    import asyncio
    import logging
    import signal

    from outbox._internal.checks.kind_rows import require_declared
    from outbox._internal.connections.engines import async_engine, shown_database
    from outbox.executor import Executor
    from outbox.executor.adapter import close_adapters
    from outbox.executor.config import ENGINE_POOL_SIZE, start_line

    engine = async_engine(
        db.url,
        connect_timeout=db.connect_timeout,
        statement_timeout=db.statement_timeout,
        pool_size=ENGINE_POOL_SIZE,
        max_overflow=0,
    )
    adapters: list[ActionAdapter] = []
    try:
        adapters = list(factory(engine))
        executor = Executor(engine, adapters, config, listen_url=listen_url)
        # before the start line: a supervisor that stops the process once it has said it runs gets a clean stop
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, executor.stop)
        await _asking_again(lambda: require_declared(engine, (adapter.kind for adapter in adapters)))
        line = start_line(executor.kinds, shown_database(db.url), config)
        logging.getLogger("outbox.run").info("%s%s", f"cell {db.cell}: " if db.cell else "", line)
        return await executor.run(max_actions=max_actions, max_seconds=max_seconds)
    finally:
        await close_adapters(adapters)
        await engine.dispose()


async def _asking_again(check: Callable[[], Awaitable[None]]) -> None:
    """Run the start-up's check of the kinds, asking again for START_ASK_SECONDS while the database ends
    its sessions (a restart or a terminated backend between the schema check and this one)."""
    import asyncio
    import logging

    from sqlalchemy.exc import DBAPIError

    from outbox._internal.connections.faults import ended_by_the_server

    deadline = asyncio.get_running_loop().time() + START_ASK_SECONDS
    while True:
        try:
            return await check()
        except DBAPIError as error:
            if not ended_by_the_server(error) or asyncio.get_running_loop().time() >= deadline:
                raise
            logging.getLogger("outbox.run").warning("the database ended the session; asking again")
            await asyncio.sleep(0.5)


async def _run_cells(
    databases: dict[str, Database],
    factory: AdapterFactory,
    config: ExecutorConfig,
    max_actions: int | None,
    max_seconds: float | None,
) -> dict[str, Outcomes]:
    """One executor per cell, side by side in this loop, until SIGTERM or SIGINT (or each one's budget)."""
    import asyncio
    import logging
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_name_the_cell)
    deadline = None if max_seconds is None else loop.time() + max_seconds
    served = [_serve_cell(name, db, factory, config, max_actions, deadline, stop) for name, db in databases.items()]
    return dict(zip(databases, await asyncio.gather(*served), strict=True))


async def _serve_cell(
    name: str,
    db: Database,
    factory: AdapterFactory,
    config: ExecutorConfig,
    max_actions: int | None,
    deadline: float | None,
    stop: asyncio.Event,
) -> Outcomes:
    """Cell `name`'s executor: once its database is ready, until `stop` is set or its budget is spent. Its
    task (and every task it starts) names the cell in its log lines."""
    import asyncio
    import contextlib
    import logging

    from outbox._internal.connections.engines import async_engine, shown_database
    from outbox.executor import Executor
    from outbox.executor.adapter import close_adapters
    from outbox.executor.config import ENGINE_POOL_SIZE, start_line

    _CELL.set(name)
    engine = async_engine(
        db.url,
        connect_timeout=db.connect_timeout,
        statement_timeout=db.statement_timeout,
        pool_size=ENGINE_POOL_SIZE,
        max_overflow=0,
    )
    adapters: list[ActionAdapter] = []
    try:
        adapters = list(factory(engine))
        executor = Executor(engine, adapters, config)
        if not await _until_ready(engine, adapters, stop, deadline):
            return executor.outcomes
        logging.getLogger("outbox.run").info("%s", start_line(executor.kinds, shown_database(db.url), config))
        loop = asyncio.get_running_loop()
        left = None if deadline is None else max(0.0, deadline - loop.time())
        stopping = asyncio.create_task(_stop_when(stop, executor))
        try:
            return await executor.run(max_actions=max_actions, max_seconds=left)
        finally:
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
    finally:
        await close_adapters(adapters)
        await engine.dispose()


async def _stop_when(stop: asyncio.Event, executor: Executor) -> None:
    await stop.wait()
    executor.stop()


async def _until_ready(
    engine: AsyncEngine, adapters: list[ActionAdapter], stop: asyncio.Event, deadline: float | None
) -> bool:
    """Wait until the cell's database holds the schema and declares the adapters' kinds, asking again every
    CELL_ASK_SECONDS (one warning per new reason); False when stopped (or out of time) before."""
    import asyncio
    import contextlib
    import logging

    from sqlalchemy.exc import DBAPIError

    from outbox._internal.checks.kind_rows import KindsNotDeclared, require_declared
    from outbox.cli.all_cells import fault_line
    from outbox.cli.common import require_schema
    from outbox.errors import OutboxError
    from outbox.executor.store import CALL_SECONDS

    async def check() -> None:
        async with engine.connect() as conn:
            await conn.run_sync(require_schema)
        await require_declared(engine, (adapter.kind for adapter in adapters))

    said = None
    loop = asyncio.get_running_loop()
    while not stop.is_set() and (deadline is None or loop.time() < deadline):
        try:
            # bounded on this side too: a connection whose server stopped answering (a network that drops
            # what it carries) would otherwise hold this cell, and the process's stop, for ever
            await asyncio.wait_for(check(), CALL_SECONDS)
            return True
        except TimeoutError:
            reason = f"the database did not answer within {CALL_SECONDS:g} s"
        except KindsNotDeclared as refused:
            reason = "; ".join(refused.lines)
        except (DBAPIError, OutboxError, OSError) as error:
            reason = fault_line(error)
        if reason != said:
            logging.getLogger("outbox.run").warning(
                "not ready (%s): asking again every %g s, the other cells drain meanwhile", reason, CELL_ASK_SECONDS
            )
            said = reason
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CELL_ASK_SECONDS)
    return False


# the cell whose executor the running task serves (`--all-cells`): its log lines name it
_CELL: ContextVar[str | None] = ContextVar("outbox_run_cell", default=None)


def _name_the_cell(record: logging.LogRecord) -> bool:
    """A logging filter: a record made in a cell's task begins `cell NAME: ` (once)."""
    cell = _CELL.get()
    if cell is not None and not getattr(record, "outbox_cell", None):
        record.outbox_cell = cell
        record.msg = f"cell {cell}: {record.msg}"
    return True


def summary_table(*runs: tuple[str | None, Outcomes]) -> Table:
    """The attempts of each executor by kind, result and recorded; a cell column when a cell was named."""
    from rich.table import Table

    table = Table(title="attempts")
    cells = any(cell is not None for cell, _ in runs)
    for column in ("cell",) * cells + ("kind", "result", "recorded", "count"):
        table.add_column(column)
    for cell, outcomes in runs:
        for (kind, result, recorded), count in sorted(outcomes.attempts.items()):
            row = (printable(kind), printable(result), str(recorded).lower(), str(count))
            table.add_row(*((cell or "",) * cells + row))
        if cells and not outcomes.attempts:  # every cell has its line, one that attempted nothing too
            table.add_row(cell or "", "-", "-", "-", "0")
    return table
