"""A backlog through a throttling relay: how fast executors that know nothing of its rate find it, and how
well they keep a rate they are given.

    python -m bench.throttle [--emails 5000] [--rate 20] [--only 454] [--lanes 500] [--workdir DIR]

    embedded PostgreSQL ─ one fresh database a case ─ EMAILS verify-address emails over LANES lanes
      ├─ tests/throttling_relay.py in this process: a token bucket of RATE a second (one second's worth),
      │  refusing at MAIL FROM with 454 4.7.0 (Amazon SES's throttling) or 421 4.7.0 (and closing)
      └─ EXECUTORS separate processes `outbox run --adapters examples.accounts:adapters` (their defaults:
         64 attempts in flight each), OUTBOX_SMTP_RATE unset, or set to the relay's rate

The cases: 500 and 5,000 lanes, 454 and 421, two executors and no rate; the relay's rate given, over 500 and
5,000 lanes (454, two executors); then three executors and no rate. A case not drained in three times its
ideal (and a minute to start) is stopped and reported as it stands (DONE below EMAILS).

Per case: DONE and FAILED, the relay's refusals against what it accepted (and those after the opening, the
first OPENING_SECONDS from the first MAIL FROM: before the first slow-down every executor has its whole
concurrency in flight, and what the relay refuses of it is the same whatever the pace does next), the drain
(from the first MAIL FROM the relay saw to the last message it accepted) against the ideal EMAILS / RATE,
duplicates (by Message-ID), the busiest second and the slowest whole 10 s of the drain (messages accepted),
the pauses the executors logged, the first pace they set, the pace `outbox destinations` reads when the
drain ends and IDLE_SECONDS later (the executors still running, with nothing left to send), and the load
average over the case. The executors' logs (each pause and pace at INFO) stay in the work directory,
./.outbox/throttle/<UTC time> unless --workdir is given, with results.json. Stopped by Ctrl-C or SIGTERM, it
stops its executors and its PostgreSQL before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from sqlalchemy import Engine, create_engine, text

from demo.postgres import embedded_postgres_server, fresh_database
from outbox import migrate
from outbox.db import psycopg_url
from outbox.destinations import destinations
from tests.support import enqueue_verify_emails
from tests.throttling_relay import OPENING_SECONDS, Refusal, ThrottlingRelay

ROOT = Path(__file__).resolve().parent.parent
SENDER = "outbox@example.com"
LIVE = ("PROPOSED", "ADMITTED", "EXECUTING")
# a case that has not drained in this many times its ideal is stopped and reported as it stands
DEADLINE_IDEALS = 3
# the executors' start-up, allowed on top of it
START_SECONDS = 60
# how long the executors run on after the drain before the pace is read again
IDLE_SECONDS = 20.0
# the windows the slowest part of the drain is counted in
WINDOW_SECONDS = 10.0
# a pace an executor logged with a pause ("...; pace 33.3/s")
LOGGED_PACE = re.compile(r"^(\S+ \S+) .* paused .*; pace ([0-9.e+]+)/s$", re.MULTILINE)


@dataclass(frozen=True)
class Case:
    lanes: int
    refusal: Refusal
    executors: int
    rated: bool

    @property
    def name(self) -> str:
        rate = "rate" if self.rated else "no-rate"
        return f"{self.lanes}-lanes-{self.refusal}-{self.executors}x-{rate}"


@dataclass(frozen=True)
class Figures:
    case: str
    done: int
    failed: int
    accepted: int
    refused: int
    refused_after_opening: int
    drain_seconds: float
    ideal_seconds: float
    duplicates: int
    busiest_second: int
    slowest_window: int
    pauses: int
    first_pace: float | None
    drained_pace: float | None
    idle_pace: float | None
    load_average: float

    @property
    def row(self) -> str:
        share = self.refused / self.accepted if self.accepted else 0.0
        later = self.refused_after_opening / self.accepted if self.accepted else 0.0
        return (
            f"| {self.case} | {self.done} | {self.failed} | {self.refused} / {self.accepted} ({share:.1%}) |"
            f" {self.refused_after_opening} ({later:.1%}) |"
            f" {self.drain_seconds:.0f} s ({self.drain_seconds / self.ideal_seconds:.2f}x) | {self.duplicates} |"
            f" {self.busiest_second} | {self.slowest_window} | {self.pauses} | {_pace(self.first_pace)} |"
            f" {_pace(self.drained_pace)} / {_pace(self.idle_pace)} | {self.load_average:.1f} |"
        )


def _pace(pace: float | None) -> str:
    return "-" if pace is None else f"{pace:.3g}/s"


HEADER = (
    f"| case | DONE | FAILED | refused / accepted | refused after {OPENING_SECONDS:g} s | drain (x ideal) | duplicates"
    f" | busiest second | slowest {WINDOW_SECONDS:g} s | pauses | first pace | pace drained / {IDLE_SECONDS:g} s later"
    " | load |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def cases() -> list[Case]:
    """Two executors first (no rate, then the rate given), then three."""
    refusals: tuple[Refusal, ...] = ("454", "421")
    two = [Case(lanes, refusal, 2, rated=False) for lanes in (500, 5000) for refusal in refusals]
    rated = [Case(lanes, "454", 2, rated=True) for lanes in (500, 5000)]
    three = [Case(lanes, refusal, 3, rated=False) for lanes in (500, 5000) for refusal in refusals]
    return two + rated + three


def start_executor(database_url: str, port: int, rate: float | None, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SMTP_HOST": "127.0.0.1",
        "OUTBOX_SMTP_PORT": str(port),
        "OUTBOX_SMTP_SENDER": SENDER,
        "OUTBOX_SMTP_TIMEOUT_SECONDS": "10",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("OUTBOX_SMTP_RATE", None)
    if rate is not None:
        env["OUTBOX_SMTP_RATE"] = f"{rate:g}/s"
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "run", "--adapters", "examples.accounts:adapters"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all()
    return {str(state): int(n) for state, n in rows}


def smtp_pace(engine: Engine) -> float | None:
    """The relay's pace as `outbox destinations` reads it now (None: not paced)."""
    with engine.connect() as conn:
        return next((found.pace for found in destinations(conn) if found.name == "smtp"), None)


