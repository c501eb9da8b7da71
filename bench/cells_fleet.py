"""What a fleet pays per cell: the same two workers draining one cell against three, and watching empty cells.

    python -m bench.cells_fleet [--actions 12000] [--rounds 3] [--idle-seconds 20] [--no-three-servers]

    every round, the sides in a rotated order, each against fresh databases (no-op actions, bench.adapters):
      1 db             two `outbox run` processes on one database (no cells file): N actions
      1 cell           two `outbox run --all-cells` processes, a cells file of one cell: N actions
      3 cells 1 server two `outbox run --all-cells` processes, three cells as databases of one server: N/3 each
      3 cells 3 servers  the same, each cell a PostgreSQL server of its own: N/3 each
    each side: the workers started and beating in every cell, then every cell's N (or N/3) actions committed
    at once over LANES (or LANES/3) lanes ─▶ the first commit to the last action ended (each cell polled every
    50 ms until it is drained) ─▶ actions per second; CPU per action (utime + stime from /proc) of the workers
    and of the PostgreSQL servers (each postmaster with its children, those it reaped included: the backends,
    the WAL writer, the checkpointer); WAL bytes per action (pg_current_wal_lsn before and after, every server)
    then, alternated in every round: the same two --all-cells workers watching 1 empty cell, then 3 (1 server)
      ─▶ CPU per second of the workers and of the server over IDLE seconds; (3 - 1) / 2 cells / 2 workers is the
         idle cost of one cell to one worker
    ─▶ per side: median and spread (min-max) of the rounds; the load average before and after every side

    python -m bench.cells_fleet --prefect [--rounds 3] [--checks 300] [--runs 100]

    a Prefect server of its own (tests.prefect_server), a process work pool, one deployment; every round, in a
    rotated order:
      checks  CHECKS times what a drain run asks every 2 s (flows.drain._relay_view: the deployment's Running
              runs, the pool's ONLINE workers) ─▶ the server's CPU per check
      runs    RUNS flow runs of the deployment, each created, then Pending, Running and Completed (what its
              worker and the run itself set; no logs, artifacts or events) ─▶ the server's CPU per run
    ─▶ the server's CPU (the server process and its children, from /proc) per check and per run: median and
       spread of the rounds

Every action must end DONE. The servers are the chaos harness's (tests.chaos.postgres: 127.0.0.1, a port of its
own, fsync and full_page_writes off, shared_buffers 64 MB): alike for every side, and WAL bytes are counted as
written, not flushed. The 1-server sides use the first of the three servers.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from bench import harness, kinds
from bench.effects_cost import load_average, process_cpu
from outbox import migrate
from outbox.testing import install_kinds
from tests.chaos.postgres import OwnPostgres

ADAPTERS = "bench.adapters:noop_adapters"
LANES = 600
POLL_SECONDS = 0.05
TICKS = os.sysconf("SC_CLK_TCK")
SIDES = ("1 db", "1 cell", "3 cells 1 server", "3 cells 3 servers")


def server_cpu(server: OwnPostgres) -> float:
    """CPU seconds of a PostgreSQL server: its postmaster, the children it reaped (cutime + cstime: the
    backends that ended), and every live child."""
    postmaster = server.postmaster_pid()
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(value) for value in fields[11:15]) / TICKS
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == postmaster:
            total += (int(stat[11]) + int(stat[12])) / TICKS
    return total


def wal_lsn(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())


@dataclass
class Cell:
    name: str
    server: OwnPostgres
    url: str
    engine: Engine


@contextmanager
def cells(servers: list[OwnPostgres], names: list[str], tag: str) -> Iterator[list[Cell]]:
    """A fresh migrated database per cell (cell i on servers[i % len(servers)]); dropped afterwards."""
    made: list[Cell] = []
    try:
        for i, name in enumerate(names):
            server = servers[i % len(servers)]
            db = f"bench_cells_{tag}_{name}"
            admin = create_engine(server.url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{db}"'))
            admin.dispose()
            url = make_url(server.url).set(database=db).render_as_string(hide_password=False)
            engine = create_engine(url, pool_size=1)
            with engine.begin() as conn:
                migrate.upgrade(conn)
                install_kinds(conn, kinds.ALL)
            made.append(Cell(name, server, url, engine))
        yield made
    finally:
        for cell in made:
            cell.engine.dispose()
            admin = create_engine(cell.server.url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                gone = make_url(cell.url).database
                conn.execute(text(f'DROP DATABASE IF EXISTS "{gone}" WITH (FORCE)'))
            admin.dispose()


@contextmanager
def workers(made: list[Cell], all_cells: bool, count: int = 2) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` warm `outbox run` processes: on the one database, or --all-cells over a cells file of `made`;
    each beating in every cell before this yields. Stopped by PID with SIGTERM."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(harness.ROOT)}
        args = ["run", "--adapters", ADAPTERS]
        if all_cells:
            cells_file = Path(tmp) / "cells.toml"
            cells_file.write_text(
                "".join(f'[cells.{c.name}]\ndatabase_url_variable = "BENCH_CELL_{c.name.upper()}"\n' for c in made)
            )
            env |= {f"BENCH_CELL_{c.name.upper()}": c.url for c in made}
            env["OUTBOX_CELLS_FILE"] = str(cells_file)
            args.append("--all-cells")
        else:
            (only,) = made
            env["OUTBOX_DATABASE_URL"] = only.url
            env.pop("OUTBOX_CELLS_FILE", None)
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "outbox.cli", *args],
                env=env,
                cwd=harness.ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(count)
        ]
        try:
            for cell in made:
                harness.wait_beating(cell.engine, count)
            yield processes
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(timeout=90)


@dataclass
class Drain:
    rate: float  # actions per second
    workers_us: float  # the workers' CPU per action, microseconds
    servers_us: float  # the servers' CPU per action
    wal_bytes: float  # WAL per action, every server
    load: str = ""


def drain(side: str, servers: list[OwnPostgres], total: int) -> Drain:
    names = ["eu"] if side in ("1 db", "1 cell") else ["eu", "us", "ap"]
    used = servers[:3] if side == "3 cells 3 servers" else servers[:1]
    tag = side.replace(" ", "_")
    with cells(used, names, tag) as made, workers(made, all_cells=side != "1 db") as processes:
        each = total // len(made)
        engines = {server.port: create_engine(server.url, pool_size=1) for server in used}
        try:
            cpu0 = sum(process_cpu(p.pid) for p in processes)
            server0 = sum(server_cpu(s) for s in used)
            wal0 = sum(wal_lsn(e) for e in engines.values())
            started = time.perf_counter()
            for cell in made:
                harness.bulk_admit(cell.engine, each, LANES // len(made), lane_prefix=f"{cell.name}-lane")
            left = list(made)
            while left:
                left = [cell for cell in left if harness.unended(cell.engine) > 0]
                if left:
                    time.sleep(POLL_SECONDS)
                if time.perf_counter() - started > 600:
                    raise RuntimeError(f"{side}: not drained after 600 s")
            seconds = time.perf_counter() - started
            cpu = sum(process_cpu(p.pid) for p in processes) - cpu0
            server = sum(server_cpu(s) for s in used) - server0
            wal = sum(wal_lsn(e) for e in engines.values()) - wal0
        finally:
            for engine in engines.values():
                engine.dispose()
        done = 0
        for cell in made:
            with cell.engine.connect() as conn:
                done += int(conn.execute(text("SELECT count(*) FROM agent_action WHERE state = 'DONE'")).scalar_one())
        if done != each * len(made):
            raise RuntimeError(f"{side}: {done} of {each * len(made)} actions DONE")
        n = each * len(made)
        return Drain(n / seconds, cpu / n * 1e6, server / n * 1e6, wal / n)


@dataclass
class Idle:
    workers: float  # CPU seconds per second, both workers
    server: float


def idle(servers: list[OwnPostgres], count: int, seconds: float) -> Idle:
    names = ["eu", "us", "ap"][:count]
    with cells(servers[:1], names, f"idle{count}") as made, workers(made, all_cells=True) as processes:
        time.sleep(2)  # past the start-up's first sweeps
        cpu0, server0 = sum(process_cpu(p.pid) for p in processes), server_cpu(servers[0])
        time.sleep(seconds)  # a measured interval, not a synchronisation
        cpu, server = sum(process_cpu(p.pid) for p in processes) - cpu0, server_cpu(servers[0]) - server0
        return Idle(cpu / seconds, server / seconds)


def prefect_cpu(pid: int) -> float:
    """CPU seconds of the Prefect server: its process (with the children it reaped) and its live children."""
    import psutil

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(value) for value in fields[11:15]) / TICKS
    for child in psutil.Process(pid).children(recursive=True):
        try:
            total += process_cpu(child.pid)
        except OSError:
            continue
    return total


def prefect_costs(rounds: int, checks: int, runs: int) -> None:
    """The Prefect server's CPU per relay check and per flow run (see the module docstring)."""
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkerFilter,
        WorkerFilterStatus,
    )
    from prefect.client.schemas.objects import State, StateType
    from prefect.states import Completed, Pending, Running

    from demo.stack import free_port
    from tests.prefect_server import PrefectServer, serve

    home = Path(tempfile.mkdtemp(prefix="bench-cells-prefect-"))
    server = PrefectServer(f"http://127.0.0.1:{free_port()}", home)
    served = serve(server)
    next(served)
    try:
        pid = _prefect_pid(server)

        async def setup() -> tuple[UUID, str]:
            async with get_client() as client:
                await client.create_work_pool(WorkPoolCreate(name="outbox", type="process"))
                flow_id = await client.create_flow_from_name("outbox-drain")
                deployment = await client.create_deployment(flow_id, "outbox-drain-eu", work_pool_name="outbox")
                return deployment, "outbox"

        deployment_id, pool = asyncio.run(setup())

        async def check_many(n: int) -> None:
            async with get_client() as client:
                for _ in range(n):
                    await client.read_flow_runs(
                        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                        flow_run_filter=FlowRunFilter(
                            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))
                        ),
                        limit=200,
                    )
                    await client.read_workers_for_work_pool(
                        pool, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
                    )

        async def run_many(n: int) -> None:
            async with get_client() as client:
                for _ in range(n):
                    run = await client.create_flow_run_from_deployment(deployment_id)
                    states: list[State[Any]] = [Pending(), Running(), Completed()]
                    for state in states:
                        await client.set_flow_run_state(run.id, state, force=True)

        asyncio.run(check_many(20))  # warm
        asyncio.run(run_many(5))
        per: dict[str, list[float]] = {"check": [], "run": []}
        for rnd in range(rounds):
            for what in ("check", "run") if rnd % 2 == 0 else ("run", "check"):
                before, load = prefect_cpu(pid), load_average()
                started = time.perf_counter()
                asyncio.run(check_many(checks) if what == "check" else run_many(runs))
                seconds = time.perf_counter() - started
                n = checks if what == "check" else runs
                per[what].append((prefect_cpu(pid) - before) / n * 1000)
                print(
                    f"  round {rnd + 1} {what:5} {per[what][-1]:6.2f} ms of the server's CPU each,"
                    f" {n / seconds:6.1f} a second (load {load} / {load_average()})",
                    flush=True,
                )
        print(f"\nPrefect server's CPU per relay check: {spread(per['check'], 2)} ms")
        print(f"Prefect server's CPU per flow run (created, Pending, Running, Completed): {spread(per['run'], 2)} ms")
    finally:
        next(served, None)


