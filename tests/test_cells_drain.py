"""Cells drained: `outbox run --all-cells`, one process serving every cell of the cells file; and the Prefect
drain, one deployment per cell (written by `outbox prefect files DIR --cells`) on one work pool that two
real `outbox worker`s serve.

Three cells, each a database of its own on the test server; the third is reached through a network relay
(tests/chaos/netrelay.py) that the test switches off (a blackhole: connections accepted, never answered,
and the open ones reset first) and on again. Every action is recorded by the executor's adapter when it is
attempted (its lane names its cell), so "done once" is read from the attempts, and its state from its cell.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from prefect.blocks.system import Secret
from prefect.workers.process import ProcessWorker
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from flows.drain import destination_resource, ended_resource
from outbox.executor.outcomes import DestinationChange, EndedAction
from outbox.testing import install_kinds
from tests import kinds as test_kinds
from tests.chaos.netrelay import NetRelay
from tests.conftest import CliResult
from tests.prefect_server import PrefectServer
from tests.support import until
from tests.test_cells import new_database  # noqa: F401  (a fixture)
from tests.test_executor_results import enqueue

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def relay(server_url: str) -> Iterator[NetRelay]:
    """A relay to the test server: the third cell's network, which the test cuts and mends."""
    url = make_url(server_url)
    host = url.query.get("host") or url.host or "127.0.0.1"  # a socket directory, or a host
    started = NetRelay(host if isinstance(host, str) else host[0], url.port or 5432)
    yield started
    started.close()


def through(relay: NetRelay, url: str) -> str:
    parsed = make_url(url)
    query = {k: v for k, v in parsed.query.items() if k != "host"}
    return parsed.set(host="127.0.0.1", port=relay.port, query=query).render_as_string(hide_password=False)


def prepare(url: str, lane: str, count: int) -> None:
    """The test kinds declared in the cell, and `count` actions in lanes named after it."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            install_kinds(conn, test_kinds.ALL)
        for n in range(count):
            enqueue(engine, lane=f"{lane}-{n % 3}")
    finally:
        engine.dispose()


def states(url: str) -> Counter[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return Counter(dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all()))
    finally:
        engine.dispose()


def attempts(record: Path) -> Counter[tuple[str, int]]:
    """(cell, action id) -> attempts, from the adapter's record (a lane is `<cell>-<n>`)."""
    if not record.exists():
        return Counter()
    lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return Counter((lane.rpartition("-")[0], action_id) for action_id, lane, *_ in lines)


def test_one_process_drains_every_cell_and_a_cell_that_is_down_costs_the_others_nothing(
    new_database: Callable[[bool], str],  # noqa: F811
    relay: NetRelay,
    tmp_path: Path,
) -> None:
    urls = {"eu": new_database(True), "us": new_database(True), "ap": new_database(True)}
    for cell, url in urls.items():
        prepare(url, cell, 30)
    reached = {**urls, "ap": through(relay, urls["ap"])}
    cells = tmp_path / "cells.toml"
    cells.write_text("".join(f'[cells.{c}]\ndatabase_url_variable = "CELL_{c.upper()}_URL"\n' for c in urls))
    record = tmp_path / "attempts.jsonl"
    env = {
        **{k: v for k, v in os.environ.items() if k != "OUTBOX_DATABASE_URL"},
        **{f"CELL_{c.upper()}_URL": url for c, url in reached.items()},
        "OUTBOX_CELLS_FILE": str(cells),
        "OUTBOX_TEST_RECORD_FILE": str(record),
        "PYTHONPATH": str(ROOT),
    }
    relay.blackhole()  # ap is down before the process starts
    command = [
        sys.executable,
        "-m",
        "outbox.cli",
        "run",
        "--all-cells",
        "--adapters",
        "tests.adapters:recording_adapters",
    ]
    command += ["--concurrency", "4", "--connect-timeout", "2"]
    stderr = tmp_path / "run.err"
    with stderr.open("wb") as err:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stderr=err)
    try:
        until(lambda: states(urls["eu"])["DONE"] == 30 and states(urls["us"])["DONE"] == 30, 60, "eu and us drained")
        until(lambda: "cell ap: not ready" in stderr.read_text(), 30, "ap's warning")
        assert states(urls["ap"])["DONE"] == 0
        relay.pass_()  # ap answers again: its backlog drains
        until(lambda: states(urls["ap"])["DONE"] == 30, 60, "ap drained after it came back")

        relay.cut()  # ap goes down again while the process runs
        relay.blackhole()
        for cell in urls:
            prepare(urls[cell], cell, 10)  # (through the relay-free URL: the test reaches ap directly)
        until(lambda: states(urls["eu"])["DONE"] == 40 and states(urls["us"])["DONE"] == 40, 60, "eu, us go on")
        assert states(urls["ap"])["DONE"] == 30
        relay.pass_()
        until(lambda: states(urls["ap"])["DONE"] == 40, 90, "ap's new backlog drained after it came back")

        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, stderr.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)

    said = stderr.read_text()
    done = attempts(record)
    assert sorted({cell for cell, _ in done}) == ["ap", "eu", "us"]
    assert set(done.values()) == {1}, "every action attempted once"
    assert Counter(cell for cell, _ in done) == {"eu": 40, "us": 40, "ap": 40}
    started = [line for line in said.splitlines() if "carrying out TEST_NOOP" in line]
    assert sorted(line.split("cell ")[1].split(":")[0] for line in started) == ["ap", "eu", "us"], said
    assert all("concurrency 4" in line for line in started)
    table = said[said.index("attempts") :]
    for cell in urls:
        assert f"│ {cell} " in table, table
    assert "Traceback" not in said, said


