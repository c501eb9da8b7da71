"""deploy/compose.yaml, run as local processes: Docker is not available here, so this test reads the compose
file and starts what it describes, in its order, with its commands and environment. A change to the file
changes what runs here.

The translation, every rule of it:

1. Programs. The outbox image (built from deploy/Dockerfile, whose ENTRYPOINT, WORKDIR and ENV are read):
   `outbox` is `python -m outbox.cli`, `prefect` is `python -m prefect`, `python` is this interpreter; a
   `sh -c` script runs under the local `sh` with this interpreter's bin directory (where the console
   scripts `outbox` and `prefect` are) first on PATH. `prom/prometheus` is Debian's `prometheus` binary.
2. Addresses. Each service that publishes a port gets a free local port: `<service>:<its container port>`
   anywhere, and `localhost`, `0.0.0.0` or `127.0.0.1` with its container or published port in its own
   definition, become `127.0.0.1:<free port>`; `--port <container port>` becomes `--port <free port>`;
   any other `0.0.0.0` becomes `127.0.0.1`; an environment value that is just a service's name becomes
   `127.0.0.1`.
3. Replaced services. `postgres` is the test's PostgreSQL server: its POSTGRES_DB is the test database
   (fixture `database_url`), each other database a URL names (Prefect's, made by postgres-init.sql) is
   created here and dropped after. `mailcatcher` is an SMTP relay (`demo.sink.SmtpSink`), and
   OUTBOX_SMTP_PORT its port. `grafana` is skipped: its provisioning is tested by test_deploy_files.py and
   test_dashboards.py.
4. Paths. The outbox image's WORKDIR (/app, a copy of the repository) is the repository root. Any other
   absolute container path (an argument or value starting with `/`, or its part after `=`) lives under
   the service's own directory in tmp_path (shared by its replicas), which has a tmp/ as every image does,
   where bind-mounted files are copied (with rule 2 applied to them) and named volumes are empty
   directories.
5. Environment. The host's, without its PREFECT_* and OUTBOX_* variables, then the image's ENV, then the
   service's `environment`, with `${NAME:-default}` read as its default (nothing set).
6. Replicas. 2 instead of `deploy.replicas`; replica n gets `--name outbox-<service>-<n>` appended to its
   command, as each container has a hostname of its own (the default name of `outbox worker`).
7. Order. `depends_on`: `service_healthy` runs the service's healthcheck command (translated) until it
   succeeds; `service_completed_successfully` marks a one-shot step, run to exit code 0 before its
   dependents start.
8. Stopping. In reverse order of start: SIGTERM, SIGKILL after the service's `stop_grace_period` (10 s
   when unset, as Docker's), then whatever the processes started.

Then: emails enqueued, a drain run started per worker (`prefect deployment run`, as the schedule's first
tick is 300 s away), every email delivered exactly once; Prometheus reports the exporter up and loads the
rules; the deployment stores the adapters and names the flow by module; a restart of the one-shot steps keeps one
zombie automation; the workers stop with their runs Completed.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from demo.run import enqueue_workload
from demo.sink import SmtpSink
from demo.stack import ROOT, descendants, free_port, kill_all
from examples.accounts import schema
from tests.support import until

COMPOSE = ROOT / "deploy" / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
REPLICAS = 2
SKIPPED = {"grafana"}  # rule 3
DATABASE, RELAY = "postgres", "mailcatcher"  # rule 3: replaced
EMAILS, LANES = 60, 12
DOCKER_STOP_GRACE = 10.0

POSTGRES_URL = re.compile(rf"(?P<driver>postgresql(?:\+\w+)?)://[^@/\s]*@{DATABASE}:5432/(?P<database>\w+)")
CONTAINER_PATH = re.compile(r"(^|=)(/[^\s'\"=:]*)")
COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


# ---- reading the compose file and the image -----------------------------------------------------------


@dataclass(frozen=True)
class Image:
    entrypoint: list[str]
    workdir: str
    env: dict[str, str]


def outbox_image() -> Image:
    """The ENTRYPOINT, WORKDIR and ENV of deploy/Dockerfile."""
    entrypoint: list[str] = []
    workdir = "/"
    env: dict[str, str] = {}
    for line in DOCKERFILE.read_text().splitlines():
        instruction, _, rest = line.partition(" ")
        if instruction == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif instruction == "WORKDIR":
            workdir = rest.strip()
        elif instruction == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    return Image(entrypoint, workdir, env)


def load_compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return compose


def interpolate(value: str) -> str:
    """Compose's `${NAME:-default}` with nothing set: the default (the host's variables stay out)."""
    return COMPOSE_VARIABLE.sub(lambda m: m.group(2) or "", value).replace("$$", "$")


def dependencies(service: dict[str, Any]) -> dict[str, str]:
    """depends_on, in either form, as {service: condition}."""
    declared = service.get("depends_on") or {}
    if isinstance(declared, list):
        return {name: "service_started" for name in declared}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in declared.items()}


def seconds(duration: str | None, default: float) -> float:
    """A compose duration (`2m`, `1m30s`, `90s`, `2s`) in seconds."""
    if duration is None:
        return default
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    assert parts, f"cannot read the duration {duration!r}"
    return sum(float(n) * units[unit] for n, unit in parts)


def start_order(services: dict[str, Any]) -> list[str]:
    """Every service but the skipped and replaced ones, each after what it depends on (file order otherwise)."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"depends_on has a cycle through {name}"
        if name in order or name in SKIPPED | {DATABASE, RELAY}:
            return
        for dependency in dependencies(services[name]):
            visit(dependency, (*path, name))
        order.append(name)

    for name in services:
        visit(name, ())
    return order


