"""outbox side by side with pgqueuer, procrastinate and DBOS, and against the database's own limit.

    .venv-bench/bin/python -m bench.compare [--jobs 50000] [--step-seconds 20] [--rounds 2] [--skip ...]

One PostgreSQL (embedded 18, or OUTBOX_BENCH_DATABASE_URL), a fresh database per run, the systems
alternated within every scenario (each round in a rotated order) so that drift hits all alike:
1. burn-down: N no-op jobs committed in one transaction, drained by 2 worker processes: jobs/s;
   the same with 1 and 4 workers for the throughput-vs-workers plot (smaller N, time-capped);
   pgqueuer runs as two systems, at its default batch size (pgqueuer-10) and its best documented one
   (pgqueuer-50); `--only pgqueuer` takes both
2. steady state: a producer enqueues one job per transaction at a fixed rate for S seconds; a step
   search for the highest rate at which the backlog stops growing (namastack's criterion)
3. pickup latency: enqueue commit to job start, p50/p95/p99, at 50 jobs/s
4. lanes: 200 lanes x 250 jobs with per-key serial execution: jobs/s, and whether order held
5. the limit: the same row writes as SQL-only loops (`bench.peers.sql_loop`: the bare table, the
   contract-minimal table, outbox's schema and statements; alternated, one per round, each round rotated),
   with their backends' CPU per action, and pgbench's simple-update
6. cost: peak RSS of one worker (VmHWM), CPU seconds per 1,000 jobs in the workers and in PostgreSQL: every
   process of the server, read from /proc (utime + stime), by kind (the workers' backends, the bench's own
   poll of the backlog, WAL writer, checkpointer, background writer, autovacuum, processes that ended)
Prints one table with outbox/peer ratios and every round, writes plots to --plots (made if new), and the
Markdown to --markdown.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench import harness
from bench.peers import ROOT, System, WorkerSpec, base_env, python
from bench.peers import sql_loop as sql_loop_module
from bench.peers.common import JobRecord, read_produced, read_records
from bench.peers.dbos_peer import Dbos
from bench.peers.outbox_peer import Outbox
from bench.peers.pgqueuer_peer import DEFAULT_BATCH_SIZE, Pgqueuer
from bench.peers.procrastinate_peer import Procrastinate

# outbox at its best documented settings: bigger batches (flags, no code change) and a producer on psycopg
# 3 (enqueue on the application's psycopg connection); its defaults run the burn-down as well
TUNED = ("--concurrency", "256", "--claim-batch", "200")
# pgqueuer at its default batch size and at its best documented one (50), as two systems
SYSTEMS: list[System] = [
    Outbox("outbox", TUNED, driver="psycopg"),
    Pgqueuer(DEFAULT_BATCH_SIZE),
    Pgqueuer(50),
    Procrastinate(),
    Dbos(),
]
DEFAULTS = Outbox("outbox-defaults")
WORK = ROOT / ".outbox" / "compare"


# ---- processes and databases ------------------------------------------------------------------------


def start(spec: WorkerSpec, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(spec.argv, env=spec.env or base_env(), cwd=ROOT, stdout=out, stderr=out)


def stop(processes: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """SIGTERM each by PID; SIGKILL what has not exited after `timeout`."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def empty_database(server: str, name: str) -> Iterator[str]:
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# the database's committed transactions (its own counter; the drain's polling reads roll back)
COMMITTED = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


def count(url: str, sql: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql)).scalar_one())
    finally:
        engine.dispose()


