"""A healthy endpoint B beside a broken endpoint A: B's drain and pickup, alone and while A is broken.

    python -m bench.broken_neighbour [--actions 1000] [--lanes 100] [--rounds 3] [--modes alone,503,...]
                                     [--while-broken] [--break-seconds 120]

    each round, alternated: B alone, then B beside A in each mode
        503        A answers 503 without Retry-After to everything (slow-downs only)
        hang       A answers nothing past the 15 s request bound, its actions over `--lanes` lanes
        hang-lanes A answers nothing, one action per lane over 10 * `--lanes` lanes
        hang-lanes-unshared  the same, with no destination's share (`destination_slots` = `concurrency`):
                   what the share changes, measured in the same run
    ──▶ a fresh database; A's actions enqueued first (due first), then B's `--actions` over `--lanes` lanes;
        two executors (outbox.executor.Executor, one process, a WebhookAdapter each, ExecutorConfig's
        defaults) start together
    --while-broken: B's actions wait (due in a day) until A's breaker has opened (agent_destination.broken_since),
        then all become due in one statement, which also notifies the executors; B alone is made due as soon as
        the executors run. Without it, B is measured from the start, while A fails and holds its share of each
        executor's slots (a quarter) until its failures have lasted `--break-seconds` (the shipped 120 s).
    ──▶ B's drain (start, or B made due, to its last DONE) and B's pickup p95 (an action's fence less the time
        it could be claimed: its due time, or its lane's previous action's end, whichever came later), with
        the load average at the end of the run
    ─▶ a Markdown table: per mode, the median and spread (min-max) of the rounds, and the ratio of each
       round's figure to the same round's B alone

The server is OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL (bench.harness).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import time
from dataclasses import dataclass

from sqlalchemy import Engine, text

from bench.broken_endpoint import SECRET, load_average
from bench.harness import fresh_database, server_url
from demo.receiver import Receiver
from outbox.db import async_engine
from outbox.executor import Executor, ExecutorConfig
from outbox.executor.config import DEFAULTS
from outbox.webhook import WebhookAdapter, enqueue_webhook, register_endpoint, register_webhook_event
from tests.webhook_events import NumberedHook

MODES = ("alone", "503", "hang", "hang-lanes", "hang-lanes-unshared")
# the longest B may take to drain
DRAIN_SECONDS = 600.0


class ToA(NumberedHook):
    name = "bench.to_a"
    endpoint = "a"

    def lane_key(self, event: dict[str, object]) -> str:
        return f"a:{event['lane']}"


class ToB(NumberedHook):
    name = "bench.to_b"
    endpoint = "b"

    def lane_key(self, event: dict[str, object]) -> str:
        return f"b:{event['lane']}"


TO_A, TO_B = ToA(), ToB()


@dataclass(frozen=True)
class Run:
    mode: str
    drain_seconds: float
    pickup_p95: float
    load: str


# B's pickups: each DONE action's fence less when it could be claimed (its due time, or the end of its lane's
# previous action, whichever came later)
PICKUPS = """
SELECT extract(epoch FROM write_started_at - greatest(due_at, coalesce(previous_end, due_at)))::float8
  FROM (SELECT write_started_at, due_at,
               lag(ended_at) OVER (PARTITION BY lane_key ORDER BY id) AS previous_end
          FROM agent_action WHERE destination = 'webhook:b' AND state = 'DONE') AS b
