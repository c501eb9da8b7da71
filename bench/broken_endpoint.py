"""A webhook endpoint down for ten minutes: the attempts spent on it, with the breaker and without.

    python -m bench.broken_endpoint [--outage-minutes 10] [--rate 2] [--no-breaker]

    two executors (outbox.executor.Executor, one process, a WebhookAdapter each, ExecutorConfig's defaults:
    broken after 120 s of failures with nothing accepted, then one probe every 15 s; --no-breaker: never
    broken)
    ──▶ the endpoint: a receiver (demo.receiver) that answers 500 to everything during the outage
    the application enqueues `--rate` webhooks a second, one lane each: for one healthy minute, through the
    outage, and stops when the endpoint is back
    ─▶ one Markdown row: attempts during the outage (before the break, then while broken: the probes), the
       webhooks enqueued meanwhile, the seconds to break and to mend, and the drain after the return (the
       webhooks never attempted; those whose retry the outage pushed back are then made due, as an operator
       would, and drained too): every webhook DONE with one effect at the receiver

The server is OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL (bench.harness).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from bench.harness import fresh_database, server_url
from demo.receiver import Receiver
from outbox.db import async_engine
from outbox.executor import Executor, ExecutorConfig
from outbox.webhook import WebhookAdapter, enqueue_webhook, register_endpoint, register_webhook_event
from tests.webhook_events import NumberedHook

SECRET = "whsec_" + base64.b64encode(b"b" * 32).decode()
HEALTHY_SECONDS = 60.0
# the longest the endpoint may take to mend, and the webhooks to end, after the return
DRAIN_SECONDS = 600.0


class Pinged(NumberedHook):
    name = "bench.pinged"
    endpoint = "down"


PINGED = Pinged()


@dataclass
class Figures:
    outage_seconds: float = 0.0
    enqueued_in_outage: int = 0
    attempts_in_outage: int = 0
    attempts_before_break: int = 0
    break_after: float | None = None  # seconds from the outage's start
    mend_after: float | None = None  # seconds from the return
    never_attempted_drained_after: float | None = None  # seconds from the return
    pushed_back: int = 0  # webhooks whose next retry was past the return: made due
    all_done_after: float = 0.0  # seconds from the return, the pushed-back ones included
    enqueued: int = 0
    effects: int = 0
    deliveries_max: int = 0
    failed: int = 0


def load_average() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def scalar(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


async def run(url: str, engine: Engine, outage_seconds: float, rate: float, breaker: bool) -> Figures:
    receiver = Receiver(SECRET).start()
    register_endpoint("down", receiver.url, secret=SECRET)
    register_webhook_event(PINGED)
    aengine = async_engine(url)
    config = ExecutorConfig() if breaker else ExecutorConfig(break_seconds=1e9)
    adapters = [WebhookAdapter(aengine) for _ in range(2)]
    executors = [Executor(aengine, [adapter], config) for adapter in adapters]
    tasks = [asyncio.create_task(executor.run()) for executor in executors]
    figures = Figures()
    loop = asyncio.get_running_loop()

    def attempts() -> int:
        return sum(sum(executor.outcomes.attempts.values()) for executor in executors)

    async def enqueue_for(seconds: float, watch: bool = False) -> None:
        end = loop.time() + seconds
        started = loop.time()
        while loop.time() < end:
            with engine.begin() as conn:
                enqueue_webhook(conn, PINGED, {"n": figures.enqueued})
            figures.enqueued += 1
            if watch and figures.break_after is None and scalar(engine, BROKEN):
                figures.break_after = loop.time() - started
                figures.attempts_before_break = attempts() - before
            await asyncio.sleep(1 / rate)  # the application's pace

    try:
        await enqueue_for(HEALTHY_SECONDS)
        receiver.refusing = "500"
        started, before, enqueued_before = loop.time(), attempts(), figures.enqueued
        print(f"outage: {outage_seconds:.0f} s from now ({load_average()})", file=sys.stderr, flush=True)
        await enqueue_for(outage_seconds, watch=True)
        figures.outage_seconds = loop.time() - started
        figures.attempts_in_outage = attempts() - before
        figures.enqueued_in_outage = figures.enqueued - enqueued_before
        receiver.refusing = None
        returned = loop.time()
        print(f"back: {figures.attempts_in_outage} attempts in the outage", file=sys.stderr, flush=True)
        await until_none(engine, BROKEN)
        figures.mend_after = loop.time() - returned if figures.break_after is not None else None
        await until_none(engine, NEVER_ATTEMPTED_LEFT)
        figures.never_attempted_drained_after = loop.time() - returned
        with engine.begin() as conn:
            figures.pushed_back = conn.execute(text(PUSHED_BACK)).rowcount
        await until_none(engine, "SELECT count(*) FROM agent_action WHERE ended_at IS NULL")
        figures.all_done_after = loop.time() - returned
    finally:
        for executor in executors:
            executor.stop()
        await asyncio.gather(*tasks)
        for adapter in adapters:
            await adapter.aclose()
        await aengine.dispose()
        receiver.stop()
    deliveries = receiver.deliveries()
    figures.effects, figures.deliveries_max = len(deliveries), max(deliveries.values(), default=0)
    figures.failed = int(scalar(engine, "SELECT count(*) FROM agent_action WHERE state <> 'DONE'"))
    return figures


async def until_none(engine: Engine, count: str) -> None:
    """Poll the count `count` every 50 ms until it is 0; RuntimeError after DRAIN_SECONDS."""
    deadline = asyncio.get_running_loop().time() + DRAIN_SECONDS
    while scalar(engine, count):
        if asyncio.get_running_loop().time() > deadline:
            with engine.connect() as conn:
                left = conn.execute(text(LEFT)).all()
            raise RuntimeError(f"still not 0 after {DRAIN_SECONDS:.0f} s: {count}; left: {left}")
        await asyncio.sleep(0.05)


LEFT = """
SELECT state, attempt, epoch, count(*), min(due_at - now()), max(last_error) FROM agent_action
 WHERE ended_at IS NULL GROUP BY 1, 2, 3
