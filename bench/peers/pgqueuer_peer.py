"""pgqueuer as a benchmark system: a PgQueuer worker over one asyncpg connection, and its enqueue API.

    worker:   python -m bench.peers.pgqueuer_peer worker --url ... --record ... [--batch-size N]
    producer: python -m bench.peers.pgqueuer_peer produce --url ... --rate ... --seconds ...

`bench.compare` runs it twice, as two systems: at its default batch size (10, `pgqueuer-10`) and at its
best documented one (50, `pgqueuer-50`). The batch is the jobs a worker fetches per dequeue, and the size of
its batched completion log.

pgqueuer has no per-key serial execution (an entrypoint's `concurrency_limit=1` serialises the whole
entrypoint), so it sits out the lanes run.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

from bench.peers import System, WorkerSpec, base_env, libpq_url
from bench.peers.common import Recorder, mark_ready, produce, worker_arguments

# pgqueuer's own default batch size (`QueueManager.run`)
DEFAULT_BATCH_SIZE = 10


class Pgqueuer(System):
    def __init__(self, batch_size: int) -> None:
        self.name = f"pgqueuer-{batch_size}"
        self.batch_size = batch_size
        self.settings = f"1 asyncpg connection per worker, batch_size {batch_size}, unlimited tasks, LISTEN/NOTIFY"

    def prepare(self, url: str) -> None:
        asyncio.run(_install(libpq_url(url)))

    def preload(self, url: str, count: int, lanes: int | None) -> float | None:
        if lanes is not None:
            raise ValueError("pgqueuer has no lanes")
        asyncio.run(_preload(libpq_url(url), count))
        return None

    def pending_sql(self) -> str:
        return "SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')"

    def worker(self, url: str, record: Path, ready: Path, lanes: bool) -> WorkerSpec:
        args = ("--record", str(record), "--ready", str(ready), "--batch-size", str(self.batch_size))
        return WorkerSpec(self.module_command("worker", url, *args), base_env())


async def _install(dsn: str) -> None:
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def _preload(dsn: str, count: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).enqueue(["noop"] * count, [None] * count, [0] * count)
    finally:
        await conn.close()


async def _work(dsn: str, record: str, ready: str | None, batch_size: int) -> None:
    import asyncpg
    from pgqueuer import Job, PgQueuer

    recorder = Recorder(record)
    conn = await asyncpg.connect(dsn)
    pgq = PgQueuer.from_asyncpg_connection(conn)

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        recorder.add(str(job.id), "", 0, time.monotonic_ns())

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, pgq.qm.shutdown.set)
    mark_ready(ready)
    try:
        await pgq.qm.run(batch_size=batch_size)
    finally:
        recorder.write()


async def _produce(dsn: str, rate: float, seconds: float, connections: int, out: Path) -> None:
    import asyncpg
    from pgqueuer import AsyncpgPoolDriver, Queries

    pool: Any = await asyncpg.create_pool(dsn, min_size=connections, max_size=connections)
    queries = Queries(AsyncpgPoolDriver(pool))

    async def enqueue_one(i: int) -> str:
        ids = await queries.enqueue("noop", None, 0)
        return str(ids[0])

    try:
        await produce(enqueue_one, rate, seconds, connections, out)
    finally:
        await pool.close()


def main() -> None:
    args = worker_arguments(__doc__ or "")
    if args.command == "worker":
        asyncio.run(_work(args.url, args.record, args.ready, args.batch_size or DEFAULT_BATCH_SIZE))
    else:
        asyncio.run(_produce(args.url, args.rate, args.seconds, args.connections, Path(args.out)))


if __name__ == "__main__":
    main()