def one_shots(services: dict[str, Any]) -> set[str]:
    return {
        dependency
        for service in services.values()
        for dependency, condition in dependencies(service).items()
        if condition == "service_completed_successfully"
    }


def program(name: str) -> list[str]:
    """Rule 1."""
    if name in ("/bin/prometheus", "prometheus"):
        prometheus = shutil.which("prometheus")
        assert prometheus, "Debian's prometheus is missing: `make system-packages` installs it"
        return [prometheus]
    programs = {
        "outbox": [sys.executable, "-m", "outbox.cli"],
        "prefect": [sys.executable, "-m", "prefect"],
        "python": [sys.executable],
    }
    return programs.get(name, [name])


# ---- the translation ------------------------------------------------------------------------------------


@dataclass
class Translation:
    """Rules 1 to 6: from a service's definition to the command, environment and directory of a process."""

    services: dict[str, Any]
    image: Image
    databases: dict[str, str]  # database in the compose file -> URL of its local counterpart (rule 3)
    relay_port: int
    workdir: Path
    ports: dict[str, int] = field(default_factory=dict)  # service -> its free local port (rule 2)

    def __post_init__(self) -> None:
        for name, service in self.services.items():
            if service.get("ports") and name not in SKIPPED | {DATABASE, RELAY}:
                self.ports[name] = free_port()

    def published(self, name: str) -> list[tuple[str, str]]:
        """(published port, container port) of each `127.0.0.1:P:C` mapping of the service."""
        pairs = [port.split(":") for port in self.services[name].get("ports", [])]
        return [(published, inside) for _, published, inside in pairs]

    def text(self, value: str, name: str) -> str:
        """Rules 2 to 5 on one argument or environment value of service `name`."""
        value = interpolate(value)
        value = CONTAINER_PATH.sub(lambda m: m.group(1) + str(self.local_path(m.group(2), name)), value)
        value = POSTGRES_URL.sub(self._database, value)
        return self.addresses(value, name)

    def addresses(self, value: str, name: str) -> str:
        """Rule 2 (but the service names standing alone)."""
        for other, port in self.ports.items():
            local = f"127.0.0.1:{port}"
            for published, inside in self.published(other):
                value = re.sub(rf"(?<![\w.-]){re.escape(other)}:{inside}(?!\d)", local, value)
                if other == name:
                    value = re.sub(rf"\b(localhost|0\.0\.0\.0|127\.0\.0\.1):({inside}|{published})(?!\d)", local, value)
        return value.replace("0.0.0.0", "127.0.0.1")

    def _database(self, match: re.Match[str]) -> str:
        url = make_url(self.databases[match["database"]]).set(drivername=match["driver"])
        return url.render_as_string(hide_password=False)

    def local_path(self, container_path: str, name: str) -> Path:
        """Rule 4: the image's WORKDIR is the repository; anything else is under the container's directory."""
        workdir = self.image.workdir.rstrip("/")
        if self.is_outbox(name) and (container_path == workdir or container_path.startswith(workdir + "/")):
            return ROOT / container_path[len(workdir) :].lstrip("/")
        return self.workdir / name / container_path.lstrip("/")

    def is_outbox(self, name: str) -> bool:
        return bool(self.services[name].get("image") == self.outbox_image_name())

    def outbox_image_name(self) -> str:
        built = [s["image"] for s in self.services.values() if "build" in s]
        assert len(built) == 1, "one service builds the outbox image"
        return str(built[0])

    def argv(self, name: str, words: list[str]) -> list[str]:
        """Rule 1 on the program, rules 2 and 4 on its arguments (an exec-form command of service `name`)."""
        inside = {c for _, c in self.published(name)}
        arguments: list[str] = []
        for previous, word in itertools.pairwise(words):
            arguments.append(
                str(self.ports[name]) if previous == "--port" and word in inside else self.text(word, name)
            )
        return [*program(words[0]), *arguments]

    def command(self, name: str, replica: int | None = None) -> list[str]:
        service = self.services[name]
        if self.is_outbox(name):
            entrypoint: list[str] = service.get("entrypoint", self.image.entrypoint)
        else:
            image = str(service["image"])
            assert image.startswith("prom/prometheus:"), f"no local counterpart for the image {image}"
            entrypoint = service.get("entrypoint", ["/bin/prometheus"])
        words = [*entrypoint, *service.get("command", [])]
        assert all(isinstance(w, str) for w in words), f"{name}: exec form only"
        argv = self.argv(name, words)
        if replica is not None:
            argv += ["--name", f"outbox-{name}-{replica}"]  # rule 6
        return argv

    def env(self, name: str) -> dict[str, str]:
        """Rule 5 (and rule 1's PATH)."""
        (self.workdir / name / "tmp").mkdir(parents=True, exist_ok=True)  # every image has a /tmp
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "OUTBOX_"))}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        declared = self.services[name].get("environment") or {}
        assert isinstance(declared, dict), f"{name}: environment as a mapping"
        for key, value in {**(self.image.env if self.is_outbox(name) else {}), **declared}.items():
            if key == "OUTBOX_SMTP_PORT":
                env[key] = str(self.relay_port)
            else:
                env[key] = "127.0.0.1" if value in self.services else self.text(str(value), name)
        return env

    def cwd(self, name: str) -> Path:
        service = self.services[name]
        default = self.image.workdir if self.is_outbox(name) else "/"
        path = self.local_path(str(service.get("working_dir", default)), name)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def mount(self, name: str) -> None:
        """Rule 4: bind-mounted files copied into the container's directory; named volumes empty there."""
        for volume in self.services[name].get("volumes", []):
            source, target = volume.split(":")[:2]
            local = self.local_path(target, name)
            local.parent.mkdir(parents=True, exist_ok=True)
            if source.startswith("."):
                local.write_text(self.addresses((COMPOSE.parent / source).read_text(), name))
            else:
                local.mkdir(exist_ok=True)


