"""Soak of the drain relay: the whole local stack for an hour, a trickle of emails, rolling restarts.

    python -m bench.drain_soak --minutes 60 --interval 20 --workers 3 [--database-url postgresql://...]

    fresh database (embedded PostgreSQL, or the empty one given) ─ demo.stack.Stack with N `outbox worker`
    replicas, deploy/prefect.yaml applied from a copy whose drain interval is --interval seconds
      ├─ a trickle of emails (--rate a second, through demo.run.enqueue_workload)
      ├─ the executor count read from agent_executor every 0.2 s (rows seen in the last 5 s)
      ├─ every --restart-every minutes one worker stopped in order and started again (a rolling deploy)
      └─▶ the drain runs from the Prefect API by final state, the longest stretches with no executor and
          with fewer than N, the handover overlaps, emails enqueued against delivered, duplicates at the sink

Every process is started here and stopped by PID (Stack.stop), also on Ctrl-C or SIGTERM. The stack's logs,
and soak.json (every executor's arrival and departure, its flow run, the restarts, the samples' change
points), stay in the work directory, ./.outbox/drain-soak/<UTC time> unless --workdir is given.

Reading the figures: a stretch is timed from the first sample in it to the first sample after it (0.2 s
resolution). The count is expected to be N in steady state, N + 1 from a tick's new executor until the
oldest hands over (a handover overlap), and below N only while a stopped worker's runs are replaced by
the next ticks (a restart window: from the SIGTERM to the first sample with N executors again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
from sqlalchemy import Engine, text

from demo.postgres import embedded_postgres_server
from demo.run import enqueue_workload
from demo.stack import Stack, descendants, kill_all
from examples.accounts import schema
from flows.worker import flow_run_processes
from outbox import migrate
from outbox.db import psycopg_url, sync_engine

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "deploy" / "prefect.yaml"
SHIPPED_INTERVAL = "      - interval: 300\n"
DEFAULT_INTERVAL = 300.0
SAMPLE_SECONDS = 0.2
# a row whose executor has not beaten (every second) for this long counts as gone
LIVE_SECONDS = 5.0
DEPLOYMENT = "outbox-drain/outbox-drain"


def log(message: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {message}", flush=True)


# ---- set-up --------------------------------------------------------------------------------------------


def accelerated_copy(interval: float, into: Path) -> Path:
    """deploy/prefect.yaml with the drain schedule's interval set to `interval` seconds; nothing else changed."""
    shipped = SHIPPED.read_text()
    if shipped.count(SHIPPED_INTERVAL) != 1:
        raise RuntimeError(f"{SHIPPED} no longer has exactly one {SHIPPED_INTERVAL.strip()!r}: update the soak")
    copy = into / "prefect-soak.yaml"
    copy.write_text(shipped.replace(SHIPPED_INTERVAL, f"      - interval: {interval:g}\n"))
    return copy


def prepare(engine: Engine) -> None:
    """outbox's schema and the example application's tables, on a database that has neither yet."""
    with engine.begin() as conn:
        exists = conn.execute(text("SELECT to_regclass('agent_action') IS NOT NULL")).scalar_one()
        if exists:
            raise SystemExit("the database given already holds an outbox store: give an empty database")
        migrate.upgrade(conn)
        schema.create(conn)


# ---- what runs beside the stack ------------------------------------------------------------------------


@dataclass
class Executor:
    executor_id: str
    arrived: float  # monotonic time of the first sample that held it
    left: float | None = None
    flow_run: str | None = None
    worker: str | None = None


