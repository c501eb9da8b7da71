"""`outbox worker`'s orderly stop, on a real Prefect server with real processes. A stand-in for Prefect's
worker starts three flow-run processes (each names its run in PREFECT__FLOW_RUN_ID, as Prefect's worker
does): one whose run is Running, one whose run is still Pending, one whose run has just ended. The stop
sends SIGTERM to the Running one only, ends the Pending run Cancelled after killing its process, leaves
the ended run as it was, and stops the worker last.

Then a real `outbox worker` with a real drain run: alone in its pool, its run does not wait for a
replacement that nothing would take, and the stop prints no traceback. A stopping run counts the pool's
other ONLINE workers, never its own nor one that its supervisor removed; the websocket warnings a worker
logs when it continues from a long stop are dropped then, and shown in normal running."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from prefect.client.orchestration import get_client
from prefect.workers.process import ProcessWorker

from flows.drain import REPLACEMENT_WAIT_SECONDS, other_workers_online
from flows.worker import PrefectApi, StopNoiseFilter, Supervisor, flow_run_processes
from tests.prefect_server import PrefectServer
from tests.support import prefect_post, until

# a flow-run process: it stops on SIGTERM and says so; one whose run has ended exits by itself soon after.
# It writes its ready file once its handlers are in place, so the stop never comes before them.
FLOW_RUN = """
import pathlib, signal, sys
marker, lifetime = pathlib.Path(sys.argv[1]), float(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *_: (marker.write_text("SIGTERM"), sys.exit(0)))
if lifetime:
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(0))
    signal.alarm(int(lifetime))
pathlib.Path(sys.argv[1] + ".ready").touch()
signal.pause()
"""
# the worker: starts one flow-run process per run, then waits for its own SIGTERM
WORKER = """
import json, os, signal, subprocess, sys
for run_id, marker, lifetime in json.loads(sys.argv[1]):
    command = [sys.executable, "-c", sys.argv[2], marker, str(lifetime)]
    subprocess.Popen(command, env={**os.environ, "PREFECT__FLOW_RUN_ID": run_id})
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
"""


def flow_run(server: PrefectServer, flow_id: str, state: str) -> str:
    run = prefect_post(server.url, "/flow_runs/", {"flow_id": flow_id, "state": {"type": state}})
    return str(run["id"])


def state_of(server: PrefectServer, run_id: str) -> dict[str, Any]:
    runs = prefect_post(server.url, "/flow_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})
    return dict(runs[0]["state"])


def test_a_stopping_worker_stops_running_runs_cancels_unstarted_ones_and_leaves_ended_ones(
    prefect_server: PrefectServer, tmp_path: Path
) -> None:
    flow_id = prefect_post(prefect_server.url, "/flows/", {"name": "outbox-worker-stop"})["id"]
    runs = {state: flow_run(prefect_server, flow_id, state) for state in ("RUNNING", "PENDING", "COMPLETED")}
    markers = {state: tmp_path / f"{state}.signal" for state in runs}
    # the ended run's process lives 3 s more, as a run's process does after its final state
    lifetimes = {"RUNNING": 0, "PENDING": 0, "COMPLETED": 3}
    specs = json.dumps([(runs[state], str(markers[state]), lifetimes[state]) for state in runs])
    worker = subprocess.Popen([sys.executable, "-c", WORKER, specs, FLOW_RUN])
    try:
        until(lambda: len(flow_run_processes(worker.pid)) == 3, timeout=30, what="three flow-run processes")
        ready = [Path(f"{marker}.ready") for marker in markers.values()]
        until(lambda: all(path.exists() for path in ready), timeout=30, what="the flow-run processes' handlers")
        processes = {run.run_id: run.process for run in flow_run_processes(worker.pid)}
        with get_client(sync_client=True) as client:
            supervisor = Supervisor([], PrefectApi(client), grace_seconds=10)
            supervisor.stop_in_order(worker)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()

    assert markers["RUNNING"].read_text() == "SIGTERM"
    assert not markers["PENDING"].exists(), "a run not started yet is killed, not asked"
    assert not markers["COMPLETED"].exists(), "an ended run's process is left to exit"
    pending = state_of(prefect_server, runs["PENDING"])
    assert pending["type"] == "CANCELLED" and "stopped before the run started" in pending["message"]
    assert state_of(prefect_server, runs["COMPLETED"])["type"] == "COMPLETED"
    assert state_of(prefect_server, runs["RUNNING"])["type"] == "RUNNING"  # the run reports its own end
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes.values())


# ---- a real `outbox worker` running a real drain run ------------------------------------------------------

# the checkout: the deployment's working directory, where the worker finds flows/ and tests/
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RealWorker:
    """`outbox worker` as a subprocess, its stdout and stderr in files of their own."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