# ---- running it -----------------------------------------------------------------------------------------


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    grace: float


@dataclass
class ComposeStack:
    translation: Translation
    running: list[Running] = field(default_factory=list)
    healthy: set[str] = field(default_factory=set)

    @property
    def services(self) -> dict[str, Any]:
        return self.translation.services

    def up(self) -> None:
        oneshot = one_shots(self.services)
        for name in start_order(self.services):
            for dependency, condition in dependencies(self.services[name]).items():
                if condition == "service_healthy" and dependency not in {DATABASE, RELAY}:
                    self.wait_healthy(dependency)
            if name in oneshot:
                self.run_once(name)
            else:
                self.start(name)

    def run_once(self, name: str, argv: list[str] | None = None) -> str:
        """A one-shot step (or `docker compose run` of another command in the service), to exit code 0."""
        t = self.translation
        done = subprocess.run(
            argv or t.command(name), env=t.env(name), cwd=t.cwd(name), capture_output=True, text=True, timeout=180
        )
        with (t.workdir / f"{name}.log").open("a") as log:
            log.write(done.stdout + done.stderr)
        assert done.returncode == 0, f"{name} failed: {(done.stdout + done.stderr)[-3000:]}"
        return done.stdout

    def start(self, name: str) -> None:
        t, service = self.translation, self.services[name]
        t.mount(name)
        replicas = [None] if "replicas" not in service.get("deploy", {}) else list(range(1, REPLICAS + 1))
        for replica in replicas:
            container = name if replica is None else f"{name}-{replica}"
            log = (t.workdir / f"{container}.log").open("ab")
            process = subprocess.Popen(
                t.command(name, replica), env=t.env(name), cwd=t.cwd(name), stdout=log, stderr=subprocess.STDOUT
            )
            log.close()
            self.running.append(Running(name, process, seconds(service.get("stop_grace_period"), DOCKER_STOP_GRACE)))

    def wait_healthy(self, name: str) -> None:
        if name in self.healthy:
            return
        check = self.services[name]["healthcheck"]
        kind, *words = check["test"]
        assert kind == "CMD", f"{name}: a CMD healthcheck"
        t = self.translation
        argv, env = t.argv(name, words), t.env(name)
        interval = seconds(check.get("interval"), 30.0)
        deadline = interval * check.get("retries", 3) + seconds(check.get("start_period"), 0.0) + 60

        def passes() -> bool:
            self.assert_running(name)
            return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode == 0

        until(passes, timeout=deadline, what=f"{name} to be healthy")
        self.healthy.add(name)

    def assert_running(self, name: str) -> None:
        for entry in self.running:
            if entry.name == name:
                assert entry.process.poll() is None, f"{name} exited with {entry.process.returncode}"

    def stop(self, name: str | None = None) -> None:
        """Rule 8, for one service or (None) everything, in reverse order of start."""
        names = [name] if name else list(dict.fromkeys(entry.name for entry in reversed(self.running)))
        for service in names:
            stopping = [entry for entry in self.running if entry.name == service]
            started = [child for entry in stopping for child in descendants(entry.process.pid)]
            for entry in stopping:  # the replicas of a service stop together, as compose stops them
                if entry.process.poll() is None:
                    entry.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + max((entry.grace for entry in stopping), default=0.0)
            for entry in stopping:
                try:
                    entry.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    entry.process.kill()
                    entry.process.wait(10)
                self.running.remove(entry)
            kill_all(started)


