"""A nats-server with JetStream of the demo's, the tests' or the chaos harness's own, on free 127.0.0.1 ports,
that can be killed and restarted.

    NatsServer() ──▶ nats-server -js -a 127.0.0.1 -p <free> -sd <store> -m <free monitor port>
        ready: GET http://127.0.0.1:<monitor>/healthz?js-enabled-only=true answers ok
    kill()     SIGKILL by its PID (the store keeps what JetStream had written)
    restart()  kill if running, then start again on the same ports and store
    stop()     SIGTERM, SIGKILL after 10 s; the store is removed

A plain class: `outbox demo` runs one for its events, the tests one per test (their `nats_server` fixture)
and the chaos harness one it kills. It never uses a NATS already running on this machine (port 4222) nor
any port it did not find free.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"
READY_SECONDS = 20.0


def free_port() -> int:
    """A free 127.0.0.1 port, never NATS's own 4222."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port != 4222:
            return port


class NatsServer:
    """One nats-server process with JetStream on a store of its own."""

    def __init__(self, store: Path | None = None) -> None:
        self.port = free_port()
        self.monitor_port = free_port()
        self._own_store = store is None
        self.store = store or Path(tempfile.mkdtemp(prefix="outbox-test-nats-"))
        self._log = self.store / "nats-server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server (on the same ports and store as before) and wait until JetStream is ready."""
        if self.running():
            return
        args = [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store / "js")]
        args += ["-m", str(self.monitor_port), "-l", str(self._log)]
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + READY_SECONDS
        while not self._ready():
            if self._process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._process.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"nats-server was not ready within {READY_SECONDS:g} s: {self._log_tail()}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL by PID: the server stops at once, as a crashed host's would."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL) and remove the store it made."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._own_store:
            shutil.rmtree(self.store, ignore_errors=True)

    def _ready(self) -> bool:
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                return bool(answer.status == 200 and b"ok" in answer.read())
        except (urllib.error.URLError, OSError):
            return False

    def _log_tail(self) -> str:
        try:
            return " | ".join(self._log.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"
