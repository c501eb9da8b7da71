"""outbox as a benchmark system: `outbox run` with a recording no-op adapter, and a paced enqueue producer.

    worker:   python -m outbox.cli run --adapters bench.peers.outbox_peer:adapters   (OUTBOX_BENCH_RECORD=file)
    producer: python -m bench.peers.outbox_peer produce --url ... --rate ... --seconds ... [--driver psycopg]

The producer enqueues as an application does, each action in its own transaction: through SQLAlchemy's
async engine (the default), or on psycopg 3 async connections (`--driver psycopg`, the lighter documented
way for an application on psycopg).

The adapter passes its fence (a committed write of write_started_at under the claim's epoch) before it
returns Done, so every job costs outbox its whole guarantee: claim, fence, finish.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from bench import kinds
from bench.peers import System, WorkerSpec, base_env, libpq_url, python
from bench.peers.common import Recorder, produce, worker_arguments
from outbox.db import async_engine
from outbox.executor import ActionAdapter, ActionAttempt, Done, Result
from outbox.kinds import ActionKind

# The worker process imports this module for its adapter: the schema and bulk-load helpers (Alembic, the
# harness) are imported where they are used, so the worker's memory is the executor's own.

# lanes of the producer's actions: one per action, so nothing waits on order (the peers keep none)
PRODUCER_LANE = "s-{i}"


class Outbox(System):
    """`outbox run` with `args`; every job in its own lane unless the run has lanes (peers keep no order)."""

    lanes_feature = "lane_key"

    def __init__(self, name: str = "outbox", args: tuple[str, ...] = (), driver: str = "sqlalchemy") -> None:
        self.name = name
        self.args = args
        self.driver = driver
        run = f"outbox run {' '.join(args) or '(defaults: --concurrency 64, claims of the free slots)'}"
        self.settings = f"{run}; producer on {driver}"

    def prepare(self, url: str) -> None:
        from sqlalchemy import create_engine

        from outbox import migrate
        from outbox.testing import install_kinds

        engine = create_engine(url)
        with engine.begin() as conn:
            migrate.upgrade(conn)
            install_kinds(conn, kinds.ALL)
        engine.dispose()

    def preload(self, url: str, count: int, lanes: int | None) -> float | None:
        from sqlalchemy import create_engine

        from bench import harness

        engine = create_engine(url)
        harness.bulk_admit(engine, count, lanes or count)
        engine.dispose()
        return None

    def pending_sql(self) -> str:
        return (
            "SELECT (SELECT count(*) FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED'))"
            " + (SELECT count(*) FROM agent_action WHERE state = 'EXECUTING')"
        )

    def worker(self, url: str, record: Path, ready: Path, lanes: bool) -> WorkerSpec:
        env = {**base_env(), "OUTBOX_DATABASE_URL": url, "OUTBOX_BENCH_RECORD": str(record)}
        return WorkerSpec([python(), "-m", "outbox.cli", "run", "--adapters", f"{__name__}:adapters", *self.args], env)

    def wait_ready(self, url: str, ready: list[Path], timeout: float = 60) -> None:
        from sqlalchemy import create_engine

        from bench import harness

        engine = create_engine(url)
        harness.wait_listening(engine, len(ready), timeout)
        engine.dispose()

    def driver_url(self, url: str) -> str:
        return url if self.driver == "sqlalchemy" else libpq_url(url)

    def producer(self, url: str, out: Path, rate: float, seconds: float) -> WorkerSpec:
        spec = super().producer(url, out, rate, seconds)
        return WorkerSpec([*spec.argv, "--driver", self.driver], spec.env)


class RecordingNoop:
    def __init__(self, kind: ActionKind, recorder: Recorder) -> None:
        self._kind = kind
        self._recorder = recorder

    @property
    def kind(self) -> ActionKind:
        return self._kind

    async def execute(self, attempt: ActionAttempt) -> Result:
        started = time.monotonic_ns()
        (await attempt.fence().begin_write()).check()
        action = attempt.action
        self._recorder.add(str(action.id), action.lane_key, action.id, started)
        return Done("noop")


def adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    return [RecordingNoop(kinds.NOOP, Recorder(os.environ["OUTBOX_BENCH_RECORD"]))]


def _request(run: str, i: int) -> outbox.ActionRequest:
    return outbox.ActionRequest(
        kind=kinds.NOOP, workspace_id=1, lane_key=PRODUCER_LANE.format(i=i), idempotency_key=f"{run}-{i}", payload={}
    )


async def _produce(url: str, rate: float, seconds: float, connections: int, out: Path) -> None:
    engine = async_engine(url, pool_size=connections, max_overflow=0)
    run = uuid.uuid4().hex[:8]

    async def enqueue_one(i: int) -> str:
        async with engine.begin() as conn:
            action = await outbox.enqueue_async(conn, _request(run, i))
        return str(action.id)

    try:
        await produce(enqueue_one, rate, seconds, connections, out)
    finally:
        await engine.dispose()


async def _produce_on_psycopg(url: str, rate: float, seconds: float, connections: int, out: Path) -> None:
    import psycopg

    free: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for _ in range(connections):
        free.put_nowait(await psycopg.AsyncConnection.connect(url))
    run = uuid.uuid4().hex[:8]

    async def enqueue_one(i: int) -> str:
        conn = await free.get()
        try:
            async with conn.transaction():
                action = await outbox.enqueue_async(conn, _request(run, i))
        finally:
            free.put_nowait(conn)
        return str(action.id)

    try:
        await produce(enqueue_one, rate, seconds, connections, out)
    finally:
        while not free.empty():
            await free.get_nowait().close()


def main() -> None:
    args = worker_arguments(__doc__ or "")
    if args.command != "produce":
        raise SystemExit("outbox workers are `python -m outbox.cli run`; this module only produces")
    producer = _produce_on_psycopg if args.driver == "psycopg" else _produce
    asyncio.run(producer(args.url, args.rate, args.seconds, args.connections, Path(args.out)))


if __name__ == "__main__":
    main()