# ---- the test ---------------------------------------------------------------------------------------------


@pytest.fixture
def other_databases(admin_engine: Engine, database_url: str) -> Iterator[dict[str, str]]:
    """Rule 3: each database the compose file names, here: POSTGRES_DB is the test's, the others are new."""
    compose = load_compose()
    named = {m["database"] for m in POSTGRES_URL.finditer(COMPOSE.read_text())}
    own = compose["services"][DATABASE]["environment"]["POSTGRES_DB"]
    databases = {own: database_url}
    created = []
    for database in sorted(named - {own}):
        local = f"{database}_compose_{os.getpid()}"
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{local}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{local}"'))
        created.append(local)
        databases[database] = make_url(database_url).set(database=local).render_as_string(hide_password=False)
    yield databases
    with admin_engine.connect() as conn:
        for local in created:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{local}" WITH (FORCE)'))


@pytest.fixture
def relay() -> Iterator[SmtpSink]:
    sink = SmtpSink(free_port()).start()
    yield sink
    sink.stop()


@pytest.fixture
def stack(other_databases: dict[str, str], relay: SmtpSink, tmp_path: Path) -> Iterator[ComposeStack]:
    translation = Translation(load_compose()["services"], outbox_image(), other_databases, relay.port, tmp_path)
    compose = ComposeStack(translation)
    try:
        compose.up()
        yield compose
    finally:
        compose.stop()


