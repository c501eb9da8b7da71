"""Retention benchmark: purge 1,000,000 ended rows while two executor processes keep claiming.

    python -m bench.retention [--ended 1000000] [--rate 500] [--baseline-seconds 20] [--batch-size 5000]
                              [--rest-factor 1]

1,000,000 ended rows (`bench.executor.seed_ended`, ended a day ago), two executor processes, and a steady
feed of no-op actions (--rate per second over 1,000 lanes) that keeps them claiming. A sampler times
`store_executor.CLAIM_READY_HEADS` (50 heads) on a connection of its own, rolled back each time, every ~10 ms:
first for --baseline-seconds without a purge, then while `outbox purge --older-than 12h` runs in a
process of its own and deletes the million rows (with `--rest-factor` other than 1, the same batches resting
that many times each batch's time: 3 is half the shipped rate). Reports the purge rate, claim p50/p99 in both
phases and the p99 ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, create_engine

from bench import harness
from bench.executor import seed_ended
from outbox._internal.config.limits import PURGE_BATCH_SIZE
from outbox.store import application
from outbox.store import executor as store_executor

LANES = 1_000
FEED_TICK_SECONDS = 0.1
SAMPLE_PAUSE_SECONDS = 0.01
CLAIM_PARAMS = {"limit": 50, "lease_seconds": 300, "kinds": ["TEST_NOOP"]}


class Feed:
    """Enqueues `rate` no-op actions a second, in one statement per tick, round-robin over the lanes."""

    def __init__(self, engine: Engine, rate: int) -> None:
        self._engine = engine
        self._per_tick = max(1, round(rate * FEED_TICK_SECONDS))
        self._next = time.monotonic()
        self.fed = 0

    def tick(self) -> None:
        if time.monotonic() < self._next:
            return
        harness.bulk_admit(self._engine, self._per_tick, LANES, lane_prefix="feed", start=self.fed)
        self.fed += self._per_tick
        self._next += FEED_TICK_SECONDS


def claim_ms(sampler: Connection) -> float:
    """One claim as an executor makes it, timed from the statement to its last row, then rolled back."""
    started = time.perf_counter()
    sampler.execute(store_executor.CLAIM_READY_HEADS, CLAIM_PARAMS).all()
    elapsed = (time.perf_counter() - started) * 1000
    sampler.rollback()
    return elapsed


def sample(sampler: Connection, feed: Feed, until: Callable[[], bool]) -> list[float]:
    samples: list[float] = []
    while not until():
        feed.tick()
        samples.append(claim_ms(sampler))
        time.sleep(SAMPLE_PAUSE_SECONDS)  # the sampling interval, not a synchronisation
    return samples


def start_purge(url: str, batch_size: int, rest_factor: float) -> subprocess.Popen[bytes]:
    """`outbox purge` as shipped (`rest_factor` 1), or `paced_purge` resting longer."""
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(harness.ROOT)}
    command = [sys.executable, "-m", "outbox.cli", "purge", "--older-than", "12h", "--json"]
    if rest_factor != 1:
        command = [sys.executable, "-m", "bench.retention", "--paced-purge", str(rest_factor)]
    command += ["--batch-size", str(batch_size)]
    return subprocess.Popen(command, env=env, cwd=harness.ROOT, stdout=subprocess.PIPE)


def paced_purge(url: str, batch_size: int, rest_factor: float) -> None:
    """The purge's batches as `outbox.retention.purge_ended` runs them (rows ended over 12 hours ago), resting
    `rest_factor` times as long as each batch took instead of once: 3 keeps a quarter of a core busy, half the
    shipped purge's rate. Prints what `outbox purge --json` prints."""
    engine = create_engine(url)
    started = time.monotonic()
    with engine.begin() as conn:
        cutoff = conn.execute(application.DATABASE_NOW).scalar_one() - timedelta(hours=12)
    params = {"after": datetime.min.replace(tzinfo=UTC), "cutoff": cutoff, "batch_size": batch_size}
    deleted = 0
    while True:
        batch_started = time.monotonic()
        with engine.begin() as conn:
            batch = conn.execute(application.PURGE_ENDED_BATCH, params).one()
        deleted += int(batch.deleted)
        if batch.deleted < batch_size:
            break
        time.sleep(rest_factor * (time.monotonic() - batch_started))  # the purge's pace, not a synchronisation
        params["after"] = batch.last_ended_at
    engine.dispose()
    print(json.dumps({"deleted": deleted, "seconds": time.monotonic() - started}))


def quantiles(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=100)
    return q[49], q[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ended", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=500, help="actions enqueued per second during both phases")
    parser.add_argument("--baseline-seconds", type=float, default=20.0)
    parser.add_argument("--batch-size", type=int, default=PURGE_BATCH_SIZE, help="the purge's rows per batch")
    parser.add_argument(
        "--rest-factor", type=float, default=1.0, help="the purge rests this many times its batch's time (3: half rate)"
    )
    parser.add_argument("--paced-purge", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.paced_purge is not None:
        paced_purge(os.environ["OUTBOX_DATABASE_URL"], args.batch_size, args.paced_purge)
        return
    server = harness.server_url()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" PostgreSQL {harness.server_version(server)}"
    )
    with harness.fresh_database(server, "bench_retention") as (url, engine):
        seed_ended(engine, args.ended)
        processes = harness.start_executors(url, 2, "bench.adapters:noop_adapters")
        try:
            harness.wait_listening(engine, 2)
            feed = Feed(engine, args.rate)
            with engine.connect() as sampler:
                warm_up = time.monotonic() + 2
                sample(sampler, feed, lambda: time.monotonic() >= warm_up)
                baseline_end = time.monotonic() + args.baseline_seconds
                baseline = sample(sampler, feed, lambda: time.monotonic() >= baseline_end)
                purge = start_purge(url, args.batch_size, args.rest_factor)
                during = sample(sampler, feed, lambda: purge.poll() is not None)
            stdout, _ = purge.communicate()
            if purge.returncode != 0:
                raise RuntimeError(f"outbox purge exited {purge.returncode}")
            purged = json.loads(stdout)
            harness.wait_drained(engine)
        finally:
            harness.stop(processes)
        left = harness.ended(engine, "lane_key LIKE 'old-%'")
    base_p50, base_p99 = quantiles(baseline)
    purge_p50, purge_p99 = quantiles(during)
    print(
        f"purge: {purged['deleted']:,} ended rows in {purged['seconds']:.1f} s:"
        f" {purged['deleted'] / purged['seconds']:,.0f} rows/s (batches of {args.batch_size:,}, resting"
        f" {args.rest_factor:g}x each batch's time); {left:,} left"
    )
    print(
        f"claim of 50 heads while 2 executors take {args.rate}/s: without purge p50 {base_p50:.2f} ms,"
        f" p99 {base_p99:.2f} ms ({len(baseline)} samples); during the purge p50 {purge_p50:.2f} ms,"
        f" p99 {purge_p99:.2f} ms ({len(during)} samples); p99 ratio {purge_p99 / base_p99:.2f}x"
    )
    print(f"fed {feed.fed:,} actions during the run; all ended")


if __name__ == "__main__":
    main()