class Server:
    """The PostgreSQL under test, and the CPU its processes used (live backends + reaped ones)."""

    def __init__(self, url: str) -> None:
        self.url = url
        engine = create_engine(url)
        with engine.connect() as conn:
            backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            self.version = str(conn.execute(text("SHOW server_version")).scalar_one())
            self.postmaster = psutil.Process(psutil.Process(backend).ppid())
        engine.dispose()

    def wal_position(self) -> int:
        """Where the server inserts its next WAL record, in bytes from the start (the whole server's)."""
        return count(self.url, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint")

    def cpu_seconds(self) -> float:
        return self.cpu_reading().total

    def cpu_reading(self) -> CpuReading:
        """Every process of the server, from /proc: the postmaster, each live child by pid with its title, and the
        children that ended (the postmaster's reaped children's times)."""
        pm = self.postmaster.pid
        own, ended = proc_cpu(pm)
        children: dict[int, tuple[str, float]] = {}
        for child in self.postmaster.children():
            with contextlib.suppress(OSError, psutil.Error):
                children[child.pid] = (process_title(child.pid), proc_cpu(child.pid)[0])
        return CpuReading(own, ended, children)


# the titles of a server's own processes (`postgres: <title>`); every other child is a client's backend
BACKGROUND = (
    "checkpointer", "background writer", "walwriter", "autovacuum launcher", "autovacuum worker",
    "logical replication launcher", "io worker", "walsummarizer", "walsender", "startup", "archiver",
)  # fmt: skip
TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> tuple[float, float]:
    """utime + stime of `pid`, and cutime + cstime (its children that ended and were waited for), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS


def process_title(pid: int) -> str:
    title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    name = title.removeprefix("postgres: ")
    return next((b for b in BACKGROUND if name.startswith(b)), "client backends")


@dataclass(frozen=True)
class CpuReading:
    postmaster: float
    ended: float  # the children that ended, all their life
    children: dict[int, tuple[str, float]]  # live children: pid -> (kind of process, CPU seconds)

    @property
    def total(self) -> float:
        return self.postmaster + self.ended + sum(cpu for _, cpu in self.children.values())

    def since(self, start: CpuReading, *, apart: dict[int, str]) -> dict[str, float]:
        """CPU seconds spent since `start`, by kind of process; the pids of `apart` under names of their own. A
        child that ended meanwhile counts under "ended during the run" (all its life, less what it had spent
        at `start`)."""
        parts: dict[str, float] = defaultdict(float)
        parts["postmaster"] = self.postmaster - start.postmaster
        for pid, (kind, cpu) in self.children.items():
            before = start.children.get(pid, (kind, 0.0))[1]
            parts[apart.get(pid, kind)] += cpu - before
        gone = sum(cpu for pid, (_, cpu) in start.children.items() if pid not in self.children)
        parts["ended during the run"] = self.ended - start.ended - gone
        return dict(parts)


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


# ---- one run: workers drain a preloaded backlog ------------------------------------------------------


@dataclass
class Drain:
    system: str
    workers: int
    jobs: int
    done: int
    seconds: float
    capped: bool
    worker_cpu: float
    db_cpu: float
    peak_rss: int
    duplicates: int
    missing: int
    order_violations: int = 0
    overlaps: int = 0
    commits: int = 0  # transactions the database committed during the drain
    wal_bytes: int = 0  # WAL the server wrote during the drain
    # the server's CPU seconds by kind of process: client backends (the workers'), the bench's poll of the
    # backlog, walwriter, checkpointer, background writer, autovacuum, the processes that ended meanwhile
    db_cpu_parts: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.done / self.seconds


def drain(
    server: Server,
    system: System,
    *,
    workers: int,
    jobs: int,
    lanes: int | None,
    cap: float,
    tag: str,
    profile: Path | None = None,
) -> Drain:
    run_dir = WORK / f"{tag}-{system.name}-{workers}w"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    with empty_database(server.url, f"cmp_{system.name.lower()}") as url:
        system.prepare(url)
        records = [run_dir / f"record-{i}" for i in range(workers)]
        ready = [run_dir / f"ready-{i}" for i in range(workers)]
        processes = [
            start(system.worker(url, records[i], ready[i], lanes is not None), run_dir / f"worker-{i}.log")
            for i in range(workers)
        ]
        try:
            system.wait_ready(url, ready)
            cpu0 = sum(cpu_seconds(p.pid) for p in processes)
            spy = start_profiler(processes[0].pid, profile) if profile else None
            t0 = system.preload(url, jobs, lanes) or time.monotonic()
            engine = create_engine(url)
            with engine.connect() as conn:
                poller = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                conn.rollback()
                db0, wal0, commits0 = server.cpu_reading(), server.wal_position(), count(url, COMMITTED)
                pending_sql = text(system.pending_sql())
                while (pending := int(conn.execute(pending_sql).scalar_one())) > 0:
                    conn.rollback()
                    if time.monotonic() - t0 > cap:
                        break
                    time.sleep(0.1)
                seconds = time.monotonic() - t0
                db_parts = server.cpu_reading().since(db0, apart={poller: "the bench's poll of the backlog"})
            engine.dispose()
            db_cpu = sum(db_parts.values())
            wal_bytes = server.wal_position() - wal0
            worker_cpu = sum(cpu_seconds(p.pid) for p in processes) - cpu0
            rss = max(peak_rss_bytes(p.pid) for p in processes)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
        finally:
            stop(processes)
        commits = count(url, COMMITTED) - commits0  # the stopped workers' backends reported theirs as they ended
    rows = [r for path in records for r in read_records(path)]
    result = Drain(
        system.name,
        workers,
        jobs,
        jobs - pending,
        seconds,
        pending > 0,
        worker_cpu,
        db_cpu,
        rss,
        duplicates=len(rows) - len({r[0] for r in rows}),
        missing=0 if pending > 0 else max(0, jobs - len({r[0] for r in rows})),
    )
    result.commits, result.wal_bytes, result.db_cpu_parts = commits, wal_bytes, db_parts
    if lanes is not None:
        result.order_violations, result.overlaps = check_lanes(rows)
    return result


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy on one worker, sampling at 250 Hz until SIGINT; writes `out` (folded stacks)."""
    spy = Path(sys.executable).parent / "py-spy"
    argv = [str(spy), "record", "-p", str(pid), "-r", "250", "-f", "raw", "-o", str(out), "--nonblocking"]
    return start(WorkerSpec(argv), out.with_suffix(".log"))


def check_lanes(rows: list[JobRecord]) -> tuple[int, int]:
    """(jobs that started before an earlier job of their lane, jobs that started before it ended)."""
    by_lane: dict[str, list[JobRecord]] = defaultdict(list)
    for row in rows:
        by_lane[row[1]].append(row)
    order = overlap = 0
    for lane_rows in by_lane.values():
        lane_rows.sort(key=lambda r: r[3])
        for before, after in itertools.pairwise(lane_rows):
            order += after[2] < before[2]
            overlap += after[3] < before[4]
    return order, overlap


# ---- one run: a producer at a fixed rate -------------------------------------------------------------


@dataclass
class Steady:
    system: str
    rate: float
    achieved: float
    growth: float  # backlog jobs/s over the second half
    end_backlog: int
    passed: bool
    latencies_ms: list[float] = field(default_factory=list, repr=False)


def produce_run(db: Server, system: System, rate: float, seconds: float, tag: str) -> Steady:
    run_dir = WORK / f"{tag}-{system.name}-{rate:.0f}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    with empty_database(db.url, f"cmp_{system.name.lower()}") as url:
        system.prepare(url)
        records = [run_dir / f"record-{i}" for i in range(2)]
        ready = [run_dir / f"ready-{i}" for i in range(2)]
        processes = [
            start(system.worker(url, records[i], ready[i], False), run_dir / f"worker-{i}.log") for i in range(2)
        ]
        out = run_dir / "produced"
        try:
            system.wait_ready(url, ready)
            producer = start(system.producer(url, out, rate, seconds), run_dir / "producer.log")
            samples: list[tuple[float, int]] = []
            engine = create_engine(url)
            pending_sql = text(system.pending_sql())
            t0 = time.perf_counter()
            with engine.connect() as conn:
                while producer.poll() is None:
                    samples.append((time.perf_counter() - t0, int(conn.execute(pending_sql).scalar_one())))
                    conn.rollback()
                    time.sleep(0.25)
                end_backlog = int(conn.execute(pending_sql).scalar_one())
                conn.rollback()
                # let the backlog drain (for the latencies), for as long as the run took at most
                tail = time.perf_counter()
                while int(conn.execute(pending_sql).scalar_one()) > 0 and time.perf_counter() - tail < seconds:
                    conn.rollback()
                    time.sleep(0.1)
            engine.dispose()
        finally:
            stop(processes)
    committed, achieved = read_produced(out) if out.exists() else ({}, 0.0)
    started = {r[0]: r[3] for path in records for r in read_records(path)}
    latencies = sorted((started[k] - at) / 1e6 for k, at in committed.items() if k in started)
    half = [s for s in samples if s[0] >= seconds / 2]
    growth = slope(half) if len(half) >= 4 else float("inf")
    passed = achieved >= 0.97 * rate and growth <= max(0.02 * rate, 5.0) and end_backlog <= 2 * rate
    return Steady(system.name, rate, achieved, growth, end_backlog, passed, latencies)


def slope(points: list[tuple[float, int]]) -> float:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0


def step_search(db: Server, start_rates: dict[str, float], seconds: float, max_steps: int) -> dict[str, list[Steady]]:
    """Per system: up by 1.4x while it passes, then halve the gap; every step alternates the systems."""
    steps: dict[str, list[Steady]] = {s.name: [] for s in SYSTEMS}
    bounds: dict[str, tuple[float, float | None]] = {s.name: (0.0, None) for s in SYSTEMS}
    next_rate = {name: round_rate(rate) for name, rate in start_rates.items()}
    for step in range(max_steps):
        order = SYSTEMS[step % len(SYSTEMS) :] + SYSTEMS[: step % len(SYSTEMS)]
        for system in order:
            lo, hi = bounds[system.name]
            if hi is not None and lo > 0 and hi / lo < 1.12:
                continue
            result = produce_run(db, system, next_rate[system.name], seconds, "steady")
            steps[system.name].append(result)
            print(
                f"  steady {system.name:13} {result.rate:7.0f}/s: achieved {result.achieved:7.0f}/s,"
                f" backlog growth {result.growth:8.1f}/s, end backlog {result.end_backlog:6d}"
                f" -> {'pass' if result.passed else 'FAIL'}",
                flush=True,
            )
            if result.passed:
                lo = max(lo, result.rate)
            else:
                hi = result.rate if hi is None else min(hi, result.rate)
            bounds[system.name] = (lo, hi)
            if hi is None:
                next_rate[system.name] = round_rate(lo * 1.4)
            elif lo == 0:
                next_rate[system.name] = round_rate(hi * 0.6)
            else:
                next_rate[system.name] = round_rate((lo + hi) / 2)
    return steps


def round_rate(rate: float) -> float:
    digits = max(0, len(str(int(rate))) - 2)
    return float(round(rate, -digits)) or 10.0


def best_pass(steps: list[Steady]) -> float:
    return max((s.rate for s in steps if s.passed), default=0.0)


# ---- the limit -------------------------------------------------------------------------------------


# the SQL-only loops run in every round, in a rotated order; lifecycle once after them
LOOPS = ("minimal", "contract-minimal", "schema")


@dataclass
class Loop:
    variant: str
    rate: float  # jobs/s of the two processes together
    backend_us: float  # CPU of the loops' two server backends, µs per job
    commits: float  # transactions committed per job
    wal_bytes: float  # WAL the server wrote per job


def sql_loop(db: Server, variant: str, jobs: int, seconds: float) -> Loop:
    run_dir = WORK / f"limit-{variant}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    with empty_database(db.url, "cmp_limit") as url:
        libpq = url.replace("postgresql+psycopg://", "postgresql://", 1)
        if variant == "schema":
            Outbox().prepare(url)
            Outbox().preload(url, jobs, None)
            engine = create_engine(url)
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
            engine.dispose()
        elif variant == "contract-minimal":
            sql_loop_module.create_spec(libpq, jobs)
        else:
            sql_loop_module.create_minimal(libpq, jobs if variant == "minimal" else 0)
        outs = [run_dir / f"out-{i}" for i in range(2)]
        argv = [python(), "-m", "bench.peers.sql_loop", variant, "--url", libpq]
        if variant == "lifecycle":
            argv += ["--seconds", str(seconds)]
        wal0, commits0 = db.wal_position(), count(url, COMMITTED)
        processes = [
            start(WorkerSpec([*argv, "--out", str(out)]), run_dir / f"loop-{i}.log") for i, out in enumerate(outs)
        ]
        for process in processes:
            process.wait(timeout=600)
        wal_bytes, commits = db.wal_position() - wal0, count(url, COMMITTED) - commits0
    results = [sql_loop_module.read_result(out) for out in outs]
    done = sum(r[0] for r in results)
    rate = done / ((max(r[2] for r in results) - min(r[1] for r in results)) / 1e9)
    return Loop(variant, rate, sum(r[3] for r in results) / done * 1e6, commits / done, wal_bytes / done)


def pgbench(db: Server, clients: int, seconds: float) -> float:
    parsed = make_url(db.url)
    with empty_database(db.url, "cmp_pgbench") as url:
        name = make_url(url).database or ""
        conn = ["-h", str(parsed.query.get("host") or parsed.host or "127.0.0.1"), "-U", parsed.username or "postgres"]
        if parsed.port:
            conn += ["-p", str(parsed.port)]
        subprocess.run(["pgbench", *conn, "-i", "-q", "-s", "10", name], check=True, capture_output=True)
        out = subprocess.run(
            [
                "pgbench",
                *conn,
                "-N",
                "-M",
                "prepared",
                "-c",
                str(clients),
                "-j",
                str(min(clients, 2)),
                "-T",
                str(int(seconds)),
                name,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    match = re.search(r"tps = ([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"pgbench printed no tps:\n{out}")
    return float(match.group(1))


# ---- the report ------------------------------------------------------------------------------------


def quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else float("nan")


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or value != value:
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or not theirs or ours != ours or theirs != theirs:
        return "n/a"
    return f"{ours / theirs:.2f}"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("outbox", "pgqueuer", "procrastinate", "dbos", "asyncpg", "psycopg", "SQLAlchemy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50_000, help="burn-down backlog")
    parser.add_argument("--rounds", type=int, default=2, help="burn-down rounds (median reported)")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds a burn-down may take before it is cut")
    parser.add_argument("--sweep-jobs", type=int, default=20_000)
    parser.add_argument("--sweep-cap", type=float, default=15.0)
    parser.add_argument("--step-seconds", type=float, default=15.0)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--lanes", type=int, default=200)
    parser.add_argument("--per-lane", type=int, default=250)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["burn", "sweep", "steady", "latency", "lanes", "limit"]
    )
    parser.add_argument(
        "--only", nargs="*", default=None, help="systems to run (names; pgqueuer takes pgqueuer-10 and pgqueuer-50)"
    )
    parser.add_argument("--markdown", type=Path, default=WORK / "table.md")
    parser.add_argument("--plots", type=Path, default=ROOT / "bench", help="folder of the plots (made if new)")
    args = parser.parse_args()
    global SYSTEMS
    if args.only:
        SYSTEMS = [s for s in SYSTEMS if s.name in args.only or s.name.split("-")[0] in args.only]
    WORK.mkdir(parents=True, exist_ok=True)
    args.plots.mkdir(parents=True, exist_ok=True)
    db = Server(harness.server_url())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB,"
        f" Python {platform.python_version()}, PostgreSQL {db.version}",
        flush=True,
    )
    results: dict[str, Any] = {"versions": versions(), "server": db.version, "args": sys.argv[1:]}
    loads: list[tuple[str, str]] = []

    def note_load(moment: str) -> None:
        """The load average (1, 5, 15 min) now: the machine may be shared."""
        loads.append((moment, " ".join(f"{v:.2f}" for v in os.getloadavg())))
        print(f"  load average {moment}: {loads[-1][1]}", flush=True)

    note_load("at the start")

    burn: dict[str, list[Drain]] = defaultdict(list)
    if "burn" not in args.skip:
        everyone = [*SYSTEMS, DEFAULTS] if any(s.name == "outbox" for s in SYSTEMS) else SYSTEMS
        for rnd in range(args.rounds):
            order = everyone[rnd % len(everyone) :] + everyone[: rnd % len(everyone)]
            for system in order:
                run = drain(db, system, workers=2, jobs=args.jobs, lanes=None, cap=args.cap, tag="burn")
                burn[system.name].append(run)
                print(
                    f"  burn-down {system.name:13} round {rnd + 1}: {run.rate:8,.0f} jobs/s {describe(run)}", flush=True
                )
    if "burn" not in args.skip:
        note_load("after the burn-down")
    results["burn"] = {k: [asdict(r) for r in v] for k, v in burn.items()}

    sweep: dict[str, dict[int, float]] = defaultdict(dict)
    if "sweep" not in args.skip:
        for workers in (1, 4):
            for system in SYSTEMS:
                run = drain(
                    db, system, workers=workers, jobs=args.sweep_jobs, lanes=None, cap=args.sweep_cap, tag="sweep"
                )
                sweep[system.name][workers] = run.rate
                print(
                    f"  sweep {system.name:13} {workers} workers: {run.rate:8,.0f} jobs/s {describe(run)}", flush=True
                )
        for name, runs in burn.items():
            if name in sweep:
                sweep[name][2] = statistics.median(r.rate for r in runs)
    if "sweep" not in args.skip:
        note_load("after the sweep")
    results["sweep"] = sweep

    steady: dict[str, list[Steady]] = {}
    if "steady" not in args.skip:
        # from half the burn-down rate, at most 1,000/s: a Python producer here makes about 1,000 commits/s
        starts = {s.name: min(0.5 * statistics.median(r.rate for r in burn[s.name]), 1000.0) for s in SYSTEMS}
        steady = step_search(db, starts, args.step_seconds, args.max_steps)
    if "steady" not in args.skip:
        note_load("after the steady state")
    results["steady"] = {k: [{**asdict(s), "latencies_ms": None} for s in v] for k, v in steady.items()}

    latency: dict[str, list[float]] = {}
    if "latency" not in args.skip:
        for system in SYSTEMS:
            probe = produce_run(db, system, 50.0, 12.0, "latency")
            latency[system.name] = probe.latencies_ms
            lat = probe.latencies_ms
            print(
                f"  pickup {system.name:13} p50 {quantile(lat, 50):6.1f} ms, p95 {quantile(lat, 95):6.1f} ms,"
                f" p99 {quantile(lat, 99):6.1f} ms ({len(lat)} jobs)",
                flush=True,
            )
    if "latency" not in args.skip:
        note_load("after the pickup")
    results["latency"] = {k: {str(q): quantile(v, q) for q in (50, 95, 99)} for k, v in latency.items()}

    lanes: dict[str, Drain] = {}
    if "lanes" not in args.skip:
        for system in SYSTEMS:
            if not system.lanes_feature:
                continue
            run = drain(
                db, system, workers=2, jobs=args.lanes * args.per_lane, lanes=args.lanes, cap=args.cap, tag="lanes"
            )
            lanes[system.name] = run
            print(
                f"  lanes {system.name:13} {run.rate:8,.0f} jobs/s {describe(run)}, order violations"
                f" {run.order_violations}, overlaps {run.overlaps}",
                flush=True,
            )
    if "lanes" not in args.skip:
        note_load("after the lanes")
    results["lanes"] = {k: asdict(v) for k, v in lanes.items()}

    loops: dict[str, list[Loop]] = defaultdict(list)
    limit: dict[str, float] = {}
    if "limit" not in args.skip:
        for rnd in range(args.rounds):
            for variant in LOOPS[rnd % len(LOOPS) :] + LOOPS[: rnd % len(LOOPS)]:
                looped = sql_loop(db, variant, args.jobs, args.step_seconds)
                loops[variant].append(looped)
                print(
                    f"  limit {variant:13} round {rnd + 1}: {looped.rate:8,.0f} jobs/s,"
                    f" {looped.backend_us:6.1f} µs of backend CPU per job",
                    flush=True,
                )
        limit = {variant: statistics.median(r.rate for r in runs) for variant, runs in loops.items()}
        limit["lifecycle"] = sql_loop(db, "lifecycle", args.jobs, args.step_seconds).rate
        limit["pgbench_c2"] = pgbench(db, 2, 15)
        limit["pgbench_c8"] = pgbench(db, 8, 15)
        print("  limit " + ", ".join(f"{k} {v:,.0f}/s" for k, v in limit.items()), flush=True)
    if "limit" not in args.skip:
        note_load("after the limit")
    results["limit"] = limit
    results["loops"] = {k: [asdict(r) for r in v] for k, v in loops.items()}

    results["load"] = loads
    (WORK / "results.json").write_text(json.dumps(results, indent=1, default=str))
    table = report(burn, steady, latency, lanes, limit, loops)
    table += "\n\nload average (1, 5, 15 min): " + "; ".join(f"{moment} {load}" for moment, load in loads)
    print(table)
    args.markdown.write_text(table + "\n")
    plot(sweep, latency, args.plots)


def describe(run: Drain) -> str:
    notes = [f"{run.done:,}/{run.jobs:,} in {run.seconds:.1f} s"]
    if run.capped:
        notes.append("CUT at the cap")
    if run.duplicates or run.missing:
        notes.append(f"duplicates {run.duplicates}, missing {run.missing}")
    return "(" + ", ".join(notes) + ")"


def report(
    burn: dict[str, list[Drain]],
    steady: dict[str, list[Steady]],
    latency: dict[str, list[float]],
    lanes: dict[str, Drain],
    limit: dict[str, float],
    loops: dict[str, list[Loop]],
) -> str:
    names = [s.name for s in SYSTEMS]
    peers = [n for n in names if n != "outbox"]
    rows: list[tuple[str, dict[str, float | None], bool, int]] = []  # label, values, higher is better, digits

    def med(name: str, get: Any) -> float | None:
        runs = burn.get(name) or []
        return statistics.median(get(r) for r in runs) if runs else None

    rows.append(("burn-down, 2 workers (jobs/s)", {n: med(n, lambda r: r.rate) for n in names}, True, 0))
    # outbox at its defaults against every peer's burn-down (the peers' own cells repeat the row above)
    rows.append(
        (
            "burn-down, outbox with its defaults (64, claims of the free slots)",
            {**{p: med(p, lambda r: r.rate) for p in peers}, "outbox": med(DEFAULTS.name, lambda r: r.rate)},
            True,
            0,
        )
    )
    rows.append(
        (
            "steady state, highest passing rate (jobs/s)",
            {n: best_pass(steady[n]) if n in steady else None for n in names},
            True,
            0,
        )
    )
    for q in (50, 95, 99):
        rows.append(
            (
                f"pickup p{q} at 50/s (ms)",
                {n: quantile(latency[n], q) if n in latency else None for n in names},
                False,
                1,
            )
        )
    rows.append(
        ("lanes 200x250, serial per key (jobs/s)", {n: lanes[n].rate if n in lanes else None for n in names}, True, 0)
    )
    costs: list[tuple[str, Any, int]] = [
        ("peak RSS of one worker (MiB)", lambda r: r.peak_rss / 2**20, 0),
        ("worker CPU s per 1,000 jobs", lambda r: r.worker_cpu / r.done * 1000, 3),
        ("PostgreSQL CPU s per 1,000 jobs", lambda r: r.db_cpu / r.done * 1000, 3),
        ("commits per job", lambda r: r.commits / r.done, 2),
        ("WAL bytes per job", lambda r: r.wal_bytes / r.done, 0),
    ]
    for label, get, digits in costs:
        rows.append((label, {n: med(n, get) for n in names}, False, digits))
        if DEFAULTS.name in burn:
            at_defaults = {**{p: med(p, get) for p in peers}, "outbox": med(DEFAULTS.name, get)}
            rows.append((f"{label}, outbox at its defaults", at_defaults, False, digits))
    header = "| figure | " + " | ".join(names) + " | " + " | ".join(f"outbox/{p}" for p in peers) + " |"
    lines = [header, "|" + " --- |" * (1 + len(names) + len(peers))]
    for label, values, _higher, digits in rows:
        cells = [fmt(values.get(n), digits) for n in names]
        ratios = [ratio(values.get("outbox"), values.get(p)) for p in peers]
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    ours_burn = med("outbox", lambda r: r.rate)
    ours_steady = best_pass(steady["outbox"]) if "outbox" in steady else None
    if limit:
        lines += [
            "",
            "| the limit (2 clients unless said) | jobs or tps /s | outbox | outbox / limit |",
            "| --- | --- | --- | --- |",
        ]
        for key, label, ours in (
            ("minimal", "SQL-only loop: claim, fence, finish 50 at a time, bare table (vs burn-down)", ours_burn),
            (
                "contract-minimal",
                "SQL-only loop on the contract-minimal table: guard, unique lane index (vs burn-down)",
                ours_burn,
            ),
            ("schema", "SQL-only loop on outbox's own schema and statements (vs burn-down)", ours_burn),
            ("lifecycle", "SQL-only loop with one insert per transaction first (vs steady state)", ours_steady),
            ("pgbench_c2", "pgbench simple-update, 2 clients, tps (vs burn-down)", ours_burn),
            ("pgbench_c8", "pgbench simple-update, 8 clients, tps (vs burn-down)", ours_burn),
        ):
            if key in limit:
                lines.append(f"| {label} | {fmt(limit[key])} | {fmt(ours)} | {ratio(ours, limit[key])} |")
    if loops:
        lines += [
            "",
            "| SQL-only loop, 2 processes | jobs/s (median) | rounds | backend CPU µs per job (median) | rounds"
            " | commits per job | WAL bytes per job |",
            "| --- | ---: | --- | ---: | --- | ---: | ---: |",
        ]
        for variant, runs in loops.items():
            rates = " / ".join(fmt(r.rate) for r in runs)
            cpus = " / ".join(fmt(r.backend_us, 1) for r in runs)
            cpu = statistics.median(r.backend_us for r in runs)
            commits = statistics.median(r.commits for r in runs)
            wal = statistics.median(r.wal_bytes for r in runs)
            lines.append(
                f"| {variant} | {fmt(limit[variant])} | {rates} | {fmt(cpu, 1)} | {cpus} | {fmt(commits, 3)}"
                f" | {fmt(wal)} |"
            )
        if "schema" in limit and "contract-minimal" in limit:
            minimal = statistics.median(r.backend_us for r in loops["contract-minimal"])
            ours = statistics.median(r.backend_us for r in loops["schema"])
            lines.append(
                "\noutbox's schema loop against the contract-minimal loop:"
                f" {limit['contract-minimal'] / limit['schema']:.2f}x"
                f" the time per job, {ours / minimal:.2f}x the backend CPU"
                " (target <= 1.3x)"
            )
    if burn:
        lines += ["", *server_cpu_table(burn)]
    if burn:
        lines += [
            "",
            "burn-down rounds (jobs/s): "
            + "; ".join(f"{name} " + " / ".join(fmt(r.rate) for r in runs) for name, runs in burn.items()),
        ]
    return "\n".join(lines)


def server_cpu_table(burn: dict[str, list[Drain]]) -> list[str]:
    """Where the server's CPU goes in the burn-down: µs per job by kind of process, median of the rounds (the
    rounds after it), and the workers' own CPU beside it."""
    kinds = sorted({kind for runs in burn.values() for r in runs for kind in r.db_cpu_parts})
    lines = [
        "| server CPU µs per job, burn-down | " + " | ".join(burn) + " |",
        "| --- |" + " ---: |" * len(burn),
    ]

    def cell(runs: list[Drain], get: Any) -> str:
        values = [get(r) / r.done * 1e6 for r in runs if r.done]
        return f"{statistics.median(values):,.1f} ({' / '.join(f'{v:,.0f}' for v in values)})" if values else ""

    for kind in kinds:
        lines.append(
            f"| {kind} | "
            + " | ".join(cell(runs, lambda r, k=kind: r.db_cpu_parts.get(k, 0.0)) for runs in burn.values())
            + " |"
        )
    lines.append(
        "| **the whole server** | " + " | ".join(cell(runs, lambda r: r.db_cpu) for runs in burn.values()) + " |"
    )
    lines.append("| the workers | " + " | ".join(cell(runs, lambda r: r.worker_cpu) for runs in burn.values()) + " |")
    return lines


def plot(sweep: dict[str, dict[int, float]], latency: dict[str, list[float]], directory: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, by_workers in sweep.items():
            xs = sorted(by_workers)
            ax.plot(xs, [by_workers[x] for x in xs], marker="o", label=name)
        ax.set_xlabel("worker processes")
        ax.set_ylabel("jobs/s (burn-down of no-op jobs)")
        ax.set_xticks([1, 2, 4])
        ax.set_title("Throughput vs workers (2-core machine)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(directory / "compare-throughput.png", dpi=110)
        plt.close(fig)
    if latency:
        fig, ax = plt.subplots(figsize=(6, 4))
        names = list(latency)
        width = 0.25
        for i, q in enumerate((50, 95, 99)):
            values = [quantile(latency[n], q) for n in names]
            ax.bar([x + (i - 1) * width for x in range(len(names))], values, width, label=f"p{q}")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names)
        ax.set_yscale("log")
        ax.set_ylabel("enqueue commit to job start (ms, log)")
        ax.set_title("Pickup latency at 50 jobs/s")
        ax.grid(alpha=0.3, axis="y")
        ax.legend()
        fig.tight_layout()
        fig.savefig(directory / "compare-latency.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