def api(stack: ComposeStack, path: str, body: object | None = None) -> Any:
    """The Prefect API at the address the workers use."""
    base = stack.translation.env("worker")["PREFECT_API_URL"]
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, method="GET" if body is None else "POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def prometheus(stack: ComposeStack, path: str) -> Any:
    url = f"http://127.0.0.1:{stack.translation.ports['prometheus']}/api/v1/{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())["data"]


def exporter_up(stack: ComposeStack) -> list[str]:
    """`up` of each exporter target, as Prometheus last scraped it."""
    query = urllib.parse.quote('up{job="outbox"}')
    return [result["value"][1] for result in prometheus(stack, f"query?query={query}")["result"]]


def ended(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL")).scalar_one())


def drain_runs(stack: ComposeStack) -> list[dict[str, Any]]:
    """The outbox-drain runs that were started (not the scheduled ones)."""
    runs = api(stack, "/flow_runs/filter", {"deployments": {"name": {"any_": ["outbox-drain"]}}})
    return [run for run in runs if run["state_type"] != "SCHEDULED"]


def test_the_compose_stack_drains_every_email_exactly_once(
    engine: Engine, stack: ComposeStack, relay: SmtpSink
) -> None:
    services = stack.services
    with engine.begin() as conn:
        schema.create(conn)
    enqueue_workload(engine, EMAILS, LANES)
    for _ in range(REPLICAS):  # the schedule's first tick is 300 s away
        stack.run_once("deployments", [*program("prefect"), "deployment", "run", "outbox-drain/outbox-drain"])
    until(lambda: ended(engine) == EMAILS, timeout=120, what="every email to end")

    counts = Counter(r.message_id for r in relay.received)
    assert len(counts) == EMAILS and set(counts.values()) == {1}, "an email was lost or sent twice"
    with engine.connect() as conn:
        assert dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all()) == {
            "DONE": EMAILS
        }

    # the deployment stores what compose gave it at deploy time
    deployment = api(stack, "/deployments/name/outbox-drain/outbox-drain")
    expected_adapters = interpolate(services["deployments"]["environment"]["OUTBOX_ADAPTERS"])
    assert deployment["parameters"]["adapters"] == expected_adapters != ""
    assert deployment["entrypoint"] == "outbox_flows.drain:drain" and not deployment["pull_steps"]
    environment = interpolate(services["worker"]["environment"]["OUTBOX_ENVIRONMENT"])
    assert any(f"env:{environment}" in run["tags"] for run in drain_runs(stack)), "no run is tagged env:"

    # the Prefect server keeps ended flow runs 14 days
    vacuum = api(stack, "/admin/settings")["server"]["services"]["db_vacuum"]
    assert "flow_runs" in vacuum["enabled"] and vacuum["retention_period"] == "P14D"

    # Prometheus scrapes the exporter and loads the rules
    until(lambda: exporter_up(stack) == ["1"], timeout=60, what="Prometheus to scrape the exporter")
    assert {group["name"] for group in prometheus(stack, "rules")["groups"]} == {"outbox"}

    # a restart runs the one-shot steps again: still one zombie automation, one work pool, two deployments
    for name in start_order(services):
        if name in one_shots(services):
            stack.run_once(name)
    (wanted,) = yaml.safe_load((ROOT / "deploy" / "prefect-automations.yaml").read_text())["automations"]
    automations = api(stack, "/automations/filter", {})
    assert [(a["name"], a["trigger"]["within"]) for a in automations] == [(wanted["name"], wanted["trigger"]["within"])]
    assert [pool["name"] for pool in api(stack, "/work_pools/filter", {})] == ["outbox"]
    assert sorted(d["name"] for d in api(stack, "/deployments/filter", {})) == ["outbox-drain", "outbox-purge"]

    # stopping the workers: their drain runs hand back and end Completed
    assert any(run["state_type"] == "RUNNING" for run in drain_runs(stack))
    stack.stop("worker")
    assert {run["state_type"] for run in drain_runs(stack)} <= {"COMPLETED", "CANCELLED"}
    assert any(run["state_type"] == "COMPLETED" for run in drain_runs(stack))
