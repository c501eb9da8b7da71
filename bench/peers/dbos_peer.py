"""DBOS as a benchmark system: a launched DBOS process polling a queue, and `DBOSClient.enqueue`.

    worker:   python -m bench.peers.dbos_peer worker --url ... --record ... [--lanes]
    producer: python -m bench.peers.dbos_peer produce --url ... --rate ... --seconds ...
    prepare:  python -m bench.peers.dbos_peer prepare --url ...   (DBOS.launch creates the dbos schema)
    preload:  python -m bench.peers.dbos_peer preload --url ... --count N [--lanes L]

Lanes: a partitioned queue with partition_concurrency 1, the partition key being the lane. Each worker
process has its own executor id (DBOS__VMID), so a starting worker never recovers another's workflows.
The preload enqueues one workflow with DBOSClient.enqueue_in_transaction and copies its rows in SQL, in one
transaction:
50,000 client enqueues, one transaction each, would take minutes here.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from bench.peers import System, WorkerSpec, base_env, libpq_url, python
from bench.peers.common import Recorder, mark_ready, produce

QUEUE = "bench"
LANES_QUEUE = "lanes"
# workflows one worker runs at once, and how often its queue thread polls
WORKER_CONCURRENCY = 100
POLLING_SECONDS = 0.1


class Dbos(System):
    name = "DBOS"
    lanes_feature = "partitioned queue, partition_concurrency=1"
    settings = f"worker_concurrency {WORKER_CONCURRENCY}, polling_interval_sec {POLLING_SECONDS}, sync workflows"

    def __init__(self) -> None:
        self._workers = 0

    def prepare(self, url: str) -> None:
        subprocess.run([python(), "-m", __name__, "prepare", "--url", libpq_url(url)], env=base_env(), check=True)

    def preload(self, url: str, count: int, lanes: int | None) -> float | None:
        argv = [python(), "-m", __name__, "preload", "--url", libpq_url(url), "--count", str(count)]
        if lanes is not None:
            argv += ["--lanes", str(lanes)]
        out = subprocess.run(argv, env=base_env(), check=True, capture_output=True, text=True).stdout
        return float(out.split("committed ")[-1].split()[0])

    def pending_sql(self) -> str:
        return (
            "SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')"
            f" AND queue_name IN ('{QUEUE}', '{LANES_QUEUE}')"
        )

    def worker(self, url: str, record: Path, ready: Path, lanes: bool) -> WorkerSpec:
        self._workers += 1
        args = ("--record", str(record), "--ready", str(ready), *(["--lanes"] if lanes else []))
        env = {**base_env(), "DBOS__VMID": f"bench-{self._workers}"}
        return WorkerSpec(self.module_command("worker", url, *args), env)


def _launch(url: str, recorder: Recorder | None) -> Any:
    from dbos import DBOS

    DBOS(config={"name": "bench", "system_database_url": url})

    @DBOS.workflow(name="noop")
    def noop() -> None:
        started = time.monotonic_ns()
        key = DBOS.workflow_id or ""
        if recorder is not None:
            lane, _, seq = key.rpartition("|")
            recorder.add(key, lane, int(seq) if lane else 0, started)

    DBOS.launch()
    return DBOS


def _register(dbos: Any, lanes: bool) -> None:
    if lanes:
        dbos.register_queue(
            LANES_QUEUE,
            worker_concurrency=WORKER_CONCURRENCY,
            partition_concurrency=1,
            polling_interval_sec=POLLING_SECONDS,
        )
    else:
        dbos.register_queue(QUEUE, worker_concurrency=WORKER_CONCURRENCY, polling_interval_sec=POLLING_SECONDS)


def _work(url: str, record: str, ready: str | None, lanes: bool) -> None:
    recorder = Recorder(record)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    dbos = _launch(url, recorder)
    _register(dbos, lanes)
    mark_ready(ready)
    stop.wait()
    dbos.destroy(workflow_completion_timeout_sec=10)
    recorder.write()


def _prepare(url: str) -> None:
    dbos = _launch(url, None)
    _register(dbos, False)
    _register(dbos, True)
    dbos.destroy()


def _preload(url: str, count: int, lanes: int | None) -> None:
    """One workflow enqueued by the client, copied `count` times in one transaction, then removed."""
    import sqlalchemy as sa
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=url)
    options: dict[str, Any] = {"queue_name": QUEUE if lanes is None else LANES_QUEUE, "workflow_name": "noop"}
    options["workflow_id"] = "template"
    if lanes is not None:
        options["queue_partition_key"] = "template"
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        # in the copying transaction, so that no running worker can take the template first
        client.enqueue_in_transaction(conn, options)  # type: ignore[arg-type]
        columns = [
            c
            for (c,) in conn.execute(
                sa.text(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_schema = 'dbos' AND table_name = 'workflow_status' ORDER BY ordinal_position"
                )
            )
        ]
        key = "'j-' || g" if lanes is None else "'lane-' || (g % :lanes) || '|' || (g / :lanes)"
        replaced = {
            "workflow_uuid": key,
            "created_at": "t.created_at + g",
            "updated_at": "t.created_at + g",
            "creator_xid": "gen_random_uuid()::text",
            "queue_partition_key": "NULL" if lanes is None else "'lane-' || (g % :lanes)",
        }
        select = ", ".join(replaced.get(c, f"t.{c}") for c in columns)
        params = {"count": count, "lanes": lanes or 1}
        conn.execute(
            sa.text(
                f"INSERT INTO dbos.workflow_status ({', '.join(columns)}) SELECT {select}"
                " FROM dbos.workflow_status AS t, generate_series(0, :count - 1) AS g"
                " WHERE t.workflow_uuid = 'template'"
            ),
            params,
        )
        conn.execute(
            sa.text(
                f"INSERT INTO dbos.workflow_input (workflow_uuid, inputs, retention_timestamp) SELECT {key},"
                " t.inputs, t.retention_timestamp FROM dbos.workflow_input AS t, generate_series(0, :count - 1) AS g"
                " WHERE t.workflow_uuid = 'template'"
            ),
            params,
        )
        conn.execute(sa.text("DELETE FROM dbos.workflow_input WHERE workflow_uuid = 'template'"))
        conn.execute(sa.text("DELETE FROM dbos.workflow_status WHERE workflow_uuid = 'template'"))
    print(f"committed {time.monotonic()}", flush=True)  # the orchestrator times the burn-down from here
    engine.dispose()
    client.destroy()


async def _produce(url: str, rate: float, seconds: float, connections: int, out: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from dbos import DBOSClient

    client = DBOSClient(system_database_url=url, system_database_pool_size=connections)
    pool = ThreadPoolExecutor(max_workers=connections)
    loop = asyncio.get_running_loop()

    def enqueue_sync(i: int) -> str:
        client.enqueue({"queue_name": QUEUE, "workflow_name": "noop", "workflow_id": f"j-{i}"})
        return f"j-{i}"

    async def enqueue_one(i: int) -> str:
        return await loop.run_in_executor(pool, enqueue_sync, i)

    try:
        await produce(enqueue_one, rate, seconds, connections, out)
    finally:
        pool.shutdown()
        client.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["worker", "produce", "prepare", "preload"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--record")
    parser.add_argument("--ready")
    parser.add_argument("--lanes", nargs="?", const=-1, type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=WORKER_CONCURRENCY)
    parser.add_argument("--out")
    parser.add_argument("--rate", type=float)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--count", type=int)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if args.command == "worker":
        _work(args.url, args.record, args.ready, args.lanes is not None)
    elif args.command == "produce":
        asyncio.run(_produce(args.url, args.rate, args.seconds, args.connections, Path(args.out)))
    elif args.command == "prepare":
        _prepare(args.url)
    else:
        _preload(args.url, args.count, args.lanes)


if __name__ == "__main__":
    main()
