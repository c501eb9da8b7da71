"""The local stack of `outbox demo`: every process it starts, and how it stops them (by PID).

    embedded PostgreSQL (or OUTBOX_DATABASE_URL) ─ migrate ─ example application
    SMTP sink (+ its mailbox page) ─ webhook receiver (verifies, deduplicates by webhook-id, fails a share)
    ─ the local Slack, GitHub and GitLab APIs (demo.apis: the posts' providers, with tokens of their own)
    ─ nats-server with JetStream and the stream ACCOUNTS (when Debian's nats-server is installed)
    ─ Prefect server (flow runs kept 14 days; its state in SQLite under
    PREFECT_HOME, or in the PostgreSQL database given as `prefect_database_url`) ─ work pool, zombie
    automation, deployments ─ metrics exporter ─ N `outbox worker` replicas running outbox-drain flow runs

Each worker takes runs from the pool's `default` queue (the schedule's runs) and from a queue of its own,
named after it: `start_drain_per_worker` puts one run in each worker's queue, so every replica gets
exactly one and no two workers race to submit the same run.

Prefect is driven through its command line and its REST API. Every server listens on 127.0.0.1; every
child is started here, in a session of its own (a Ctrl-C in the terminal reaches this process only, which
then stops them in order), and stopped here, SIGTERM first, then SIGKILL after a grace period.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import httpx
import psutil

from demo import prometheus
from demo.apis import LocalApis
from demo.nats import NATS_SERVER, NatsServer
from demo.receiver import Receiver
from demo.sink import Faults, SmtpSink
from examples.accounts import events
from flows.live import LIVE_KEY
from outbox.executor.config import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
DRAIN_DEPLOYMENT = "outbox-drain/outbox-drain"
# how long the workers get to start and poll their pool
WORKERS_START_SECONDS = 120.0


def descendants(pid: int) -> list[psutil.Process]:
    """Every process `pid` started, and they started, that still runs. A psutil.Process remembers its
    start time, so killing it later can never hit another process that reused its PID."""
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def kill_all(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def stop_process(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def prefect_cli(args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One `prefect` command, run from the project folder; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "prefect", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def prefect_worker_name(name: str) -> str:
    """The Prefect name of the stack's worker `name` (worker-1 -> outbox-worker-1)."""
    return f"outbox-{name}"


def flaky_script(share: float, steps: int) -> list[str]:
    """What the webhook receiver does with the first deliveries of its next `steps` webhooks: a `share` of them
    fail as receivers do (500, a reset after the body was read, a reset after the delivery was kept: its answer
    lost), the rest are kept, and so is every later one. Seeded, as the SMTP sink's faults are."""
    rng = random.Random(7)
    faults = ("500", "reset", "kept-reset")
    return [rng.choice(faults) if rng.random() < share else "ok" for _ in range(steps)]


