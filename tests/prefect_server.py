"""A real Prefect server for the tests that need their own: `prefect server start` on a free loopback port,
with a PREFECT_HOME of its own, this process's Prefect client pointed at it for the module, stopped by its PID.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.utilities.asyncutils import run_coro_as_sync

from demo.stack import ROOT, descendants, free_port, kill_all, prefect_cli, stop_process, wait_until_answers
from tests.support import prefect_post


@dataclass(frozen=True)
class PrefectServer:
    url: str  # http://127.0.0.1:<port>
    home: Path
    ui: bool = False  # whether it serves the Prefect UI (for a browser) besides its API

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": f"{self.url}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "true" if self.ui else "false",
            "COLUMNS": "500",  # the CLI's messages on one line each
        }

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return prefect_post(self.url, path, body)

    def events(self, flow_run_id: Any, prefix: str = "outbox.action.") -> list[dict[str, Any]]:
        """The outbox events a flow run emitted (emit_event names the run as a related resource), those of
        actions unless another `prefix` is given."""
        body = {
            "filter": {
                "event": {"prefix": [prefix]},
                "related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
            },
            "limit": 50,
        }
        return list(self.post("/events/filter", body)["events"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return prefect_cli(args, self.env())


def flush_prefect_workers() -> None:
    """Send what this process's log and event workers hold and stop them, so the next ones start on the
    API now configured (before this module's server, and before it stops)."""

    async def drain_all() -> None:
        for result in (APILogWorker.drain_all(), EventsWorker.drain_all()):
            if inspect.isawaitable(result):
                await result

    run_coro_as_sync(drain_all())


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """`prefect server start` on a free loopback port, with a PREFECT_HOME of its own; this process's
    Prefect client points at it for the module. Stopped by its PID: SIGTERM, then SIGKILL."""
    yield from serve(PrefectServer(f"http://127.0.0.1:{free_port()}", tmp_path_factory.mktemp("prefect-home")))


def serve(server: PrefectServer) -> Iterator[PrefectServer]:
    """Start `server`, point this process's Prefect client at it while the caller uses it, then stop it."""
    port = server.url.rpartition(":")[2]
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", port]
    with (server.home / "server.log").open("ab") as log:
        process = subprocess.Popen(command, env=server.env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_answers(f"{server.url}/api/health", 120, "the Prefect server")
        flush_prefect_workers()
        with temporary_settings(updates={PREFECT_API_URL: f"{server.url}/api"}):
            yield server
            flush_prefect_workers()
    finally:
        started = descendants(process.pid)
        stop_process(process, 30)
        kill_all(started)