@dataclass
class Sampler:
    """The live rows of agent_executor every SAMPLE_SECONDS, on a connection of its own."""

    engine: Engine
    worker_pids: Callable[[], dict[int, str]]
    samples: list[tuple[float, int]] = field(default_factory=list)
    executors: dict[str, Executor] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        live: set[str] = set()
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                with self.engine.connect() as conn:
                    while not self.stop.is_set():
                        rows = conn.execute(
                            text(
                                "SELECT executor_id, extract(epoch FROM now() - seen_at)::float8 AS age"
                                " FROM agent_executor"
                            )
                        ).all()
                        conn.rollback()
                        now = time.monotonic()
                        seen = {row.executor_id for row in rows if row.age <= LIVE_SECONDS}
                        self.stale |= {row.executor_id for row in rows if row.age > LIVE_SECONDS}
                        for executor_id in seen - live:
                            self.executors[executor_id] = self._arrived(executor_id, now)
                        for executor_id in live - seen:
                            self.executors[executor_id].left = now
                        live = seen
                        self.samples.append((now, len(seen)))
                        next_at += SAMPLE_SECONDS
                        self.stop.wait(max(0.0, next_at - time.monotonic()))
            except Exception as error:  # the database is busy or restarting: note it, sample on
                self.errors.append(f"{datetime.now(UTC):%H:%M:%S} {type(error).__name__}: {error}"[:300])
                self.stop.wait(1.0)
                next_at = time.monotonic()

    def _arrived(self, executor_id: str, now: float) -> Executor:
        """The executor's flow run and worker, found from the PID in its id (host:pid:suffix)."""
        executor = Executor(executor_id, now)
        with contextlib.suppress(ValueError, IndexError, psutil.Error):
            process = psutil.Process(int(executor_id.rsplit(":", 2)[1]))
            executor.flow_run = process.environ().get("PREFECT__FLOW_RUN_ID")
            workers = self.worker_pids()
            for parent in process.parents():
                if parent.pid in workers:
                    executor.worker = workers[parent.pid]
                    break
        return executor


@dataclass
class Trickle:
    """`rate` emails a second, each second's in new workspaces (demo.run.enqueue_workload)."""

    engine: Engine
    rate: int
    enqueued: int = 0
    first_id: int | None = None
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                first = enqueue_workload(self.engine, self.rate, self.rate)
                self.first_id = first if self.first_id is None else self.first_id
                self.enqueued += self.rate
            except Exception as error:
                self.errors.append(f"{datetime.now(UTC):%H:%M:%S} {type(error).__name__}: {error}"[:300])
            next_at += 1.0
            self.stop.wait(max(0.0, next_at - time.monotonic()))


@dataclass
class Restart:
    worker: str
    stopping: float  # monotonic: SIGTERM sent
    stopped: float = 0.0  # the worker exited
    started: float = 0.0  # its replacement spawned
    recovered: float | None = None  # first sample with N executors again
    exit_code: int | None = None
    executors_before: int = 0
    held: int = 0  # of those, the stopped worker's
    # the worker's flow-run processes (pid: status) 5 s after the SIGTERM; "zombie" means ended, not reaped
    run_processes_at_5s: dict[int, str] = field(default_factory=dict)


def restart_worker(stack: Stack, name: str, count_now: Callable[[], int]) -> Restart:
    """SIGTERM the worker as a rolling deploy would (its runs hand back), then start it again."""
    process = stack.processes[name]
    restart = Restart(name, time.monotonic(), executors_before=count_now())
    runs = [run.process for run in flow_run_processes(process.pid)]
    threading.Timer(5.0, look_at, (runs, restart.run_processes_at_5s)).start()
    try:
        restart.exit_code = stack.stop_worker(name)
    except KeyboardInterrupt:  # the soak is stopping: Stack.stop waits for this worker too
        stack.processes[name] = process
        raise
    except subprocess.TimeoutExpired:  # reported as such; its processes must not outlive the soak
        log(f"{name} did not exit within 60 s of SIGTERM: killed with its runs")
        children = descendants(process.pid)
        process.kill()
        kill_all(children)
        process.wait(10)
    restart.stopped = time.monotonic()
    stack.start_worker(name)
    restart.started = time.monotonic()
    return restart


def look_at(processes: list[psutil.Process], into: dict[int, str]) -> None:
    """Each process's status and its parent's (a stopped parent cannot reap an ended child)."""
    for process in processes:
        try:
            parent = process.parent()
            into[process.pid] = f"{process.status()}; parent {parent.pid} {parent.status()}" if parent else "orphan"
        except psutil.NoSuchProcess:
            into[process.pid] = "gone"


# ---- the Prefect API -----------------------------------------------------------------------------------


