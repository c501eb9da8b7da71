"""What one cell's outage costs the other cells: their drain rate with every server up, and with one stopped.

    python -m bench.cells_outage [--actions 30000] [--outage 60] [--rounds 3] [--processes 2]

    three cells eu, us, ap, each a PostgreSQL server of its own (tests.chaos.postgres.OwnPostgres), started once
    every round, both sides in a rotated order, each on fresh databases (one per server, migrated, the
    benchmark kinds declared):
      N no-op actions per cell (bench.adapters: a real fence, no provider) committed at once over 64 lanes;
      PROCESSES `outbox run --all-cells` (shipped defaults, 64 attempts per cell in each) started; once every
      cell has ended an action, 5 s more, then a window of OUTAGE seconds:
        fault     ap's server is stopped (pg_ctl -m fast) at the window's start, started again at its end
        no fault  nothing happens
      ─▶ the actions eu and us ended inside the window (counted at its start and its end), per second; the
         seconds ap's backlog took to drain once it was back; the load average at the window's start

The window must end before eu and us run out of actions: a run in which they ran out is marked (its rate is
then a lower bound), and --actions should grow. Every action must end DONE, in every cell, on both sides.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from bench import harness, kinds
from outbox import migrate
from outbox.testing import install_kinds
from tests.chaos.postgres import OwnPostgres

ROOT = Path(__file__).resolve().parent.parent
CELLS = ("eu", "us", "ap")
STOPPED = "ap"
LANES = 64
SIDES = ("no fault", "fault")


@dataclass
class Run:
    others_rate: float  # eu and us: actions ended per second inside the window
    ran_out: bool  # eu or us had nothing left before the window ended
    stopped_drain: float  # seconds ap took to drain once back (no fault: from the window's end)
    load: str


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def described(values: list[float], digits: int = 0) -> str:
    """Median and spread (min-max) of the rounds."""
    return (
        f"median {statistics.median(values):,.{digits}f} (spread {min(values):,.{digits}f}-{max(values):,.{digits}f})"
    )


@contextmanager
def fresh_cells(servers: dict[str, OwnPostgres], name: str) -> Iterator[dict[str, tuple[str, Engine]]]:
    """A new database on each cell's server, migrated, with the benchmark kinds; dropped afterwards."""
    made: dict[str, tuple[str, Engine]] = {}
    admins = {
        cell: create_engine(server.url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
        for cell, server in servers.items()
    }
    try:
        for cell, server in servers.items():
            with admins[cell].connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            url = make_url(server.url).set(database=name).render_as_string(hide_password=False)
            engine = create_engine(url, pool_pre_ping=True)
            with engine.begin() as conn:
                migrate.upgrade(conn)
                install_kinds(conn, kinds.ALL)
            made[cell] = (url, engine)
        yield made
    finally:
        for _, engine in made.values():
            engine.dispose()
        for admin in admins.values():
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def start_executors(urls: dict[str, str], processes: int, home: Path) -> list[subprocess.Popen[bytes]]:
    cells = home / "cells.toml"
    cells.write_text("".join(f'[cells.{c}]\ndatabase_url_variable = "CELL_{c.upper()}_URL"\n' for c in urls))
    env = {
        **{k: v for k, v in os.environ.items() if k != "OUTBOX_DATABASE_URL"},
        **{f"CELL_{c.upper()}_URL": url for c, url in urls.items()},
        "OUTBOX_CELLS_FILE": str(cells),
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "outbox.cli", "run", "--all-cells", "--adapters", "bench.adapters:noop_adapters"]
    return [
        subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(processes)
    ]


def wait_until(deadline: float) -> None:
    """The window's length is the benchmark's subject: the clock, not a condition, ends it."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


def one_run(servers: dict[str, OwnPostgres], side: str, args: argparse.Namespace, home: Path) -> Run:
    with fresh_cells(servers, f"outbox_bench_cells_{os.getpid()}") as cells:
        for cell, (_, engine) in cells.items():
            harness.bulk_admit(engine, args.actions, LANES, lane_prefix=cell)
        running = start_executors({cell: url for cell, (url, _) in cells.items()}, args.processes, home)
        others = [engine for cell, (_, engine) in cells.items() if cell != STOPPED]
        try:
            deadline = time.monotonic() + 120
            while not all(harness.ended(engine) for _, engine in cells.values()):
                if time.monotonic() > deadline:
                    raise RuntimeError("a cell ended no action within 120 s")
                time.sleep(0.05)
            wait_until(time.monotonic() + 5)
            load = load_average()
            if side == "fault":
                servers[STOPPED].halt("fast")
            started = time.monotonic()
            before = sum(harness.ended(engine) for engine in others)
            wait_until(started + args.outage)
            after = sum(harness.ended(engine) for engine in others)
            took = time.monotonic() - started
            ran_out = any(harness.unended(engine) == 0 for engine in others)
            if side == "fault":
                servers[STOPPED].start()
            back = time.monotonic()
            harness.wait_drained(cells[STOPPED][1], timeout=900)
            stopped_drain = time.monotonic() - back
            for engine in others:
                harness.wait_drained(engine, timeout=900)
            if any(p.poll() is not None for p in running):
                raise RuntimeError("an executor exited")
            harness.stop(running)
        finally:
            for process in running:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
        for cell, (_, engine) in cells.items():
            with engine.connect() as conn:
                found: dict[str, int] = dict(
                    conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all()
                )
            if found != {"DONE": args.actions}:
                raise RuntimeError(f"cell {cell} ended {found}, not {args.actions} DONE")
    return Run((after - before) / took, ran_out, stopped_drain, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=30000, help="actions per cell")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds ap's server is stopped")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    print(f"load average at the start: {load_average()}", flush=True)
    with ThreadPoolExecutor(len(CELLS)) as pool:
        servers = dict(zip(CELLS, pool.map(lambda _: OwnPostgres(), CELLS), strict=True))
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}
    try:
        with tempfile.TemporaryDirectory(prefix="outbox-bench-cells-") as home:
            for r in range(args.rounds):
                figures = []
                for side in SIDES[r % 2 :] + SIDES[: r % 2]:
                    run = one_run(servers, side, args, Path(home))
                    runs[side].append(run)
                    out = " (eu or us ran out: a lower bound)" if run.ran_out else ""
                    figures.append(
                        f"{side}: eu+us {run.others_rate:,.0f}/s{out}, ap drained {run.stopped_drain:.1f} s after"
                        f" (load {run.load})"
                    )
                print(f"round {r + 1}: " + "; ".join(figures), flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print(f"load average at the end: {load_average()}")
    for side, values in runs.items():
        print(f"{side}: eu+us actions/s in the {args.outage:g} s window {described([v.others_rate for v in values])}")
        print(f"  ap drained after the window in {described([v.stopped_drain for v in values], 1)} s")
    ratios = [f.others_rate / n.others_rate for f, n in zip(runs["fault"], runs["no fault"], strict=True)]
    print(f"fault / no fault, per round {' '.join(f'{x:.2f}' for x in ratios)}: {described(ratios, 2)}x")


if __name__ == "__main__":
    main()