def first_pace(logs: list[Path]) -> float | None:
    """The first pace any executor logged with a pause (by its log line's time)."""
    found = [match.groups() for log in logs for match in LOGGED_PACE.finditer(log.read_text(errors="replace"))]
    return float(min(found)[1]) if found else None


def slowest_window(mail_times: list[float]) -> int:
    """The fewest messages accepted in a whole WINDOW_SECONDS of the drain, counted from its first MAIL FROM."""
    first, last = min(mail_times), max(mail_times)
    windows = int((last - first) // WINDOW_SECONDS)
    counts = [0] * windows
    for at in mail_times:
        n = int((at - first) // WINDOW_SECONDS)
        if n < windows:
            counts[n] += 1
    return min(counts, default=len(mail_times))


def run_case(server: object, case: Case, emails: int, rate: float, workdir: Path) -> Figures:
    url = psycopg_url(fresh_database(server, "throttle"))
    engine = create_engine(url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
    enqueue_verify_emails(engine, emails, case.lanes)
    relay = ThrottlingRelay(rate, refusal=case.refusal).start()
    logs = [workdir / f"{case.name}-executor-{n}.log" for n in range(1, case.executors + 1)]
    processes = [start_executor(url, relay.port, rate if case.rated else None, log) for log in logs]
    loads: list[float] = []
    drained_pace = idle_pace = None
    try:
        deadline = time.monotonic() + START_SECONDS + DEADLINE_IDEALS * emails / rate
        while time.monotonic() < deadline:
            found = states(engine)
            if not any(found.get(state, 0) for state in LIVE):
                drained_pace = smtp_pace(engine)
                time.sleep(IDLE_SECONDS)  # the executors run on, idle: what becomes of the pace
                idle_pace = smtp_pace(engine)
                break
            loads.append(os.getloadavg()[0])
            print(f"  {case.name}: {found} accepted {len(relay.accepted)} refused {relay.refused}", flush=True)
            time.sleep(5)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(timeout=60)
        relay.stop()
    found = states(engine)
    engine.dispose()
    accepted = relay.accepted
    first = min(r.mail_at for r in accepted)
    last = max(r.received_at for r in accepted)
    return Figures(
        case=case.name,
        done=found.get("DONE", 0),
        failed=found.get("FAILED", 0),
        accepted=len(accepted),
        refused=relay.refused,
        refused_after_opening=relay.refused_after_opening(),
        drain_seconds=last - first,
        ideal_seconds=emails / rate,
        duplicates=relay.duplicates(),
        busiest_second=relay.busiest_second(),
        slowest_window=slowest_window([r.mail_at for r in accepted]),
        pauses=sum(log.read_text(errors="replace").count(" paused ") for log in logs),
        first_pace=first_pace(logs),
        drained_pace=drained_pace,
        idle_pace=idle_pace,
        load_average=sum(loads) / len(loads) if loads else os.getloadavg()[0],
    )


def stop_on_signal(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: the `finally` clauses stop the executors and the embedded PostgreSQL."""
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--emails", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=20.0, help="the relay's messages a second")
    parser.add_argument("--only", default="", help="run the cases whose name contains this, e.g. 454 or rate")
    parser.add_argument("--lanes", type=int, default=None, help="run only the cases over this many lanes")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, stop_on_signal)
    workdir = args.workdir or ROOT / ".outbox" / "throttle" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    workdir.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres_server(workdir / "postgres")
    results: list[Figures] = []
    try:
        for case in cases():
            if args.only not in case.name or args.lanes not in (None, case.lanes):
                continue
            print(f"{case.name}: {args.emails} emails at {args.rate:g}/s", flush=True)
            results.append(run_case(server, case, args.emails, args.rate, workdir))
            print(HEADER.splitlines()[0] + "\n" + results[-1].row, flush=True)
            (workdir / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    finally:
        server.cleanup()
    print(f"\n{args.emails} emails, relay {args.rate:g}/s; logs in {workdir}\n{HEADER}")
    for figures in results:
        print(figures.row)


if __name__ == "__main__":
    main()