def _subjects(subjects: tuple[str, ...]) -> list[str]:
    return [argument for subject in subjects for argument in ("--subject", subject)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            response.read()  # the whole answer: the server never writes to a closed connection
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_until_answers(url: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not answers(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f} s")
        time.sleep(0.2)


@dataclass
class Stack:
    database_url: str
    workdir: Path
    workers: int = 3
    flaky: float = 0.1
    adapters: str = "examples.accounts:all_adapters"
    # a shorter lease makes a killed worker's actions come back sooner (tests)
    lease_seconds: float = DEFAULTS.lease_seconds
    # the deployments to apply (a copy with a shorter drain interval speeds a soak up)
    prefect_file: Path = ROOT / "deploy" / "prefect.yaml"
    # where the Prefect server keeps its state (postgresql+asyncpg://...); None: SQLite under PREFECT_HOME
    prefect_database_url: str | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    sink: SmtpSink | None = None
    # the webhook endpoint `alerts` of the example application, and its signing secret
    receiver: Receiver | None = None
    webhook_secret: str = field(default_factory=lambda: "whsec_" + base64.b64encode(os.urandom(32)).decode())
    # the events' JetStream server; None when nats-server is not installed (the demo sends no events then)
    nats: NatsServer | None = None
    # the local Slack, GitHub and GitLab APIs the demo application's posts reach (demo.posts)
    apis: LocalApis = field(default_factory=LocalApis)
    prefect_url: str = ""
    metrics_url: str = ""
    mailbox_url: str = ""
    # the demo's Prometheus (start_prometheus); "" when Debian's prometheus is not installed
    prometheus_url: str = ""
    _mailbox: ThreadingHTTPServer | None = None

    # ---- start ------------------------------------------------------------------------------------

    def start(self, news: Callable[[str], None] = lambda _: None) -> None:
        """Start every part, each one announced to `news`, and return once every worker polls its pool: a run created
        then is taken within the poll (PREFECT_WORKER_QUERY_SECONDS, 1 s here), not after a worker's own start-up
        (two Python processes importing Prefect: 10 s and more on two busy cores). From then to its first claim a run
        spends, on two busy cores with three runs starting at once, 0.5 s in its process starting, 4 to 6.5 s
        importing Python and Prefect, 9 to 10 s loading the flow (outbox and SQLAlchemy's PostgreSQL dialect; 1.3 s
        alone on a core) and 1 to 1.5 s starting its executor and claiming."""
        self.workdir = self.workdir.resolve()
        (self.workdir / "prefect").mkdir(parents=True, exist_ok=True)
        for log in self.workdir.glob("*.log"):  # each stack's logs start empty: none holds an earlier one's lines
            log.unlink()
        news("the SMTP sink, the webhook receiver, the local Slack, GitHub and GitLab APIs, and nats-server")
        self.sink = SmtpSink(faults=Faults(flaky=self.flaky), seed=7).start()
        self._serve_mailbox()
        # faults on first deliveries only: a retry (5 s later) is kept, never waits the schedule's 5 minutes
        self.receiver = Receiver(self.webhook_secret, first_deliveries_only=True).start()
        self.apis.start(self.workdir)
        if Path(NATS_SERVER).is_file():
            store = self.workdir / "nats"  # made afresh, as the Prefect server's database is
            shutil.rmtree(store, ignore_errors=True)
            store.mkdir(parents=True)
            self.nats = NatsServer(store)
            self._outbox("nats", "ensure-stream", "--stream", events.STREAM, *_subjects(events.STREAM_SUBJECTS))
        news("the Prefect server (its first start migrates its database: up to a minute)")
        self._start_prefect()
        news(f"the work pool and {self.workers} workers")
        self._prefect("work-pool", "create", "outbox", "--type", "process", "--overwrite")
        # the workers start as soon as their pool is there: their start-up (two Python processes each, both
        # importing Prefect) overlaps the automation and the deployments being applied
        for n in range(self.workers):
            self.start_worker(f"worker-{n + 1}")
        metrics_port = free_port()
        self._spawn("exporter", [sys.executable, "-m", "outbox.cli", "metrics", "serve", "--port", str(metrics_port)])
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        news("the automation and the deployments outbox-drain and outbox-purge")
        self._prefect("automation", "create", "--from-file", str(ROOT / "deploy" / "prefect-automations.yaml"))
        self._prefect("--no-prompt", "deploy", "--all", "--prefect-file", str(self.prefect_file))
        wait_until_answers(self.metrics_url, 30, "the metrics exporter")
        news(f"waiting until the {self.workers} workers poll the pool (each imports Prefect first)")
        self.wait_for_workers(WORKERS_START_SECONDS)

    def start_prometheus(self) -> list[str] | None:
        """A Prometheus scraping the exporter with the shipped alert rules, when `prometheus` is installed
        (then None); else the command that starts one, its configuration written."""
        folder = self.workdir / "prometheus"
        shutil.rmtree(folder, ignore_errors=True)  # a fresh series each demo, as the databases are
        folder.mkdir(parents=True)
        metrics_port = urllib.parse.urlsplit(self.metrics_url).port
        assert metrics_port is not None  # the exporter started
        (folder / "prometheus.yml").write_text(prometheus.config(metrics_port))
        binary = shutil.which("prometheus")
        port = free_port() if binary else prometheus.PORT
        command = prometheus.command(binary or "prometheus", folder, port)
        if binary is None:
            return command
        self._spawn("prometheus", command)
        self.prometheus_url = f"http://127.0.0.1:{port}"
        wait_until_answers(f"{self.prometheus_url}/-/ready", 60, "Prometheus")
        return None

    def online_workers(self) -> set[str]:
        """The Prefect names of the pool's ONLINE workers (each has sent a heartbeat lately: it polls)."""
        body = {"workers": {"status": {"any_": ["ONLINE"]}}}
        return {worker["name"] for worker in self.prefect_api("POST", "/work_pools/outbox/workers/filter", body)}

    def wait_for_workers(self, timeout: float) -> None:
        """Wait until every worker started here polls the pool, for at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while missing := set(self.worker_names()) - self.online_workers():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the workers {', '.join(sorted(missing))} did not poll within {timeout:.0f} s:"
                    f" see their logs in {self.workdir}"
                )
            time.sleep(0.5)

    def _outbox(self, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "outbox.cli", *args], env=self.env(), capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(f"outbox {' '.join(args)} failed: {(done.stdout + done.stderr)[-2000:]}")

    def run_drain_now(self, runs: int | None = None) -> None:
        """Start `runs` outbox-drain runs (one per worker by default) now, as the schedule's ticks would;
        any worker may take any of them."""
        for _ in range(self.workers if runs is None else runs):
            self._prefect("deployment", "run", DRAIN_DEPLOYMENT)

    def start_drain_per_worker(self) -> dict[str, str]:
        """One outbox-drain run in each worker's own queue, now: {worker's Prefect name: run id}."""
        deployment = self.prefect_api("GET", f"/deployments/name/{DRAIN_DEPLOYMENT}")
        runs = {}
        for name in self.worker_names():
            body = {"work_queue_name": name, "tags": ["outbox"]}
            runs[name] = self.prefect_api("POST", f"/deployments/{deployment['id']}/create_flow_run", body)["id"]
        return runs

    def worker_names(self) -> list[str]:
        """The Prefect names of the workers running now (each is also the name of its own queue)."""
        return [prefect_worker_name(name) for name in self.processes if name.startswith("worker")]

    def flow_runs(self, run_ids: list[str]) -> list[dict[str, Any]]:
        body = {"flow_runs": {"id": {"any_": run_ids}}, "limit": len(run_ids)}
        return list(self.prefect_api("POST", "/flow_runs/filter", body))

    def drain_runs(self) -> list[dict[str, Any]]:
        """Every run of the drain deployment that has left its schedule (the first ones and those that took
        over), oldest first."""
        deployment = self.prefect_api("GET", f"/deployments/name/{DRAIN_DEPLOYMENT}")
        body = {
            "flow_runs": {
                "deployment_id": {"any_": [deployment["id"]]},
                "state": {"type": {"not_any_": ["SCHEDULED"]}},
            },
            "sort": "START_TIME_ASC",
        }
        return list(self.prefect_api("POST", "/flow_runs/filter", body))

    def run_url(self, run_id: str) -> str:
        """A flow run's page in the Prefect UI."""
        return f"{self.prefect_url}/runs/flow-run/{run_id}"

    def live_view_url(self, run_id: str) -> str | None:
        """The page of a drain run's live view (its artifact, refreshed while the run works), once it has one."""
        body = {"artifacts": {"flow_run_id": {"any_": [run_id]}, "key": {"any_": [LIVE_KEY]}}}
        found = self.prefect_api("POST", "/artifacts/filter", body)
        return f"{self.prefect_url}/artifacts/artifact/{found[0]['id']}" if found else None

    def pause_drain(self) -> None:
        """Pause the outbox-drain deployment, as an operator stopping the drain would: no tick starts a run,
        and a run stopped with its worker is not replaced (it hands back and ends Completed)."""
        deployment = self.prefect_api("GET", f"/deployments/name/{DRAIN_DEPLOYMENT}")
        self.prefect_api("POST", f"/deployments/{deployment['id']}/pause_deployment")

    def _has_queue(self, queue: str) -> bool:
        queues = self.prefect_api("POST", "/work_pools/outbox/queues/filter", {})
        return any(found["name"] == queue for found in queues)

    def prefect_api(self, method: Literal["GET", "POST"], path: str, body: object = None) -> Any:
        """One call to the stack's Prefect server through Prefect's client (`path` under /api), its JSON answer."""
        from prefect.client.orchestration import SyncPrefectClient

        with SyncPrefectClient(f"{self.prefect_url}/api") as client:
            return client.request(method, path, json=body).json()  # type: ignore[arg-type]  # a route with its ids

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        """`outbox worker` on the pool's default queue and on a queue of its own, named after it. The queue is
        made first: a worker that polls a queue the pool does not have finds no run in any of its queues."""
        if not self._has_queue(prefect_worker_name(name)):
            self.prefect_api("POST", "/work_pools/outbox/queues", {"name": prefect_worker_name(name)})
        queues = ["--work-queue", "default", "--work-queue", prefect_worker_name(name)]
        command = [
            *[sys.executable, "-m", "outbox.cli", "worker", "--name", prefect_worker_name(name), "--grace", "60"],
            *["--", *queues],
        ]
        return self._spawn(name, command)

    def stop_worker(self, name: str) -> int:
        """SIGTERM one worker, as a replica being stopped; its runs hand back and end. Returns its exit code."""
        process = self.processes.pop(name)
        process.send_signal(signal.SIGTERM)
        return process.wait(90)

    def env(self) -> dict[str, str]:
        assert self.sink is not None and self.receiver is not None
        effects = {
            "ACCOUNTS_ALERTS_WEBHOOK_URL": self.receiver.url,
            "OUTBOX_WEBHOOK_SECRET_ALERTS": self.webhook_secret,
            **self.apis.environment(),
        }
        if self.nats is not None:
            effects["OUTBOX_NATS_URL"] = self.nats.url
        return {
            **os.environ,
            **effects,
            "PYTHONPATH": str(ROOT),
            "OUTBOX_DATABASE_URL": self.database_url,
            "OUTBOX_SMTP_HOST": "127.0.0.1",
            "OUTBOX_SMTP_PORT": str(self.sink.port),
            "OUTBOX_SMTP_TLS": "none",
            "OUTBOX_SMTP_SENDER": "outbox@example.com",
            "OUTBOX_SMTP_TIMEOUT_SECONDS": "5",
            "OUTBOX_ADAPTERS": self.adapters,
            "OUTBOX_LEASE_SECONDS": str(self.lease_seconds),
            "PREFECT_HOME": str(self.workdir / "prefect"),
            "PREFECT_API_URL": f"{self.prefect_url}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # flow runs that ended more than 14 days ago are removed, looked for hourly
            "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "events,flow_runs",
            "PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD": str(14 * 86_400),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
            "PREFECT_LOGGING_EXTRA_LOGGERS": "outbox",
            "OUTBOX_ENVIRONMENT": "demo",
        }

    def _start_prefect(self) -> None:
        port = free_port()
        self.prefect_url = f"http://127.0.0.1:{port}"
        database = (
            {"PREFECT_API_DATABASE_CONNECTION_URL": self.prefect_database_url} if self.prefect_database_url else {}
        )
        self._spawn(
            "prefect-server",
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            database,
        )
        wait_until_answers(f"{self.prefect_url}/api/health", 120, "the Prefect server")

    def _prefect(self, *args: str) -> None:
        done = prefect_cli(args, self.env())
        if done.returncode != 0:
            raise RuntimeError(f"prefect {' '.join(args)} failed: {(done.stdout + done.stderr)[-2000:]}")

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                command,
                env={**self.env(), **(env or {})},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        return process

    def _serve_mailbox(self) -> None:
        assert self.sink is not None
        sink: SmtpSink = self.sink

        class Mailbox(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(
                    [
                        {"message_id": r.message_id, "to": list(r.rcpt_tos), "subject": r.subject}
                        for r in list(sink.received)
                    ],
                    indent=1,
                ).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a reader that left
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._mailbox = ThreadingHTTPServer(("127.0.0.1", free_port()), Mailbox)
        threading.Thread(target=self._mailbox.serve_forever, daemon=True).start()
        self.mailbox_url = f"http://127.0.0.1:{self._mailbox.server_address[1]}/"

    # ---- stop ----------------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL one process and every process it started (a worker's flow runs run in sessions of their
        own), as a crashed machine would."""
        process = self.processes.pop(name)
        children = descendants(process.pid)
        process.kill()
        kill_all(children)
        process.wait(10)

    def stop_drain(self) -> None:
        """Pause the drain deployment, then stop every worker at once, as replicas being stopped: their runs
        hand back what they have not fenced and end Completed, with nothing taking their place (a Prefect
        server that does not answer leaves them to be replaced, on a stack that is going). Whatever a worker
        started and left behind is killed last."""
        if self.prefect_url and "prefect-server" in self.processes:
            with contextlib.suppress(httpx.HTTPError):
                self.pause_drain()
        workers = [name for name in self.processes if name.startswith("worker")]
        started = [child for name in workers for child in descendants(self.processes[name].pid)]
        for name in workers:  # all at once: each waits for its runs to hand back
            if self.processes[name].poll() is None:
                self.processes[name].send_signal(signal.SIGTERM)
        for name in workers:
            process = self.processes.pop(name)
            try:
                process.wait(90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        kill_all(started)

    def stop(self) -> None:
        """The drain first (stop_drain), then everything else, the Prefect server last; whatever a child
        started and left behind goes last. A Ctrl-C meanwhile kills what is left at once."""
        try:
            self.stop_drain()
            self._stop_in_order()
        except KeyboardInterrupt:
            for name in list(self.processes):
                self.kill(name)
            raise
        finally:
            if self._mailbox is not None:
                self._mailbox.shutdown()
            if self.sink is not None:
                self.sink.stop()
            if self.receiver is not None:
                self.receiver.stop()
            self.apis.stop()
            if self.nats is not None:
                self.nats.stop()

    def _stop_in_order(self) -> None:
        order = sorted(self.processes, key=lambda n: n == "prefect-server")
        started = [child for name in order for child in descendants(self.processes[name].pid)]
        for name in order:
            stop_process(self.processes[name], 60)
        kill_all(started)
        self.processes.clear()
