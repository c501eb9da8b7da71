"""`outbox worker`'s orderly stop, on a real Prefect server with real processes. A stand-in for Prefect's
worker starts three flow-run processes (each names its run in PREFECT__FLOW_RUN_ID, as Prefect's worker
does): one whose run is Running, one whose run is still Pending, one whose run has just ended. The stop
sends SIGTERM to the Running one only, ends the Pending run Cancelled after killing its process, leaves
the ended run as it was, and stops the worker last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from outbox.worker import PrefectApi, Supervisor, flow_run_processes
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
        supervisor = Supervisor([], PrefectApi(f"{prefect_server.url}/api", None, None), grace_seconds=10)
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
