"""`outbox run`: one executor process. SIGTERM or SIGINT stops it the way the executor stops."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from outbox.cli.options import (
    MAX_BIGINT,
    MAX_SECONDS,
    Database,
    database_options,
    finite,
    printable,
)
from outbox.defaults import setting_variable
from outbox.executor.config import DEFAULTS
from outbox.limits import MAX_PAGE

# attempts in flight in one executor process; more belongs in more processes
MAX_CONCURRENCY = 10_000
# a claim's lease: more than the 60 s write window, at most a day
MAX_LEASE_SECONDS = 86_400
# how long an executor starting while its database ends every session (a restart, a failover, a pooler
# refusing logins for its server_login_retry of 15 s) asks again before it exits 1
START_ASK_SECONDS = 60.0

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rich.table import Table

    from outbox.executor import ExecutorConfig
    from outbox.executor.adapter import AdapterFactory
    from outbox.executor.outcomes import Outcomes


@database_options()
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
    max_actions: int | None = typer.Option(None, min=1, max=MAX_BIGINT, help="Stop after claiming this many actions."),
    max_seconds: float | None = typer.Option(
        None, min=0, max=MAX_SECONDS, callback=finite, help="Stop claiming after this many seconds."
    ),
    *,
    db: Database,
) -> None:
    """Run one executor until SIGTERM (or a budget), then print what it did."""
    import asyncio

    from outbox.cli.common import err, log_to_stderr, migrated_engine
    from outbox.executor import ExecutorConfig
    from outbox.executor.adapter import load_adapters
    from outbox.executor.config import WRITE_WINDOW_SECONDS
    from outbox.kind_rows import KindsNotDeclared

    if lease_seconds <= WRITE_WINDOW_SECONDS:
        window = f"the {WRITE_WINDOW_SECONDS:g} s write window"
        raise ValueError(f"--lease-seconds must exceed {window}, not {lease_seconds:g}")
    config = ExecutorConfig(
        concurrency=concurrency, claim_batch=claim_batch, lease_seconds=lease_seconds, break_seconds=break_seconds
    )
    factory = load_adapters(adapters)
    log_to_stderr()
    migrated_engine(db, ask_seconds=START_ASK_SECONDS).dispose()
    try:
        outcomes = asyncio.run(_run(db, factory, config, max_actions, max_seconds, listen_database_url))
    except KindsNotDeclared as refused:  # one line per kind, then nothing claimed
        for line in refused.lines:
            typer.echo(f"error: {printable(line)}", err=True)
        raise typer.Exit(1) from None
    err.print(summary_table(outcomes))


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

    from outbox.db import async_engine, shown_database
    from outbox.executor import Executor
    from outbox.executor.config import start_line
    from outbox.kind_rows import require_declared

    engine = async_engine(
        db.url,
        connect_timeout=db.connect_timeout,
        statement_timeout=db.statement_timeout,
        pool_size=4,
        max_overflow=4,
    )
    try:
        adapters = list(factory(engine))
        executor = Executor(engine, adapters, config, listen_url=listen_url)
        await _asking_again(lambda: require_declared(engine, (adapter.kind for adapter in adapters)))
        logging.getLogger("outbox.run").info("%s", start_line(executor.kinds, shown_database(db.url), config))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, executor.stop)
        return await executor.run(max_actions=max_actions, max_seconds=max_seconds)
    finally:
        await engine.dispose()


async def _asking_again(check: Callable[[], Awaitable[None]]) -> None:
    """Run the start-up's check of the kinds, asking again for START_ASK_SECONDS while the database ends
    its sessions (a restart or a terminated backend between the schema check and this one)."""
    import asyncio
    import logging

    from sqlalchemy.exc import DBAPIError

    from outbox.faults import ended_by_the_server

    deadline = asyncio.get_running_loop().time() + START_ASK_SECONDS
    while True:
        try:
            return await check()
        except DBAPIError as error:
            if not ended_by_the_server(error) or asyncio.get_running_loop().time() >= deadline:
                raise
            logging.getLogger("outbox.run").warning("the database ended the session; asking again")
            await asyncio.sleep(0.5)


def summary_table(outcomes: Outcomes) -> Table:
    from rich.table import Table

    table = Table(title="attempts")
    for column in ("kind", "result", "recorded", "count"):
        table.add_column(column)
    for (kind, result, recorded), count in sorted(outcomes.attempts.items()):
        table.add_row(printable(kind), printable(result), str(recorded).lower(), str(count))
    return table