# ---- the Prefect drain, a deployment per cell ---------------------------------------------------------


def cells_toml(path: Path, cells: list[str]) -> Path:
    path.write_text("".join(f'[cells.{c}]\ndatabase_url_variable = "CELL_{c.upper()}_URL"\n' for c in cells))
    return path


def test_prefect_files_with_cells_write_a_drain_and_a_purge_deployment_per_cell(
    cli: Callable[..., CliResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_CELLS_FILE", str(cells_toml(tmp_path / "cells.toml", ["eu", "us"])))
    monkeypatch.delenv("CELL_EU_URL", raising=False)  # the names only: no URL is read
    assert cli("prefect", "files", str(tmp_path / "deploy"), "--cells").code == 0
    written = yaml.safe_load((tmp_path / "deploy" / "prefect.yaml").read_text())
    shipped = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())
    by_name = {d["name"]: d for d in shipped["deployments"]}
    names = [d["name"] for d in written["deployments"]]
    assert names == ["outbox-drain-eu", "outbox-drain-us", "outbox-purge-eu", "outbox-purge-us"]
    for deployment in written["deployments"]:
        base, _, cell = deployment["name"].rpartition("-")
        want = dict(by_name[base], name=deployment["name"])
        want["parameters"] = {**by_name[base]["parameters"], "cell": cell}
        want["tags"] = [*by_name[base]["tags"], f"cell:{cell}"]
        assert deployment == want
    assert {d["work_pool"]["name"] for d in written["deployments"]} == {"outbox"}

    monkeypatch.setenv("OUTBOX_CELLS_FILE", str(tmp_path / "missing.toml"))
    refused = cli("prefect", "files", str(tmp_path / "other"), "--cells")
    assert refused.code != 0 and "missing.toml" in refused.err and not (tmp_path / "other").exists()


def test_events_of_a_cell_name_it_and_keep_actions_of_two_cells_apart() -> None:
    action = EndedAction(id=7, kind="EMAIL", state="UNCERTAIN", reason="ERROR_AFTER_WRITE", trace={})
    eu, us = ended_resource(action, "eu"), ended_resource(action, "us")
    assert eu["prefect.resource.id"] != us["prefect.resource.id"]
    assert (eu["outbox.cell"], us["outbox.cell"]) == ("eu", "us")
    assert "outbox.cell" not in ended_resource(action)
    assert ended_resource(action)["prefect.resource.id"] == "outbox.action.7"  # one database: as before
    change = DestinationChange(change="paused", name="smtp", kind="EMAIL", reason="SLOW_DOWN", seconds=5.0)
    assert destination_resource(change, "eu")["outbox.cell"] == "eu"
    assert (
        destination_resource(change, "eu")["prefect.resource.id"] != destination_resource(change)["prefect.resource.id"]
    )


def cell_deployments(server: PrefectServer, pool: str, cells: list[str], tmp_path: Path) -> dict[str, str]:
    """The drain deployments `outbox prefect files --cells` writes, made on the server from this checkout
    (the flow by its file, the recording test adapters). Returns each cell's deployment id."""
    from outbox.cli.prefect import per_cell

    written = yaml.safe_load(per_cell((ROOT / "deploy" / "prefect.yaml").read_text(), tuple(cells)))
    template = ProcessWorker.get_default_base_job_template()
    server.post("/work_pools/", {"name": pool, "type": "process", "base_job_template": template})
    flow_id = server.post("/flows/", {"name": "outbox-drain"})["id"]
    ids = {}
    for deployment in written["deployments"]:
        if not deployment["name"].startswith("outbox-drain-"):
            continue
        body = {
            "name": deployment["name"],
            "flow_id": flow_id,
            "work_pool_name": pool,
            "entrypoint": "flows/drain.py:drain",
            "pull_steps": [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}],
            "parameters": {**deployment["parameters"], "adapters": "tests.adapters:recording_adapters"},
            "tags": deployment["tags"],
        }
        ids[deployment["parameters"]["cell"]] = str(server.post("/deployments/", body)["id"])
    return ids


