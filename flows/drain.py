"""outbox-drain: one bounded executor window per flow run.

    scheduled run ──▶ Executor.run(max_seconds, max_actions), woken by NOTIFY in between
                  ──▶ one INFO summary line, a table artifact (outcomes by kind and result, top lanes)

No Prefect task per action: an action is plain Python inside the run, so Prefect's retries and state
records never fight the outbox's own attempts. SIGTERM (a stopped worker, a cancelled run) stops the
executor the outbox way: claimed actions that have not fenced go back to their lanes, fenced ones finish
inside their window. Each run is a fresh subprocess, which is why the metrics live in the database.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact

from outbox.db import async_engine, sync_engine
from outbox.executor import Executor, ExecutorConfig
from outbox.executor.adapter import load_adapters
from outbox.executor.outcomes import Outcomes
from outbox.ops import lanes
from outbox.settings import load_settings


def ship_outbox_logs() -> None:
    """Send the `outbox` loggers (the UNCERTAIN warnings among them) to the run's logs in the Prefect UI."""
    target = logging.getLogger("outbox")
    target.setLevel(logging.INFO)
    for handler in logging.getLogger("prefect.extra").handlers:
        if handler not in target.handlers:
            target.addHandler(handler)


@flow(name="outbox-drain", retries=0, log_prints=False)
async def drain(
    max_seconds: float = 50.0,
    max_actions: int = 10_000,
    concurrency: int = 64,
    adapters: str = "outbox.email:email_adapters",
) -> dict[str, Any]:
    """Carry out actions for at most `max_seconds` or `max_actions` claims, then return a summary."""
    ship_outbox_logs()
    logger = get_run_logger()
    settings = load_settings()
    url = settings.database_url
    if not url:
        raise ValueError("OUTBOX_DATABASE_URL is not set for the drain flow")
    engine = async_engine(url, pool_size=4, max_overflow=4, **settings.engine_timeouts())
    config = ExecutorConfig(concurrency=concurrency, lease_seconds=settings.lease_seconds)
    executor = Executor(engine, load_adapters(adapters)(engine), config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, executor.stop)
    started = loop.time()
    try:
        outcomes = await executor.run(max_actions=max_actions, max_seconds=max_seconds)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await engine.dispose()
    seconds = loop.time() - started
    summary = summarize(outcomes, seconds)
    logger.info(
        "drained %s attempts in %.1f s: %s",
        summary["attempts"],
        seconds,
        ", ".join(f"{k} {v}" for k, v in sorted(summary["by_result"].items())) or "nothing due",
    )
    rows = await asyncio.to_thread(artifact_rows, outcomes, url)
    await acreate_table_artifact(
        table=rows,
        key="outbox-drain-summary",
        description="Attempts by kind and result; the deepest lanes after the run.",
    )
    return summary


def summarize(outcomes: Outcomes, seconds: float) -> dict[str, Any]:
    by_result: dict[str, int] = {}
    for (_, result, _), count in outcomes.attempts.items():
        by_result[result] = by_result.get(result, 0) + count
    return {
        "attempts": outcomes.attempted,
        "ended": outcomes.ended_count,
        "by_result": by_result,
        "uncertain": sum(n for (_, state, _), n in outcomes.ended.items() if state == "UNCERTAIN"),
        "seconds": round(seconds, 3),
    }


def artifact_rows(outcomes: Outcomes, url: str) -> list[dict[str, Any]]:
    """Attempts by kind, result and recorded; then the ten deepest lanes left after the run."""
    rows: list[dict[str, Any]] = [
        {
            "section": "attempts",
            "kind": kind,
            "result": result,
            "recorded": recorded,
            "count": count,
            "lane": "",
            "head": "",
        }
        for (kind, result, recorded), count in sorted(outcomes.attempts.items())
    ]
    engine = sync_engine(url, pool_size=1, **load_settings().engine_timeouts())
    try:
        with engine.connect() as conn:
            deepest = lanes(conn, 10).deepest
    finally:
        engine.dispose()
    rows += [
        {
            "section": "lane backlog",
            "kind": "",
            "result": "",
            "recorded": "",
            "count": lane.depth,
            "lane": lane.lane_key,
            "head": f"{lane.head_id} {lane.head_state}",
        }
        for lane in deepest
    ]
    return rows