"""
BROKEN = "SELECT count(*) FROM agent_destination WHERE broken_since IS NOT NULL"
NEVER_ATTEMPTED_LEFT = "SELECT count(*) FROM agent_action WHERE ended_at IS NULL AND epoch = 0"
PUSHED_BACK = "UPDATE agent_action SET due_at = now() WHERE state = 'ADMITTED' AND due_at > now()"


def row(breaker: bool, figures: Figures) -> str:
    probes = figures.attempts_in_outage - figures.attempts_before_break
    before = figures.attempts_before_break if breaker else "-"
    broke = f"{figures.break_after:.0f} s" if figures.break_after is not None else "never"
    mended = f"{figures.mend_after:.1f} s" if figures.mend_after is not None else "-"
    drained = figures.never_attempted_drained_after or 0.0
    return (
        f"| {'defaults (120 s, 15 s)' if breaker else 'no breaker'} | {figures.outage_seconds:.0f} s"
        f" | {figures.enqueued_in_outage} | {figures.attempts_in_outage} | {before}"
        f" | {probes if figures.break_after is not None else '-'} | {broke} | {mended} | {drained:.1f} s"
        f" | {figures.pushed_back} | {figures.all_done_after:.1f} s | {figures.enqueued} DONE"
        f" {figures.enqueued - figures.failed}, effects {figures.effects}, at most {figures.deliveries_max} each |"
    )


HEADER = (
    "| breaker | outage | enqueued in it | attempts in it | before the break | while broken (probes) | broken after"
    " | mended after the return | never-attempted drained | retries pushed back | all DONE after | end |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outage-minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2.0, help="webhooks enqueued a second")
    parser.add_argument("--no-breaker", action="store_true")
    args = parser.parse_args()
    breaker = not args.no_breaker
    name = f"outbox_bench_broken_endpoint_{'breaker' if breaker else 'none'}"
    started = time.monotonic()
    with fresh_database(server_url(), name) as (url, engine):
        figures = asyncio.run(run(url, engine, args.outage_minutes * 60, args.rate, breaker))
    print(f"({time.monotonic() - started:.0f} s; load {load_average()})", file=sys.stderr)
    print(HEADER)
    print(row(breaker, figures))


if __name__ == "__main__":
    main()
