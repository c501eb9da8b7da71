"""`outbox worker`: a Prefect process worker that stops in order.

    outbox worker ─exec─▶ python -m outbox_flows.worker --pool POOL --name NAME --grace SECONDS -- [options]
                          (this supervisor, in the same process: the signals `outbox worker` gets are its)
    supervisor ─▶ python -m prefect worker start --pool POOL --type process --name NAME [options]
                  (in a session of its own: a Ctrl-C reaches this supervisor only; its stderr, and its
                  flow runs', pass through this supervisor)
    first SIGTERM or SIGINT:
      1. SIGSTOP the Prefect worker, so it takes no new run while its runs stop (it stays listed among
         the pool's workers: the relay's runs on the other replicas keep counting it, so a rolling restart
         leaves no fewer executors)
      2. each flow run it started: Running ─▶ SIGTERM (the drain hands back and ends Completed)
                                   not Running yet ─▶ SIGKILL, then set Cancelled through the Prefect API
                                   ended (its process finishing) ─▶ left to exit
      3. wait for the Running ones to exit (at most `grace` seconds; then SIGKILL: their leases expire
         and another replica takes their actions back, or ends an at-most-once one UNCERTAIN)
      4. SIGCONT and SIGTERM the Prefect worker; exit with its exit code
    second SIGTERM or SIGINT: SIGKILL the worker and its runs now

The supervisor's own log records, and each line of the stderr it passes on (the Prefect worker's and its
flow runs'), have every URL's query and the secret of its user information as *** (`hide_secrets_in_logs`).

A worker stopped for longer than its websockets' keepalive (about 20 s) finds them closed when it
continues, and Prefect logs each as a warning with a traceback. Those warnings, from the SIGCONT on, are
an effect of the stop itself: the supervisor drops them (and only them) from the stderr it passes on.

Why: on SIGTERM, Prefect's process worker kills the processes of its flow runs at once. Their runs stay
Running until a zombie automation marks them Crashed, and a run it had just submitted stays Pending.

The supervisor calls the Prefect API through Prefect's client, with the settings the worker reads
(PREFECT_API_URL, PREFECT_API_KEY or PREFECT_API_AUTH_STRING, the TLS and retry settings; from the
environment or the active Prefect profile).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO
from uuid import UUID

import httpx
import psutil
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.settings import get_current_settings
from prefect.states import Cancelled

from outbox._internal.redaction.log_records import hidden_text, hide_secrets_in_logs
from outbox.errors import OutboxError

log = logging.getLogger("outbox.worker")


# a flow run's state types: one not started yet is cancelled; one running is asked to stop (SIGTERM)
UNSTARTED = frozenset({StateType.SCHEDULED, StateType.PENDING})
STOPPABLE = frozenset({StateType.RUNNING, StateType.CANCELLING, StateType.PAUSED})
# what a call to the Prefect API raises when it cannot be made or is refused (Prefect's client has asked a
# busy server again by then)
API_FAILURES = (httpx.HTTPError, ObjectNotFound)
# the warning a Prefect observer logs when it finds its events websocket closed (a traceback follows)
WEBSOCKET_FAILED = re.compile(rb"Observer websocket failed with an exception")
# the first line of a record in Prefect's console log format (`HH:MM:SS.mmm | LEVEL | ...`)
RECORD_START = re.compile(rb"^\d\d:\d\d:\d\d\.\d+ \| ")


class WorkerSetupError(OutboxError):
    """`outbox worker` cannot start as asked."""


@dataclass(frozen=True)
class FlowRunProcess:
    run_id: str
    process: psutil.Process


class PrefectApi:
    """The calls the supervisor makes, through Prefect's client: a flow run's state type, ending a run
    Cancelled, and removing a worker from its pool's workers."""

    def __init__(self, client: SyncPrefectClient) -> None:
        self.client = client

    def state_type(self, run_id: str) -> StateType | None:
        state = self.client.read_flow_run(UUID(run_id)).state
        return state.type if state is not None else None

    def cancel(self, run_id: str, message: str) -> None:
        self.client.set_flow_run_state(run_id, Cancelled(message=message), force=True)


def prefect_client() -> SyncPrefectClient:
    """Prefect's client for the API the worker works for (never an ephemeral server of its own)."""
    if not get_current_settings().api.url:
        raise WorkerSetupError("PREFECT_API_URL is not set: outbox worker needs the Prefect API it works for")
    return get_client(sync_client=True)


def worker_command(pool: str, name: str, prefect_options: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "prefect",
        "worker",
        "start",
        "--pool",
        pool,
        "--type",
        "process",
        "--name",
        name,
        *prefect_options,
    ]


