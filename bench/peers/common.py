"""What the worker and producer processes of every system share: job records, readiness, paced enqueues.

    worker process ──record(key, lane, seq, start, end) per job──▶ memory ──at exit──▶ <record file>
    producer process ──enqueue one job per transaction at a fixed rate──▶ <out file>: key, commit time

Every time is CLOCK_MONOTONIC in nanoseconds, which is system-wide on Linux, so a producer's commit time and
a worker's start time compare directly. Files are tab-separated; the orchestrator (`bench.compare`) reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

# one job's record: key, lane ("" without lanes), sequence in its lane, start and end (monotonic ns)
JobRecord = tuple[str, str, int, int, int]


class Recorder:
    """Keeps each job's record in memory (a list append per job) and writes them all once, at exit."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._rows: list[JobRecord] = []
        self._written = False
        atexit.register(self.write)

    def add(self, key: str, lane: str, seq: int, started: int) -> None:
        self._rows.append((key, lane, seq, started, time.monotonic_ns()))

    def write(self) -> None:
        if self._written:
            return
        self._written = True
        with self._path.open("w") as out:
            out.writelines(f"{k}\t{lane}\t{seq}\t{s}\t{e}\n" for k, lane, seq, s, e in self._rows)


def read_records(path: Path) -> list[JobRecord]:
    if not path.exists():
        return []
    rows: list[JobRecord] = []
    for line in path.read_text().splitlines():
        key, lane, seq, start, end = line.split("\t")
        rows.append((key, lane, int(seq), int(start), int(end)))
    return rows


def mark_ready(path: str | None) -> None:
    if path:
        Path(path).write_text("ready\n")


def worker_arguments(description: str) -> argparse.Namespace:
    """The command line every peer module takes: `worker ...` or `produce ...`."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--url", required=True)
    worker.add_argument("--record", required=True)
    worker.add_argument("--ready", default=None)
    worker.add_argument("--concurrency", type=int, default=64)
    worker.add_argument("--lanes", action="store_true", help="serial execution per lane")
    worker.add_argument("--batch-size", type=int, default=None, help="jobs per fetch, where the system has one")
    produce = sub.add_parser("produce")
    produce.add_argument("--url", required=True)
    produce.add_argument("--out", required=True)
    produce.add_argument("--rate", type=float, required=True)
    produce.add_argument("--seconds", type=float, required=True)
    produce.add_argument("--connections", type=int, default=32)
    produce.add_argument("--driver", choices=["sqlalchemy", "psycopg"], default="sqlalchemy")
    return parser.parse_args()


async def produce(
    enqueue_one: Callable[[int], Awaitable[str]], rate: float, seconds: float, connections: int, out: Path
) -> None:
    """Enqueue job i at t0 + i / rate, each in its own transaction, from `connections` concurrent callers.

    Writes one line per job (key, commit time) and a last line `# achieved <jobs/s>`: lower than the rate
    when the enqueues could not keep up.
    """
    total = int(rate * seconds)
    counter = itertools.count()
    committed: list[tuple[str, int]] = []
    start = time.monotonic()

    async def caller() -> None:
        while (i := next(counter)) < total:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            key = await enqueue_one(i)
            committed.append((key, time.monotonic_ns()))

    await asyncio.gather(*(caller() for _ in range(connections)))
    elapsed = time.monotonic() - start
    with out.open("w") as file:
        file.writelines(f"{key}\t{at}\n" for key, at in committed)
        file.write(f"# achieved {total / max(elapsed, seconds):.1f}\n")


def read_produced(path: Path) -> tuple[dict[str, int], float]:
    """(commit time by key, achieved rate) of a producer's out file."""
    committed: dict[str, int] = {}
    achieved = 0.0
    for line in path.read_text().splitlines():
        if line.startswith("# achieved "):
            achieved = float(line.split()[-1])
        else:
            key, at = line.split("\t")
            committed[key] = int(at)
    return committed, achieved