def drain_deployment(server: PrefectServer, pool: str) -> str:
    """A process work pool of its own, and outbox-drain on it from this checkout (named after the pool), its
    executor carrying out the NOOP test kind. Returns the deployment's id."""
    template = ProcessWorker.get_default_base_job_template()
    server.post("/work_pools/", {"name": pool, "type": "process", "base_job_template": template})
    flow_id = server.post("/flows/", {"name": "outbox-drain"})["id"]
    body = {
        "name": pool,
        "flow_id": flow_id,
        "work_pool_name": pool,
        "entrypoint": "flows/drain.py:drain",
        "pull_steps": [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}],
        "parameters": {"adapters": "tests.adapters:recording_adapters"},
    }
    return str(server.post("/deployments/", body)["id"])


@pytest.fixture
def workers() -> Iterator[list[RealWorker]]:
    """The real workers a test starts; whatever is left of them is killed after it, by PID."""
    started: list[RealWorker] = []
    yield started
    for worker in started:
        if worker.process.poll() is None:
            for process in psutil.Process(worker.process.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            worker.process.kill()
            worker.process.wait(10)


def start_worker(server: PrefectServer, database_url: str, tmp_path: Path, pool: str, name: str) -> RealWorker:
    env = {
        **server.env(),
        "PYTHONPATH": str(ROOT),
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_TEST_RECORD_FILE": str(tmp_path / "attempts.jsonl"),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
    }
    stdout, stderr = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    command = [sys.executable, "-m", "outbox.cli", "worker", "--pool", pool, "--name", name, "--grace", "60"]
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=err)
    return RealWorker(process, stdout, stderr)


def claiming_run(server: PrefectServer, deployment_id: str) -> dict[str, Any]:
    """Start a run of the deployment now and wait until its executor claims (the run tags itself kind:...)."""
    run_id = server.post(f"/deployments/{deployment_id}/create_flow_run", {})["id"]
    until(lambda: "kind:TEST_NOOP" in run_of(server, run_id)["tags"], timeout=180, what="the drain run to claim")
    return run_of(server, run_id)


def run_of(server: PrefectServer, run_id: str) -> dict[str, Any]:
    return dict(server.post("/flow_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})[0])


def stopped(worker: RealWorker, within: float) -> int:
    """SIGTERM the worker, as a replica being stopped; its exit code, once it has exited within `within` s."""
    worker.process.send_signal(signal.SIGTERM)
    return worker.process.wait(within)


def test_a_worker_alone_in_its_pool_stops_its_run_at_once_and_prints_no_traceback(
    prefect_server: PrefectServer, database_url: str, tmp_path: Path, workers: list[RealWorker]
) -> None:
    deployment_id = drain_deployment(prefect_server, "alone")
    worker = start_worker(prefect_server, database_url, tmp_path, "alone", "outbox-alone")
    workers.append(worker)
    run = claiming_run(prefect_server, deployment_id)

    # no other worker is ONLINE: nothing would take the replacement, so the run does not wait for it
    # (REPLACEMENT_WAIT_SECONDS): the worker exits well before the wait could have passed
    assert stopped(worker, within=REPLACEMENT_WAIT_SECONDS - 10) == 0, worker.output()
    assert run_of(prefect_server, run["id"])["state_type"] == "COMPLETED"
    assert "Traceback" not in worker.output(), worker.output()
    # its replacement waits, Scheduled, for the next worker to start
    runs = prefect_server.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment_id]}}})
    assert {r["state_type"] for r in runs if r["id"] != run["id"]} == {"SCHEDULED"}