def flow_run_processes(worker_pid: int) -> list[FlowRunProcess]:
    """The topmost process of each flow run the worker started (it names its run in PREFECT__FLOW_RUN_ID)."""
    found: dict[str, FlowRunProcess] = {}
    try:
        descendants = psutil.Process(worker_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for process in descendants:  # parents come before their children
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            run_id = process.environ().get("PREFECT__FLOW_RUN_ID")
            if run_id and run_id not in found:
                found[run_id] = FlowRunProcess(run_id, process)
    return list(found.values())


class Supervisor:
    def __init__(self, command: list[str], api: PrefectApi, grace_seconds: float) -> None:
        self.command = command
        self.api = api
        self.grace_seconds = grace_seconds
        self.stderr = StopNoiseFilter(sys.stderr.buffer)
        self._signals = 0
        self._stop = threading.Event()
        self._worker: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self._worker = subprocess.Popen(self.command, start_new_session=True, stderr=subprocess.PIPE)
        assert self._worker.stderr is not None  # asked for above
        relay = threading.Thread(target=self.stderr.relay, args=(self._worker.stderr,), daemon=True)
        relay.start()
        while self._worker.poll() is None and not self._stop.wait(0.5):
            pass
        stopping = self._worker.poll() is None
        if stopping:
            self.stop_in_order(self._worker)
        code = self._worker.wait()
        relay.join(10)  # its flow runs have ended: the pipe closes with the worker
        return code

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            self._stop.set()
        elif self._worker is not None:  # a second signal: no more waiting
            for run in flow_run_processes(self._worker.pid):
                with contextlib.suppress(psutil.NoSuchProcess):
                    run.process.kill()
            self._worker.kill()

    def stop_in_order(self, worker: subprocess.Popen[bytes]) -> None:
        log.info("stopping: the worker takes no new run; its runs hand back and end")
        worker.send_signal(signal.SIGSTOP)
        try:
            running = []
            for run in flow_run_processes(worker.pid):
                state = self._state_type(run.run_id)
                if state in UNSTARTED:
                    self._cancel_unstarted(run)
                    continue
                if state in STOPPABLE:
                    run.process.send_signal(signal.SIGTERM)
                running.append(run)  # an ended run's process is finishing: wait for it too
            for process in wait_for_exit([run.process for run in running], self.grace_seconds):
                log.warning("flow run process %s did not end within %.0f s: killed", process.pid, self.grace_seconds)
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        finally:
            self.stderr.stopping.set()
            worker.send_signal(signal.SIGCONT)
            worker.send_signal(signal.SIGTERM)

    def _state_type(self, run_id: str) -> StateType | None:
        try:
            return self.api.state_type(run_id)
        except API_FAILURES as error:  # the API cannot tell: stop the run the orderly way
            log.warning("cannot read flow run %s (%s): stopping it as a running one", run_id, error)
            return StateType.RUNNING

    def _cancel_unstarted(self, run: FlowRunProcess) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            run.process.kill()
        try:
            self.api.cancel(run.run_id, "Its worker stopped before the run started.")
        except API_FAILURES as error:
            log.warning("cannot cancel flow run %s (%s): it stays as it is", run.run_id, error)


class StopNoiseFilter:
    """Passes the worker's stderr on, line by line, each URL's secret in it as *** (read as UTF-8, a byte that
    is not passing as it came). Once `stopping` is set (the worker continues after the stop), a
    websocket-failed warning of a Prefect observer is dropped with the traceback that follows it, up to the
    next log record; every other line passes."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target = target
        self.stopping = threading.Event()
        self._dropping = False

    def relay(self, source: Iterable[bytes]) -> None:
        for line in source:
            if self.passes(line):
                self.target.write(hidden_text(line.decode(errors="surrogateescape")).encode(errors="surrogateescape"))
                self.target.flush()

    def passes(self, line: bytes) -> bool:
        if self._dropping and not RECORD_START.match(line):
            return False
        self._dropping = self.stopping.is_set() and bool(WEBSOCKET_FAILED.search(line))
        return not self._dropping


def wait_for_exit(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited; return those still alive after `timeout` seconds. One that has
    exited but that its parent (the stopped worker) has not reaped yet has exited."""
    deadline = time.monotonic() + timeout
    alive = processes
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [process for process in alive if _alive(process)]
    return alive


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def arguments_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m outbox_flows.worker",
        description="The supervisor `outbox worker` runs; options after `--` go to `prefect worker start`.",
    )
    parser.add_argument("--pool", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--grace", type=float, required=True, help="seconds the runs get to hand back")
    return parser


def main(argv: Sequence[str]) -> int:
    """Run the Prefect worker under the supervisor until it exits; its exit code (2 when it cannot start)."""
    own, prefect_options = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    arguments = arguments_parser().parse_args(own)
    hide_secrets_in_logs()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        client = prefect_client()
    except WorkerSetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command = worker_command(arguments.pool, arguments.name, prefect_options)
    with client:
        return Supervisor(command, PrefectApi(client), arguments.grace).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
