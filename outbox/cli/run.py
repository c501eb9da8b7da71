"""`outbox run`: one executor process. SIGTERM or SIGINT stops it the way the executor stops."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from outbox.cli.options import DATABASE_URL_OPTION, required

if TYPE_CHECKING:
    from rich.table import Table

    from outbox.executor import ExecutorConfig
    from outbox.executor.adapter import AdapterFactory
    from outbox.executor.outcomes import Outcomes


def run(
    adapters: str = typer.Option(
        "outbox.email:email_adapters",
        help="module:factory(engine) returning the adapters, one per kind; the module registers your kinds"
        " and email notices.",
    ),
    concurrency: int = typer.Option(64, min=1, help="Attempts in flight at once."),
    claim_batch: int = typer.Option(50, min=1, help="Lane heads claimed per round trip."),
    lease_seconds: float = typer.Option(300.0, help="A claim's lease (more than the 60 s write window)."),
    max_actions: int | None = typer.Option(None, min=1, help="Stop after claiming this many actions."),
    max_seconds: float | None = typer.Option(None, min=0, help="Stop claiming after this many seconds."),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Run one executor until SIGTERM (or a budget), then print what it did."""
    import asyncio
    import logging

    from outbox.cli.common import err, migrated_engine
    from outbox.executor import ExecutorConfig
    from outbox.executor.adapter import load_adapters

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = ExecutorConfig(concurrency=concurrency, claim_batch=claim_batch, lease_seconds=lease_seconds)
    factory = load_adapters(adapters)
    url = required(database_url)
    migrated_engine(url).dispose()
    outcomes = asyncio.run(_run(url, factory, config, max_actions, max_seconds))
    err.print(summary_table(outcomes))


async def _run(
    url: str, factory: AdapterFactory, config: ExecutorConfig, max_actions: int | None, max_seconds: float | None
) -> Outcomes:
    import asyncio
    import signal

    from outbox.db import async_engine
    from outbox.executor import Executor

    engine = async_engine(url, pool_size=4, max_overflow=4)
    executor = Executor(engine, factory(engine), config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, executor.stop)
    try:
        return await executor.run(max_actions=max_actions, max_seconds=max_seconds)
    finally:
        await engine.dispose()


def summary_table(outcomes: Outcomes) -> Table:
    from rich.table import Table

    table = Table(title="attempts")
    for column in ("kind", "result", "recorded", "count"):
        table.add_column(column)
    for (kind, result, recorded), count in sorted(outcomes.attempts.items()):
        table.add_row(kind, result, str(recorded).lower(), str(count))
    return table
