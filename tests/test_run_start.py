"""`outbox run` as an application starts it: from its own folder, with its own kind.

The application's module lives in a folder of the test's own (not on the module path) and is found the way
uvicorn or celery find theirs, from the working folder. Before it claims, the command checks each of its
adapters' kinds against its row in `agent_action_kind`: a missing or differing row is one line naming the
kind, exit 1, nothing claimed. Once the row agrees, it says what it carries out, where (password hidden)
and how, then carries the action out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from outbox.store import application as store
from tests.test_docs import example

OUTBOX = Path(sys.executable).parent / "outbox"  # the console script: it puts no folder on the module path
PASSWORD = "s3cret-Pass"  # the test server trusts local connections, so any password connects


@pytest.fixture
def app_folder(tmp_path: Path) -> Path:
    """The README's adapter script as the application's module (`ping`), in a folder of its own."""
    code, _ = example("adapter")
    (tmp_path / "ping.py").write_text(code)
    return tmp_path


def outbox_run(folder: Path, database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env["OUTBOX_DATABASE_URL"] = database_url
    command = [str(OUTBOX), "run", "--adapters", "ping:adapters", "--max-seconds", "20", *args]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def declare(engine: Engine, *, at_most_once: bool) -> None:
    with engine.begin() as conn:
        conn.execute(
            store.UPSERT_KIND,
            {"name": "PING", "at_most_once": at_most_once, "instance_level": True, "workspace_level": False},
        )


def test_a_kind_without_its_row_stops_the_command_with_one_line_naming_the_step(
    app_folder: Path, database_url: str
) -> None:
    ran = outbox_run(app_folder, database_url)
    assert ran.returncode == 1, ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: kind PING has no row in agent_action_kind: declare it in a migration that runs after"
        " outbox's own, with outbox.migrate.declare_kinds(op, [PING])"
    ]
    assert "Traceback" not in ran.stderr and "carrying out" not in ran.stderr


def test_a_row_that_declares_the_kind_otherwise_stops_the_command_naming_what_differs(
    app_folder: Path, database_url: str, engine: Engine
) -> None:
    declare(engine, at_most_once=True)
    ran = outbox_run(app_folder, database_url)
    assert ran.returncode == 1, ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: kind PING: its row in agent_action_kind declares at_most_once=true")
    assert "(the code: false)" in errors[0] and "instance_level" not in errors[0]


def test_from_the_application_folder_it_says_what_it_carries_out_then_carries_it_out(
    app_folder: Path, database_url: str, engine: Engine
) -> None:
    declare(engine, at_most_once=False)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, lane_key, idempotency_key, payload, max_attempts, state)"
                " VALUES ('PING', 'ping:1', 'ping-1', '{}', 3, 'ADMITTED')"
            )
        )
    with_password = make_url(database_url).set(password=PASSWORD).render_as_string(hide_password=False)
    ran = outbox_run(app_folder, with_password, "--max-actions", "1", "--concurrency", "7", "--lease-seconds", "90")
    assert ran.returncode == 0, ran.stderr
    started = [line for line in ran.stderr.splitlines() if "carrying out" in line]
    assert len(started) == 1, ran.stderr
    shown = make_url(with_password).render_as_string(hide_password=True)  # user:***@host/database
    assert ":***@" in shown
    assert f"carrying out PING on {shown}: " in started[0]
    assert "concurrency 7, claim batch up to the free slots, lease 90 s" in started[0]
    # the application set no tracer provider: its attempts make no span, and the line says so
    assert started[0].endswith(
        "; tracing off (no tracer provider set; stored trace contexts still reach the providers)"
    ), started[0]
    assert PASSWORD not in ran.stderr + ran.stdout
    check = create_engine(database_url)
    with check.connect() as conn:
        state = conn.execute(text("SELECT state FROM agent_action WHERE idempotency_key = 'ping-1'")).scalar_one()
    check.dispose()
    assert state == "DONE"


def test_several_adapter_factories_separated_by_commas_carry_out_every_kind_they_return(
    app_folder: Path, database_url: str, engine: Engine
) -> None:
    """`--adapters ping:adapters,outbox.webhook:webhook_adapters`: the application's kind and outbox's
    WEBHOOK in one executor (no endpoint registered, so no secret is needed); a part that names nothing
    is one line, exit 2."""
    declare(engine, at_most_once=False)
    ran = outbox_run(
        app_folder, database_url, "--adapters", "ping:adapters,outbox.webhook:webhook_adapters", "--max-seconds", "1"
    )
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if "carrying out PING, WEBHOOK on " in line], ran.stderr
    ran = outbox_run(app_folder, database_url, "--adapters", "ping:adapters,,outbox.webhook:webhook_adapters")
    assert ran.returncode == 2, ran.stderr
    assert "error: --adapters must look like module:factory[,module:factory...], not ''" in ran.stderr