def run_of(server: PrefectServer, run_id: str) -> dict[str, Any]:
    return dict(server.post("/flow_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})[0])


def test_two_workers_drain_three_cells_and_a_cell_that_is_down_costs_the_others_nothing(
    prefect_server: PrefectServer,
    new_database: Callable[[bool], str],  # noqa: F811
    relay: NetRelay,
    tmp_path: Path,
) -> None:
    cells = ["eu", "us", "ap"]
    urls = {cell: new_database(True) for cell in cells}
    for cell, url in urls.items():
        prepare(url, cell, 30)
    cells_file = cells_toml(tmp_path / "cells.toml", cells)
    # ap's URL is in no variable on the workers: they read it from its Secret block
    Secret(value=through(relay, urls["ap"])).save("outbox-cell-ap", overwrite=True)
    deployments = cell_deployments(prefect_server, "cells", cells, tmp_path)
    record = tmp_path / "attempts.jsonl"
    env = {
        **{k: v for k, v in prefect_server.env().items() if k != "OUTBOX_DATABASE_URL"},
        "CELL_EU_URL": urls["eu"],
        "CELL_US_URL": urls["us"],
        "OUTBOX_CELLS_FILE": str(cells_file),
        "OUTBOX_TEST_RECORD_FILE": str(record),
        "OUTBOX_CONNECT_TIMEOUT_SECONDS": "2",
        "PYTHONPATH": str(ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
    }
    workers = []
    relay.blackhole()  # ap is down when its first run starts
    try:
        for name in ("outbox-a", "outbox-b"):
            command = [sys.executable, "-m", "outbox.cli", "worker", "--pool", "cells", "--name", name, "--grace", "60"]
            with (tmp_path / f"{name}.log").open("wb") as log:
                workers.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))

        def start(cell: str) -> str:
            return str(prefect_server.post(f"/deployments/{deployments[cell]}/create_flow_run", {})["id"])

        runs = {cell: start(cell) for cell in cells}
        until(lambda: states(urls["eu"])["DONE"] == 30 and states(urls["us"])["DONE"] == 30, 240, "eu and us drained")
        until(lambda: run_of(prefect_server, runs["ap"])["state_type"] == "FAILED", 120, "ap's run to fail")
        failed = run_of(prefect_server, runs["ap"])
        assert "cell ap: cannot reach its database" in failed["state"]["message"], failed["state"]
        assert states(urls["ap"])["DONE"] == 0

        relay.pass_()  # ap is back: its next run drains its backlog
        runs["ap"] = start("ap")
        until(lambda: states(urls["ap"])["DONE"] == 30, 180, "ap drained after it came back")

        relay.cut()  # ap goes down while its run drains
        relay.blackhole()
        for cell in cells:
            prepare(urls[cell], cell, 10)
        until(lambda: states(urls["eu"])["DONE"] == 40 and states(urls["us"])["DONE"] == 40, 90, "eu, us go on")
        assert states(urls["ap"])["DONE"] == 30
        relay.pass_()
        until(lambda: states(urls["ap"])["DONE"] == 40, 120, "ap's new backlog drained by the same run")
        assert run_of(prefect_server, runs["ap"])["state_type"] == "RUNNING"

        for cell in cells:
            run = run_of(prefect_server, runs[cell])
            assert f"cell:{cell}" in run["tags"] and "kind:TEST_NOOP" in run["tags"], run["tags"]
            assert f" {cell} " in run["name"], run["name"]
            keys = {
                a["key"]
                for a in prefect_server.post("/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
            }
            assert f"outbox-drain-live-{cell}" in keys, keys
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(120) == 0
        for cell in cells:
            assert run_of(prefect_server, runs[cell])["state_type"] == "COMPLETED"
    finally:
        for worker in workers:
            if worker.poll() is None:
                for child in psutil.Process(worker.pid).children(recursive=True):
                    child.kill()
                worker.kill()
                worker.wait(10)

    done = attempts(record)
    assert set(done.values()) == {1}, "every action attempted once"
    assert Counter(cell for cell, _ in done) == {"eu": 40, "us": 40, "ap": 40}


# ---- a rolling upgrade: this release's executors against a cell one revision behind ---------------------


def test_an_executor_of_this_release_drains_a_cell_one_revision_behind(
    admin_engine: Any, server_url: str, tmp_path: Path
) -> None:
    """While `db upgrade --all-cells` rolls, a cell still at head-1 (0026) is drained by the new executors."""
    from outbox import migrate

    name = f"outbox_cell_behind_{os.getpid()}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        engine = create_engine(url)
        with engine.begin() as conn:
            migrate.upgrade(conn, "0026")
        with engine.connect() as conn:
            assert migrate.current(conn) == "0026"
        engine.dispose()
        prepare(url, "behind", 30)
        record = tmp_path / "attempts.jsonl"
        env = {
            **os.environ,
            "OUTBOX_DATABASE_URL": url,
            "OUTBOX_TEST_RECORD_FILE": str(record),
            "PYTHONPATH": str(ROOT),
        }
        command = [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.adapters:recording_adapters"]
        ran = subprocess.run(
            [*command, "--max-actions", "30", "--max-seconds", "60"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr
        assert states(url) == {"DONE": 30}, ran.stderr
        assert set(attempts(record).values()) == {1}
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_the_notification_of_a_cells_action_names_the_action_and_its_cell() -> None:
    """deploy/prefect-notify.yaml's body, rendered as the Prefect server renders it, for an event of a cell's
    action and of a single database's."""
    from datetime import UTC, datetime
    from uuid import uuid4

    from prefect.server.events.schemas.events import ReceivedEvent
    from prefect.server.utilities.user_templates import render_user_template_sync

    body = yaml.safe_load((ROOT / "deploy" / "prefect-notify.yaml").read_text())["automations"][0]["actions"][0]["body"]
    action = EndedAction(id=7, kind="EMAIL", state="FAILED", reason="PROVIDER_REFUSED", trace={"notice": "welcome"})

    def rendered(cell: str | None) -> str:
        event = ReceivedEvent(
            occurred=datetime.now(UTC), event="outbox.action.failed", resource=ended_resource(action, cell), id=uuid4()
        )
        return render_user_template_sync(body, {"event": event})

    in_cell, alone = rendered("eu"), rendered(None)
    assert "action: 7\ncell: eu\nkind: EMAIL\nnotice: welcome\n" in in_cell, in_cell
    assert "`outbox show 7 --cell eu`" in in_cell
    assert "action: 7\nkind: EMAIL\nnotice: welcome\n" in alone and "`outbox show 7`" in alone, alone