async def test_a_stopping_run_counts_the_pools_other_online_workers_not_its_own(
    prefect_server: PrefectServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = ProcessWorker.get_default_base_job_template()
    prefect_server.post("/work_pools/", {"name": "counted", "type": "process", "base_job_template": template})
    monkeypatch.setenv("PREFECT__WORKER_NAME", "outbox-me")  # as the worker sets it for its flow runs
    prefect_server.post(
        "/work_pools/counted/workers/heartbeat", {"name": "outbox-me", "heartbeat_interval_seconds": 30}
    )
    async with get_client() as client:
        assert await other_workers_online(client, "counted") == []
        prefect_server.post(
            "/work_pools/counted/workers/heartbeat", {"name": "outbox-other", "heartbeat_interval_seconds": 30}
        )
        assert await other_workers_online(client, "counted") == ["outbox-other"]


# what a Prefect worker stopped for longer than its websockets' keepalive logs when it continues
WEBSOCKET_TRACE = b"""10:06:30.302 | WARNING | prefect.FlowRunCancellingObserver - The FlowRunCancellingObserver \
websocket failed with an exception. Switching to polling mode until it reconnects.
Traceback (most recent call last):
  File "/usr/lib/python3.11/asyncio/selector_events.py", line 1057, in write
    n = self._sock.send(data)
        ^^^^^^^^^^^^^^^^^^^^^
BrokenPipeError: [Errno 32] Broken pipe

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/websockets/asyncio/connection.py", line 324, in recv
    raise self.protocol.close_exc from self.recv_exc
websockets.exceptions.ConnectionClosedError: received 1011 (internal error) keepalive ping timeout; then sent \
1011 (internal error) keepalive ping timeout
"""
NEXT_RECORD = b"10:06:31.004 | INFO    | prefect.flow_runs.worker - Worker 'outbox-a' stopped\n"


def test_the_websocket_trace_is_dropped_only_after_the_worker_continues_from_its_stop(tmp_path: Path) -> None:
    lines = (WEBSOCKET_TRACE + NEXT_RECORD).splitlines(keepends=True)
    running, stopping = tmp_path / "running", tmp_path / "stopping"
    with running.open("wb") as target:
        StopNoiseFilter(target).relay(iter(lines))
    with stopping.open("wb") as target:
        noise = StopNoiseFilter(target)
        noise.stopping.set()
        noise.relay(iter(lines))
    assert running.read_bytes() == WEBSOCKET_TRACE + NEXT_RECORD, "a real error in normal running is shown"
    assert stopping.read_bytes() == NEXT_RECORD


def test_a_url_in_a_line_the_supervisor_passes_on_shows_no_secret(tmp_path: Path) -> None:
    lines = [
        b'10:06:30.001 | INFO    | httpx - HTTP Request: POST https://h.example/in?token=tok-9Xq "HTTP/1.1 200 OK"\n',
        b"10:06:30.002 | ERROR   | nats - cannot reach nats://ntok-4Rw@10.0.0.5:4222 \xff\n",
        NEXT_RECORD,
    ]
    passed = tmp_path / "passed"
    with passed.open("wb") as target:
        StopNoiseFilter(target).relay(iter(lines))
    assert passed.read_bytes() == (
        b'10:06:30.001 | INFO    | httpx - HTTP Request: POST https://h.example/in?*** "HTTP/1.1 200 OK"\n'
        b"10:06:30.002 | ERROR   | nats - cannot reach nats://***@10.0.0.5:4222 \xff\n" + NEXT_RECORD
    )