"""


# --while-broken: B's actions held back until A is broken, then due at once; the executors hear of it as of an
# enqueue
HOLD_B = "UPDATE agent_action SET due_at = now() + interval '1 day' WHERE destination = 'webhook:b'"
RELEASE_B = (
    "UPDATE agent_action SET due_at = now() WHERE destination = 'webhook:b'; SELECT pg_notify('outbox_action', '')"
)
A_BROKEN = "SELECT count(*) FROM agent_destination WHERE name = 'webhook:a' AND broken_since IS NOT NULL"
# the longest A may take to break
BREAK_WAIT_SECONDS = 900.0


def enqueue(engine: Engine, definition: NumberedHook, count: int, lanes: int) -> None:
    with engine.begin() as conn:
        for n in range(count):
            enqueue_webhook(conn, definition, {"n": n, "lane": n % lanes})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def one_run(url: str, engine: Engine, mode: str, args: argparse.Namespace, ports: tuple[int, int]) -> Run:
    """One run on a fresh database; the endpoints' receivers start anew on the same `ports` each run (the
    endpoints are registered once, with their URLs)."""
    a, b = Receiver(SECRET, port=ports[0]).start(), Receiver(SECRET, port=ports[1]).start()
    a.refusing = "503" if mode == "503" else "stall"
    if mode != "alone":
        enqueue(engine, TO_A, args.actions, 10 * args.lanes if mode.startswith("hang-lanes") else args.lanes)
    enqueue(engine, TO_B, args.actions, args.lanes)
    if args.while_broken:
        with engine.begin() as conn:
            conn.execute(text(HOLD_B))
    aengine = async_engine(url)
    adapters = [WebhookAdapter(aengine) for _ in range(2)]
    slots = DEFAULTS.concurrency if mode.endswith("unshared") else None
    config = ExecutorConfig(break_seconds=args.break_seconds, destination_slots=slots)
    executors = [Executor(aengine, [adapter], config) for adapter in adapters]
    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(executor.run()) for executor in executors]
    try:
        if args.while_broken:
            await _until_a_broken(engine, mode, loop.time() + BREAK_WAIT_SECONDS)
            with engine.begin() as conn:
                conn.execute(text(RELEASE_B))
        started = loop.time()
        while _b_left(engine):
            if loop.time() - started > DRAIN_SECONDS:
                raise RuntimeError(f"B not drained after {DRAIN_SECONDS:.0f} s ({mode})")
            await asyncio.sleep(0.05)
        drained = loop.time() - started
    finally:
        for executor in executors:
            executor.stop()
        a.released.set()  # the stalled requests end, so the executors' attempts do
        await asyncio.gather(*tasks)
        for adapter in adapters:
            await adapter.aclose()
        await aengine.dispose()
        a.stop()
        b.stop()
    with engine.connect() as conn:
        pickups = sorted(float(p) for (p,) in conn.execute(text(PICKUPS)))
    p95 = pickups[max(0, round(0.95 * len(pickups)) - 1)]
    return Run(mode, drained, p95, load_average())


async def _until_a_broken(engine: Engine, mode: str, deadline: float) -> None:
    """Wait until A's breaker has opened (at once for B alone)."""
    while mode != "alone":
        with engine.connect() as conn:
            if conn.execute(text(A_BROKEN)).scalar_one():
                return
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"A not broken after {BREAK_WAIT_SECONDS:.0f} s ({mode})")
        await asyncio.sleep(0.5)


def _b_left(engine: Engine) -> int:
    with engine.connect() as conn:
        left = "SELECT count(*) FROM agent_action WHERE destination = 'webhook:b' AND state <> 'DONE'"
        return int(conn.execute(text(left)).scalar_one())


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def table(rounds: list[dict[str, Run]], modes: list[str]) -> str:
    lines = [
        "| A | B drain s, median (min-max) | drain / B alone, same round | B pickup p95 s | p95 / B alone |"
        " load average at the runs' ends |",
        "|---|---|---|---|---|---|",
    ]
    for mode in modes:
        runs = [r[mode] for r in rounds]
        drains = [r.drain_seconds for r in runs]
        pickups = [r.pickup_p95 for r in runs]
        drain_ratios = [r[mode].drain_seconds / r["alone"].drain_seconds for r in rounds]
        pickup_ratios = [r[mode].pickup_p95 / max(r["alone"].pickup_p95, 1e-3) for r in rounds]
        loads = "; ".join(r.load for r in runs)
        lines.append(
            f"| {mode} | {spread(drains)} | {spread(drain_ratios, '{:.2f}x')} | {spread(pickups, '{:.2f}')}"
            f" | {spread(pickup_ratios, '{:.2f}x')} | {loads} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=1000, help="actions to each endpoint")
    parser.add_argument("--lanes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="the modes run in each round, in this order")
    parser.add_argument("--while-broken", action="store_true", help="measure B once A's breaker has opened")
    parser.add_argument("--break-seconds", type=float, default=DEFAULTS.break_seconds, help="the breaker's window")
    args = parser.parse_args()
    modes = ["alone", *(m for m in args.modes.split(",") if m != "alone")]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    ports = free_port(), free_port()
    for name, port in zip("ab", ports, strict=True):
        register_endpoint(name, f"http://127.0.0.1:{port}/hooks", secret=SECRET)
    register_webhook_event(TO_A)
    register_webhook_event(TO_B)
    started = time.monotonic()
    rounds: list[dict[str, Run]] = []
    for n in range(args.rounds):
        found: dict[str, Run] = {}
        for mode in modes:
            with fresh_database(server_url(), "outbox_bench_broken_neighbour") as (url, engine):
                found[mode] = asyncio.run(one_run(url, engine, mode, args, ports))
            run = found[mode]
            print(
                f"round {n + 1} {mode}: B drained in {run.drain_seconds:.1f} s, pickup p95 {run.pickup_p95:.2f} s"
                f" (load {run.load})",
                file=sys.stderr,
                flush=True,
            )
        rounds.append(found)
    print(f"({time.monotonic() - started:.0f} s; load {load_average()})", file=sys.stderr)
    print(table(rounds, modes))


if __name__ == "__main__":
    main()
