"""procrastinate as a benchmark system: an async worker per process, `defer_async`, and `lock` for lanes.

    worker:   python -m bench.peers.procrastinate_peer worker --url ... --record ... [--concurrency N]
    producer: python -m bench.peers.procrastinate_peer produce --url ... --rate ... --seconds ...

Lanes: a job's `lock` is its lane; procrastinate runs no two jobs of one lock at once, oldest first.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.peers import System, WorkerSpec, base_env, libpq_url
from bench.peers.common import Recorder, mark_ready, produce, worker_arguments

# async jobs one worker runs at once
CONCURRENCY = 32
QUEUE = "default"


def _app(dsn: str, max_size: int = 10) -> Any:
    from procrastinate import App, PsycopgConnector

    return App(connector=PsycopgConnector(conninfo=dsn, min_size=1, max_size=max_size))


class Procrastinate(System):
    name = "procrastinate"
    lanes_feature = "lock=<lane>"
    settings = f"worker concurrency {CONCURRENCY}, listen_notify on, jobs kept (delete_jobs=never)"

    def prepare(self, url: str) -> None:
        async def apply() -> None:
            app = _app(libpq_url(url))
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(apply())

    def preload(self, url: str, count: int, lanes: int | None) -> float | None:
        async def load() -> None:
            from procrastinate.jobs import Job

            app = _app(libpq_url(url))
            async with app.open_async():
                jobs = [
                    Job(
                        id=None,
                        queue=QUEUE,
                        lock=None if lanes is None else f"lane-{g % lanes}",
                        queueing_lock=None,
                        task_name="noop",
                        task_kwargs={} if lanes is None else {"lane": f"lane-{g % lanes}", "seq": g // lanes},
                    )
                    for g in range(count)
                ]
                await app.job_manager.batch_defer_jobs_async(jobs)

        asyncio.run(load())
        return None

    def pending_sql(self) -> str:
        return "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"

    def worker(self, url: str, record: Path, ready: Path, lanes: bool) -> WorkerSpec:
        args = ("--record", str(record), "--ready", str(ready), "--concurrency", str(CONCURRENCY))
        return WorkerSpec(self.module_command("worker", url, *args), base_env())


async def _work(dsn: str, record: str, ready: str | None, concurrency: int) -> None:
    from procrastinate import JobContext

    recorder = Recorder(record)
    app = _app(dsn, max_size=concurrency + 2)

    @app.task(name="noop", queue=QUEUE, pass_context=True)
    async def noop(context: JobContext, lane: str = "", seq: int = 0) -> None:
        started = time.monotonic_ns()
        assert context.job.id is not None
        recorder.add(str(context.job.id), lane, seq, started)

    async with app.open_async():
        mark_ready(ready)
        try:
            await app.run_worker_async(
                queues=[QUEUE], concurrency=concurrency, wait=True, install_signal_handlers=True, delete_jobs="never"
            )
        finally:
            recorder.write()


async def _produce(dsn: str, rate: float, seconds: float, connections: int, out: Path) -> None:
    app = _app(dsn, max_size=connections)

    @app.task(name="noop", queue=QUEUE)
    async def noop() -> None:
        return None

    async def enqueue_one(i: int) -> str:
        return str(await noop.defer_async())

    async with app.open_async():
        await produce(enqueue_one, rate, seconds, connections, out)


def main() -> None:
    args = worker_arguments(__doc__ or "")
    if args.command == "worker":
        asyncio.run(_work(args.url, args.record, args.ready, args.concurrency))
    else:
        asyncio.run(_produce(args.url, args.rate, args.seconds, args.connections, Path(args.out)))


if __name__ == "__main__":
    main()