def _prefect_pid(server: object) -> int:
    """The `prefect server start` process serving `server`'s port (this process's child)."""
    import psutil

    port = int(str(getattr(server, "url", "")).rpartition(":")[2])
    for child in psutil.Process().children(recursive=False):
        if "server" in child.cmdline() and str(port) in child.cmdline():
            return int(child.pid)
    raise RuntimeError("the Prefect server's process was not found")


def spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=12000, help="N: actions per drain, over all its cells")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--no-three-servers", action="store_true", help="leave out the 3-servers side")
    parser.add_argument("--prefect", action="store_true", help="the Prefect server's cost per check and run")
    parser.add_argument("--checks", type=int, default=300)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    if args.prefect:
        print(f"load average at the start: {load_average()}; uptime: {_uptime()}", flush=True)
        prefect_costs(args.rounds, args.checks, args.runs)
        print(f"load average at the end: {load_average()}; uptime: {_uptime()}")
        return
    sides = [s for s in SIDES if not (args.no_three_servers and s == "3 cells 3 servers")]
    print(f"load average at the start: {load_average()}; uptime: {_uptime()}", flush=True)
    with ExitStack() as stack:
        servers = []
        for _ in range(3 if "3 cells 3 servers" in sides else 1):
            server = OwnPostgres()
            stack.callback(server.stop)
            servers.append(server)
        drains: dict[str, list[Drain]] = {side: [] for side in sides}
        idles: dict[int, list[Idle]] = {1: [], 3: []}
        for rnd in range(args.rounds):
            for side in sides[rnd % len(sides) :] + sides[: rnd % len(sides)]:
                before = load_average()
                result = drain(side, servers, args.actions)
                result.load = f"{before} / {load_average()}"
                drains[side].append(result)
                print(
                    f"  round {rnd + 1} {side:18} {result.rate:7.0f} actions/s, workers {result.workers_us:5.0f} µs,"
                    f" servers {result.servers_us:5.0f} µs, WAL {result.wal_bytes:5.0f} B an action"
                    f" (load {result.load})",
                    flush=True,
                )
            for count in (1, 3) if rnd % 2 == 0 else (3, 1):
                before = load_average()
                watched = idle(servers, count, args.idle_seconds)
                idles[count].append(watched)
                print(
                    f"  round {rnd + 1} idle, {count} empty cell(s): workers {watched.workers * 1000:5.1f} ms/s,"
                    f" server {watched.server * 1000:5.1f} ms/s (load {before} / {load_average()})",
                    flush=True,
                )
    print(f"\nload average at the end: {load_average()}; uptime: {_uptime()}")
    print(f"\n{args.actions} no-op actions a drain, {args.rounds} rounds; median (min-max) of the rounds\n")
    print("| side | actions/s | workers' CPU per action (µs) | servers' CPU per action (µs) | WAL per action (B) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for side, runs in drains.items():
        print(
            f"| {side} | {spread([r.rate for r in runs])} | {spread([r.workers_us for r in runs])}"
            f" | {spread([r.servers_us for r in runs])} | {spread([r.wal_bytes for r in runs])} |"
        )
    base = drains["1 db"]
    for side in sides[1:]:
        ratios = [r.rate / b.rate for r, b in zip(drains[side], base, strict=True)]
        print(f"\n{side} / 1 db, actions/s per round: {', '.join(f'{x:.2f}' for x in ratios)}", end="")
    print("\n\n| idle, both workers | workers' CPU (ms/s) | server's CPU (ms/s) |\n| --- | ---: | ---: |")
    for count, samples in idles.items():
        print(
            f"| {count} empty cell(s) | {spread([w.workers * 1000 for w in samples], 1)}"
            f" | {spread([w.server * 1000 for w in samples], 1)} |"
        )
    pairs = list(zip(idles[1], idles[3], strict=True))
    per_cell = [(three.workers - one.workers) / 2 / 2 * 1000 for one, three in pairs]
    per_cell_server = [(three.server - one.server) / 2 / 2 * 1000 for one, three in pairs]
    print(
        f"\nidle cost of one cell to one worker: worker {spread(per_cell, 2)} ms/s,"
        f" server {spread(per_cell_server, 2)} ms/s"
    )


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


if __name__ == "__main__":
    main()
