"""The Prefect server on PostgreSQL, as docs/deployment.md sets it up: its two blocks, run as written.

The SQL block runs on the test's PostgreSQL (with a role and a database named for this test, dropped
after it); the server block's URL keeps the page's driver and password and takes this server's address;
the server starts with the page's command on a free loopback port. A flow of 40 concurrent tasks, each
logging, runs through it; Prefect's API and the database itself then hold every run and log line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect import flow, get_run_logger, task
from prefect.settings import PREFECT_API_URL, temporary_settings
from sqlalchemy import Engine, create_engine, make_url, text

from demo.stack import ROOT, descendants, free_port, kill_all, stop_process, wait_until_answers
from outbox.db import psycopg_url
from tests.prefect_server import flush_prefect_workers
from tests.support import prefect_post, until

PAGE = ROOT / "docs" / "deployment.md"
TASKS = 40


def block(name: str) -> str:
    """The code block under `<!-- prefect-database: NAME -->` in the page."""
    found = re.search(rf"<!-- prefect-database: {name} -->\n```\w+\n(.*?)```", PAGE.read_text(), re.S)
    assert found, f"docs/deployment.md has no block prefect-database: {name}"
    return found.group(1)


def server_setup() -> tuple[dict[str, str], list[str]]:
    """The server block's exported variables and its `prefect server start` command."""
    exported: dict[str, str] = {}
    command: list[str] = []
    for line in block("server").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            key, _, value = words[1].partition("=")
            exported[key] = value
        elif words:
            command = words
    assert command[:3] == ["prefect", "server", "start"], command
    return exported, command


@dataclass(frozen=True)
class Server:
    url: str  # http://127.0.0.1:<port>
    database_url: str  # the Prefect database, for psycopg


@pytest.fixture
def server_on_postgresql(admin_engine: Engine, server_url: str, tmp_path: Path) -> Iterator[Server]:
    name = f"prefect_{os.getpid()}"
    statements = [s for s in re.sub(r"\bprefect\b", name, block("sql")).split(";") if s.strip()]
    exported, command = server_setup()
    page_url = make_url(exported["PREFECT_API_DATABASE_CONNECTION_URL"])
    assert page_url.username == page_url.database == "prefect"
    ours = make_url(server_url).set(
        drivername=page_url.drivername, username=name, password=page_url.password, database=name
    )
    with admin_engine.connect() as conn:
        for statement in statements:
            conn.execute(text(statement))
    try:
        yield from started_server(command, ours.render_as_string(hide_password=False), tmp_path)
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{name}"'))


def started_server(command: list[str], database_url: str, home: Path) -> Iterator[Server]:
    """The page's `prefect server start` on a free loopback port, on `database_url`; stopped by its PID."""
    port = free_port()
    given = {"--host": "127.0.0.1", "--port": str(port)}
    argv = [given.get(previous, word) for previous, word in zip(["", *command[:-1]], command, strict=True)]
    env = {
        **os.environ,
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
    }
    with (home / "server.log").open("ab") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / argv[0]), *argv[1:]], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_answers(f"{url}/api/health", 180, "the Prefect server on PostgreSQL")
        flush_prefect_workers()
        with temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
            yield Server(url, psycopg_url(database_url))
            flush_prefect_workers()
    finally:
        started = descendants(process.pid)
        stop_process(process, 30)
        kill_all(started)
    assert "database is locked" not in (home / "server.log").read_text()


@task
def note(number: int) -> int:
    get_run_logger().info("task %d ran", number)
    return number


@flow
def many_tasks() -> int:
    futures = [note.submit(number) for number in range(TASKS)]
    return sum(future.result() for future in futures)


def test_a_prefect_server_on_its_own_postgresql_database_runs_flows(server_on_postgresql: Server) -> None:
    state = many_tasks(return_state=True)
    assert state.is_completed() and state.result() == sum(range(TASKS))
    flush_prefect_workers()
    run_id = str(state.state_details.flow_run_id)
    flow_runs = {"flow_runs": {"id": {"any_": [run_id]}}}
    logs = {"logs": {"flow_run_id": {"any_": [run_id]}}}

    def task_runs() -> int:  # the server records a task run from the events its client sends
        return int(prefect_post(server_on_postgresql.url, "/task_runs/count", flow_runs))

    def task_lines() -> int:
        # only the tasks' own lines: a flow run's random name ("granite-...") may hold the same letters
        entries = prefect_post(server_on_postgresql.url, "/logs/filter", logs)
        return sum(re.fullmatch(r"task \d+ ran", entry["message"]) is not None for entry in entries)

    until(lambda: task_runs() == TASKS, 60, "every task run recorded")
    until(lambda: task_lines() == TASKS, 60, "every task's log line recorded")
    prefect_database = create_engine(server_on_postgresql.database_url)
    try:
        with prefect_database.connect() as conn:  # what the API answered lives in this database
            assert conn.execute(
                text("SELECT state_type FROM flow_run WHERE id = :id"), {"id": run_id}
            ).scalar_one() == ("COMPLETED")
            tasks = conn.execute(text("SELECT count(*) FROM task_run WHERE flow_run_id = :id"), {"id": run_id})
            assert tasks.scalar_one() == TASKS
    finally:
        prefect_database.dispose()