def api(prefect_url: str, path: str, body: object | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{prefect_url}/api{path}",
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def drain_runs(prefect_url: str) -> list[dict[str, Any]]:
    """Every run of the drain deployment, oldest tick first (POST /api/flow_runs/filter, 200 a page)."""
    deployment = api(prefect_url, f"/deployments/name/{DEPLOYMENT}")["id"]
    runs: list[dict[str, Any]] = []
    while True:
        page = api(
            prefect_url,
            "/flow_runs/filter",
            {
                "flow_runs": {"deployment_id": {"any_": [deployment]}},
                "sort": "EXPECTED_START_TIME_ASC",
                "offset": len(runs),
                "limit": 200,
            },
        )
        runs += page
        if len(page) < 200:
            return runs


def online_workers(prefect_url: str) -> int:
    workers = api(
        prefect_url, "/work_pools/outbox/workers/filter", {"workers": {"status": {"any_": ["ONLINE"]}}, "limit": 200}
    )
    return len(workers)


def when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


# ---- figures -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stretch:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def stretches(samples: list[tuple[float, int]], holds: Callable[[int], bool], end: float) -> list[Stretch]:
    """The maximal runs of samples whose count `holds`, each from its first sample to the next sample."""
    found: list[Stretch] = []
    start: float | None = None
    for at, count in samples:
        if holds(count) and start is None:
            start = at
        elif not holds(count) and start is not None:
            found.append(Stretch(start, at))
            start = None
    if start is not None:
        found.append(Stretch(start, end))
    return found


def overlaps_any(stretch: Stretch, windows: list[tuple[float, float]]) -> bool:
    return any(stretch.start < w_end and w_start < stretch.end for w_start, w_end in windows)


def longest(found: list[Stretch]) -> str:
    if not found:
        return "none"
    top = max(found, key=lambda s: s.seconds)
    return f"{top.seconds:.1f} s ({len(found)} stretches)"


def distribution(values: list[float]) -> str:
    if not values:
        return "none"
    return f"{len(values)}: median {statistics.median(values):.1f} s, max {max(values):.1f} s, min {min(values):.1f} s"


# ---- the soak ------------------------------------------------------------------------------------------


@dataclass
class Soak:
    args: argparse.Namespace
    workdir: Path
    stack: Stack
    engine: Engine
    sampler: Sampler
    trickle: Trickle
    restarts: list[Restart] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    online: list[tuple[float, int]] = field(default_factory=list)
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    began: float = 0.0
    began_wall: datetime = field(default_factory=lambda: datetime.now(UTC))
    ended: float = 0.0
    ended_wall: datetime = field(default_factory=lambda: datetime.now(UTC))
    interrupted: bool = False

    def count_now(self) -> int:
        return self.sampler.samples[-1][1] if self.sampler.samples else 0

    def run(self) -> None:
        threads = [
            threading.Thread(target=self.sampler.run, name="sampler", daemon=True),
            threading.Thread(target=self.trickle.run, name="trickle", daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.began, self.began_wall = time.monotonic(), datetime.now(UTC)
        deadline = self.began + self.args.minutes * 60
        try:
            self._soak(deadline)
            self.ended, self.ended_wall = time.monotonic(), datetime.now(UTC)
            self.trickle.stop.set()
            threads[1].join(30)  # its last enqueue is in, and counted
            if not self.interrupted:
                self._settle()
            self._recoveries()
        finally:
            self.trickle.stop.set()
            self.sampler.stop.set()
            for thread in threads:
                thread.join(10)

    def _soak(self, deadline: float) -> None:
        """Until the deadline or a signal: restarts on time, the ONLINE workers and the load every 5 s."""
        restart_every = self.args.restart_every * 60
        next_restart = self.began + restart_every
        next_report = self.began + 60
        turn = 0
        try:
            while (now := time.monotonic()) < deadline:
                if now >= next_restart and deadline - now > restart_every / 2:
                    name = self._next_to_restart(turn)
                    turn += 1
                    held = sum(1 for e in list(self.sampler.executors.values()) if e.left is None and e.worker == name)
                    log(f"restart {turn}: stopping {name} ({self.count_now()} executors, {held} of them on it)")
                    restart = restart_worker(self.stack, name, self.count_now)
                    restart.held = held
                    self.restarts.append(restart)
                    log(
                        f"restart {turn}: {name} exited {restart.exit_code} after"
                        f" {restart.stopped - restart.stopping:.1f} s ({self.count_now()} executors); started again"
                    )
                    next_restart += restart_every
                self._recoveries()
                with contextlib.suppress(OSError, ValueError):
                    self.online.append((time.monotonic(), online_workers(self.stack.prefect_url)))
                self.load.append(os.getloadavg()[0])
                if time.monotonic() >= next_report:
                    self._progress()
                    while next_report <= time.monotonic():
                        next_report += 60
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        except KeyboardInterrupt:  # report what was seen so far, then stop everything
            self.interrupted = True
            log(f"interrupted after {(time.monotonic() - self.began) / 60:.1f} min: reporting what was seen so far")

    def _next_to_restart(self, turn: int) -> str:
        """The next worker in turn; with --restart-busiest, the one holding the most executors now (as a
        crash may pick), the next in turn among equals."""
        names = [f"worker-{(turn + k) % self.args.workers + 1}" for k in range(self.args.workers)]
        if not self.args.restart_busiest:
            return names[0]
        held = Counter(e.worker for e in list(self.sampler.executors.values()) if e.left is None)
        return max(names, key=lambda name: (held[name], -names.index(name)))

    def _recoveries(self) -> None:
        """A restart's window ends at the first sample with N executors after the count dropped below N; when
        it did not drop by the replacement's start (the worker held no run), at that start."""
        n = self.args.workers
        samples = list(self.sampler.samples)
        for restart in self.restarts:
            if restart.recovered is not None or not restart.started:
                continue
            dropped = next((at for at, count in samples if at >= restart.stopping and count < n), None)
            if dropped is None or dropped > restart.started + 5:
                restart.recovered = restart.started
            else:
                restart.recovered = next((at for at, count in samples if at > dropped and count >= n), None)

    def _progress(self) -> None:
        minute = [n for at, n in self.sampler.samples if at >= time.monotonic() - 60]
        states: Counter[str] = Counter()
        with contextlib.suppress(OSError, ValueError):
            states = Counter(r["state_name"] for r in drain_runs(self.stack.prefect_url))
        log(
            f"{(time.monotonic() - self.began) / 60:.0f} min: executors {self.count_now()}"
            f" (last minute {min(minute, default=0)} to {max(minute, default=0)});"
            f" runs {dict(sorted(states.items()))}; emails enqueued {self.trickle.enqueued},"
            f" ended {self._ended_emails()}; load {os.getloadavg()[0]:.2f}"
        )

    def _ended_emails(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL")).scalar_one())

    def _settle(self) -> None:
        """Give the last emails (and their retries) up to --settle seconds to end."""
        deadline = time.monotonic() + self.args.settle
        while time.monotonic() < deadline:
            with self.engine.connect() as conn:
                if not conn.execute(text("SELECT count(*) FROM agent_action WHERE ended_at IS NULL")).scalar_one():
                    return
            time.sleep(1.0)

    # ---- the report ----------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        n = self.args.workers
        interval = self.args.interval
        samples = [(at, count) for at, count in self.sampler.samples if at <= self.ended]
        steady = next((at for at, count in samples if count >= n), None)
        after = [(at, count) for at, count in samples if steady is not None and at >= steady]
        windows = [(r.stopping, r.recovered if r.recovered is not None else self.ended) for r in self.restarts]
        zero = stretches(after, lambda c: c == 0, self.ended)
        below = stretches(after, lambda c: c < n, self.ended)
        below_outside = [s for s in below if not overlaps_any(s, windows)]
        below_during = [s for s in below if overlaps_any(s, windows)]
        above = [s for s in stretches(after, lambda c: c > n, self.ended) if not overlaps_any(s, windows)]

        runs = drain_runs(self.stack.prefect_url)
        in_soak = [
            r
            for r in runs
            if (at := when(r["expected_start_time"])) is not None and self.began_wall <= at <= self.ended_wall
        ]
        # the runs created before the soak's first tick (the stack's start-up) and those still ahead
        earlier = [r for r in runs if (at := when(r["expected_start_time"])) is not None and at < self.began_wall]
        ahead = [r for r in runs if (at := when(r["expected_start_time"])) is not None and at > self.ended_wall]
        seconds = (self.ended_wall - self.began_wall).total_seconds()
        # the schedule's ticks in the soak: from the first one seen, one every interval up to the end
        first_tick = min((at for r in in_soak if (at := when(r["expected_start_time"])) is not None), default=None)
        ticks = (self.ended_wall - first_tick).total_seconds() // interval + 1 if first_tick is not None else 0
        per_tick = len(in_soak) / ticks if ticks else 0.0
        ticks_with_runs = Counter(r["expected_start_time"] for r in in_soak)
        by_state = Counter(r["state_name"] for r in runs if r not in ahead)
        durations = [
            (end - start).total_seconds()
            for r in runs
            if r["state_type"] == "COMPLETED"
            and (start := when(r["start_time"])) is not None
            and (end := when(r["end_time"])) is not None
        ]
        odd = [
            {
                "name": r["name"],
                "state": r["state_name"],
                "message": (r.get("state") or {}).get("message"),
                "expected": r["expected_start_time"],
            }
            for r in runs
            if r["state_type"] in ("CRASHED", "FAILED") or r["state_name"] == "Late"
        ]

        with self.engine.connect() as conn:
            outcomes = conn.execute(
                text("SELECT state, stop_reason, count(*) FROM agent_action GROUP BY 1, 2 ORDER BY 3 DESC")
            ).all()
        assert self.stack.sink is not None
        ids = Counter(r.message_id for r in self.stack.sink.received)
        duplicates = sum(1 for count in ids.values() if count > 1)
        executors = list(self.sampler.executors.values())
        online = [count for at, count in self.online if steady is not None and at >= steady]
        figures: dict[str, Any] = {
            "workers": n,
            "interval_s": interval,
            "minutes": round(seconds / 60, 1),
            "interrupted": self.interrupted,
            "steady_after_s": round(steady - self.began, 1) if steady is not None else None,
            "drain_runs_created_in_soak": len(in_soak),
            "ticks_in_soak": int(ticks),
            "runs_per_tick": round(per_tick, 3),
            "ticks_with_more_than_one_run": sum(1 for c in ticks_with_runs.values() if c > 1),
            "runs_per_day_at_300s": round(86_400 / DEFAULT_INTERVAL * per_tick, 1),
            "runs_before_soak": len(earlier),
            "runs_scheduled_ahead": len(ahead),
            "runs_by_final_state": dict(by_state.most_common()),
            "completed_run_seconds": distribution(durations),
            "crashed_failed_late_runs": odd,
            "executors_max": max((c for _, c in after), default=0),
            "executors_min": min((c for _, c in after), default=0),
            "longest_zero_executors": longest(zero),
            "longest_below_n_outside_restarts": longest(below_outside),
            "below_n_outside_restarts": [
                {"at_s": round(s.start - self.began, 1), "seconds": round(s.seconds, 1)} for s in below_outside
            ],
            "longest_below_n_during_restarts": longest(below_during),
            "handover_overlaps": distribution([s.seconds for s in above]),
            "restarts": [
                {
                    "worker": r.worker,
                    "at_s": round(r.stopping - self.began, 1),
                    "stop_s": round(r.stopped - r.stopping, 1),
                    "exit_code": r.exit_code,
                    "executors_before": r.executors_before,
                    "held": r.held,
                    "back_to_n_after_s": round(r.recovered - r.stopping, 1) if r.recovered is not None else None,
                    "run_processes_at_5s": r.run_processes_at_5s,
                }
                for r in self.restarts
            ],
            "online_workers_min_max": [min(online, default=0), max(online, default=0)],
            "executors_seen": len(executors),
            "executors_without_flow_run": sum(1 for e in executors if e.flow_run is None),
            "stale_executor_rows": sorted(self.sampler.stale),
            "emails_enqueued": self.trickle.enqueued,
            "emails_by_state": {f"{state} {reason}": count for state, reason, count in outcomes},
            "messages_at_sink": sum(ids.values()),
            "distinct_messages_at_sink": len(ids),
            "duplicates_at_sink": duplicates,
            "load_before": [round(x, 2) for x in self.load_before],
            "load_during_1min_mean_max": [
                round(statistics.fmean(self.load), 2) if self.load else None,
                round(max(self.load), 2) if self.load else None,
            ],
            "load_at_end": [round(x, 2) for x in os.getloadavg()],
            "sampler_errors": self.sampler.errors[:20],
            "trickle_errors": self.trickle.errors[:20],
        }
        self._keep(runs, figures)
        return figures

    def _keep(self, runs: list[dict[str, Any]], figures: dict[str, Any]) -> None:
        """soak.json in the work directory: the figures and the evidence behind them."""
        changes: list[tuple[float, int]] = []
        for at, count in self.sampler.samples:
            if not changes or changes[-1][1] != count:
                changes.append((round(at - self.began, 2), count))
        evidence = {
            "figures": figures,
            "began": self.began_wall.isoformat(),
            "ended": self.ended_wall.isoformat(),
            "count_changes": changes,
            "executors": [
                {
                    "id": e.executor_id,
                    "arrived_s": round(e.arrived - self.began, 2),
                    "left_s": round(e.left - self.began, 2) if e.left is not None else None,
                    "flow_run": e.flow_run,
                    "worker": e.worker,
                }
                for e in self.sampler.executors.values()
            ],
            "online_workers": [(round(at - self.began, 1), n) for at, n in self.online],
            "runs": [
                {
                    key: r.get(key)
                    for key in ("id", "name", "state_name", "expected_start_time", "start_time", "end_time")
                }
                | {"message": (r.get("state") or {}).get("message")}
                for r in runs
            ],
        }
        (self.workdir / "soak.json").write_text(json.dumps(evidence, indent=1, default=str))


def print_report(figures: dict[str, Any], workdir: Path) -> None:
    width = max(len(key) for key in figures)
    for key, value in figures.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            print(f"{key}:")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key:<{width}} {value}")
    print(f"logs and soak.json: {workdir}")


@contextlib.contextmanager
def database(given: str | None, workdir: Path) -> Iterator[str]:
    """The URL given, or a fresh embedded PostgreSQL under the work directory (stopped afterwards)."""
    if given:
        yield psycopg_url(given)
        return
    server = embedded_postgres_server(workdir)
    try:
        yield psycopg_url(server.get_uri())
    finally:
        server.cleanup()


def stop_on_signal(signum: int, frame: FrameType | None) -> None:
    log(f"received {signal.Signals(signum).name}")
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=20.0, help="the drain schedule's interval, seconds")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2, help="emails enqueued a second")
    parser.add_argument("--restart-every", type=float, default=10.0, help="minutes between worker restarts")
    parser.add_argument(
        "--restart-busiest", action="store_true", help="restart the worker holding the most executors, not the next"
    )
    parser.add_argument("--settle", type=float, default=120.0, help="seconds the last emails get to end")
    parser.add_argument("--database-url", help="an empty database (default: a fresh embedded PostgreSQL)")
    parser.add_argument("--workdir", type=Path, help="default: ./.outbox/drain-soak/<UTC time>")
    args = parser.parse_args()
    workdir = (args.workdir or ROOT / ".outbox" / "drain-soak" / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}").resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGINT, stop_on_signal)
    load_before = os.getloadavg()
    log(f"work directory {workdir}; load average before {load_before[0]:.2f} {load_before[1]:.2f}")
    with database(args.database_url, workdir) as url:
        engine = sync_engine(url, pool_size=2)
        prepare(engine)
        stack = Stack(
            database_url=url,
            workdir=workdir,
            workers=args.workers,
            prefect_file=accelerated_copy(args.interval, workdir),
        )
        sampler = Sampler(sync_engine(url, pool_size=1), lambda: {p.pid: n for n, p in list(stack.processes.items())})
        soak = Soak(args, workdir, stack, engine, sampler, Trickle(sync_engine(url, pool_size=1), args.rate))
        soak.load_before = load_before
        try:
            log("starting the stack")
            stack.start()
            log(f"Prefect {stack.prefect_url}; soaking {args.minutes:g} min, a drain tick every {args.interval:g} s")
            soak.run()
            print_report(soak.report(), workdir)
        except KeyboardInterrupt:
            log("interrupted again: stopping everything the soak started")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stop itself is not to be interrupted
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            stack.stop()
            for used in (engine, sampler.engine, soak.trickle.engine):
                used.dispose()
    sys.exit(0)


if __name__ == "__main__":
    main()
