"""`outbox run`: one executor process. SIGTERM or SIGINT stops it the way the executor stops."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from collections.abc import Callable, Iterable

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.cli.database import database_url
from outbox.db import async_engine
from outbox.executor import ActionAdapter, Executor, ExecutorConfig
from outbox.executor.outcomes import Outcomes

console = Console(stderr=True)


AdapterFactory = Callable[[AsyncEngine], Iterable[ActionAdapter]]


def load_adapters(spec: str) -> AdapterFactory:
    """`module:factory`, where factory(engine) returns the adapters, one per kind."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--adapters must look like module:factory, not {spec!r}")
    try:
        factory: AdapterFactory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--adapters {spec}: {error}") from None
    return factory


def run(
    adapters: str = typer.Option(
        "outbox.email:email_adapters", help="module:factory(engine) returning the adapters, one per kind."
    ),
    concurrency: int = typer.Option(64, min=1, help="Attempts in flight at once."),
    claim_batch: int = typer.Option(50, min=1, help="Lane heads claimed per round trip."),
    lease_seconds: float = typer.Option(300.0, help="A claim's lease (more than the 60 s write window)."),
    max_actions: int | None = typer.Option(None, min=1, help="Stop after claiming this many actions."),
    max_seconds: float | None = typer.Option(None, min=0, help="Stop claiming after this many seconds."),
) -> None:
    """Run one executor until SIGTERM (or a budget), then print what it did."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = ExecutorConfig(concurrency=concurrency, claim_batch=claim_batch, lease_seconds=lease_seconds)
    factory = load_adapters(adapters)
    url = database_url(console)
    outcomes = asyncio.run(_run(url, factory, config, max_actions, max_seconds))
    console.print(summary_table(outcomes))


async def _run(
    url: str, factory: AdapterFactory, config: ExecutorConfig, max_actions: int | None, max_seconds: float | None
) -> Outcomes:
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
    table = Table(title="attempts")
    for column in ("kind", "result", "recorded", "count"):
        table.add_column(column)
    for (kind, result, recorded), count in sorted(outcomes.attempts.items()):
        table.add_row(kind, result, str(recorded).lower(), str(count))
    return table
