"""The systems `bench.compare` runs side by side, one module each, all driven through `System`.

    System.prepare (schema) ─▶ start_worker × N ─▶ wait ready ─▶ preload (one transaction) or producer
                           ─▶ pending() polled until 0 ─▶ stop workers by PID ─▶ their record files

A worker is one OS process started by PID (never by name) and stopped with SIGTERM; it writes one record
per job it ran when it exits (`bench.peers.common.Recorder`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://...) as the plain libpq URI the peers' drivers take."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@dataclass
class WorkerSpec:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class System:
    """One system under test. Subclasses fill in the schema, bulk load, worker and producer commands."""

    name = ""
    # per-key serial execution: how this system spells it ("" when it has none)
    lanes_feature = ""
    # settings shown in the results (worker concurrency, batch sizes, polling)
    settings = ""

    def prepare(self, url: str) -> None:
        raise NotImplementedError

    def preload(self, url: str, count: int, lanes: int | None) -> float | None:
        """`count` no-op jobs in one transaction; with `lanes`, job g is number g // lanes of lane g % lanes.

        Returns when that transaction committed (time.monotonic) if not just now."""
        raise NotImplementedError

    def pending_sql(self) -> str:
        """Jobs not finished yet (waiting or running)."""
        raise NotImplementedError

    def worker(self, url: str, record: Path, ready: Path, lanes: bool) -> WorkerSpec:
        raise NotImplementedError

    def wait_ready(self, url: str, ready: list[Path], timeout: float = 60) -> None:
        """Until every worker is up and will see a job committed from now on."""
        deadline = time.monotonic() + timeout
        while not all(path.exists() for path in ready):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: workers not ready after {timeout} s")
            time.sleep(0.05)

    def driver_url(self, url: str) -> str:
        """The URL this system's own processes take: the plain libpq URI its driver wants."""
        return libpq_url(url)

    def module_command(self, command: str, url: str, *args: str) -> list[str]:
        """`python -m <this system's module> <command> --url ... <args>`: its worker or its producer."""
        return [python(), "-m", type(self).__module__, command, "--url", self.driver_url(url), *args]

    def producer(self, url: str, out: Path, rate: float, seconds: float) -> WorkerSpec:
        argv = self.module_command("produce", url, "--out", str(out), "--rate", str(rate), "--seconds", str(seconds))
        return WorkerSpec(argv, base_env())


def python() -> str:
    return sys.executable


def base_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}
