"""Cells: several outbox databases named in one cells file, used by the commands with --cell and --all-cells.

Each cell is a database of its own on the test server (a cell that is down is a URL whose port refuses
connections). Bad cells files and bad command lines get one line naming the file and the cell, and no
cell is touched: the databases stay as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from outbox import migrate
from outbox.cells import CELL_NAME, CellsError, read_cells
from outbox.slack import register_workspace
from outbox.slack import workspaces as workspace_registry
from outbox.testing import install_kinds
from tests import kinds as test_kinds
from tests.conftest import CliResult
from tests.prefect_server import PrefectServer
from tests.support import until
from tests.test_dashboards import _answers, free_port
from tests.test_executor_results import enqueue
from tests.test_metrics import samples, value

Cli = Callable[..., CliResult]
ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()
DOWN = "postgresql://outbox:s3cret-pw@127.0.0.1:1/outbox"  # nothing listens on port 1


@pytest.fixture
def new_database(admin_engine: Engine, server_url: str) -> Iterator[Callable[[bool], str]]:
    """Makes databases on the test server, migrated or empty; drops them after the test."""
    made: list[str] = []

    def make(migrated: bool) -> str:
        name = f"outbox_cell_{os.getpid()}_{next(_counter)}"
        with admin_engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        if migrated:
            engine = create_engine(url)
            with engine.begin() as conn:
                migrate.upgrade(conn)
            engine.dispose()
        return url

    yield make
    with admin_engine.connect() as conn:
        for name in made:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def cells_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    path = tmp_path / "cells.toml"
    path.write_text(body)
    monkeypatch.setenv("OUTBOX_CELLS_FILE", str(path))
    monkeypatch.delenv("OUTBOX_DATABASE_URL", raising=False)
    return path


def by_variable(monkeypatch: pytest.MonkeyPatch, **urls: str) -> str:
    """A cells file body naming each cell's URL by a variable of its own, set here."""
    lines = []
    for name, url in urls.items():
        variable = f"CELL_{name.upper()}_DATABASE_URL"
        monkeypatch.setenv(variable, url)
        lines += [f"[cells.{name}]", f'database_url_variable = "{variable}"', ""]
    return "\n".join(lines)


def revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return migrate.current(conn)
    finally:
        engine.dispose()


def test_a_cell_is_used_by_its_name(
    cli: Cli, new_database: Callable[[bool], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eu, us = new_database(True), new_database(True)
    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, eu=eu, us=us))
    engine = create_engine(us)
    with engine.begin() as conn:
        install_kinds(conn, test_kinds.ALL)
    enqueue(engine, lane="lane-us")
    engine.dispose()

    backlog = {cell: cli("status", "--cell", cell, "--json").json()["due"] for cell in ("eu", "us")}
    assert backlog == {"eu": 0, "us": 1}
    monkeypatch.setenv("OUTBOX_CELL", "us")  # a container's one cell, by its variable
    assert cli("status", "--json").json()["due"] == 1


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('[cells.eu]\ndatabase_url = "{a}"\n[cells.eu]\ndatabase_url = "{b}"\n', "the cell 'eu' is named twice"),
        ('[cells.EU]\ndatabase_url = "{a}"\n', "the cell name 'EU' is not a cell name"),
        ('[cells.eu]\ndatabase_url = "{a}"\nhost = "x"\n', "cell eu has an unknown key 'host'"),
        ('[cells.eu]\ndatabase_url = "{a}"\ndatabase_url_variable = "X"\n', "cell eu gives 2 of"),
        ("[cells.eu]\n", "cell eu gives 0 of"),
        ('[cells.eu]\ndatabase_url_variable = "OUTBOX_TEST_UNSET_VARIABLE"\n', "cell eu has no database URL"),
        ('[cells.eu]\ndatabase_url = "mysql://h/db"\n', "cell eu: outbox needs PostgreSQL"),
        ('[cells.eu]\ndatabase_url = "{a}"\n[cells.us]\ndatabase_url = "{a_localhost}"\n', "cells eu and us point"),
        ('[cell.eu]\ndatabase_url = "{a}"\n', "unknown table or key 'cell'"),
        ("cells = [", "is not TOML"),
        ("", "names no cell"),
    ],
)
def test_a_bad_cells_file_is_one_line_naming_the_cell_and_no_cell_is_touched(
    cli: Cli,
    new_database: Callable[[bool], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    said: str,
) -> None:
    a, b = new_database(False), new_database(False)
    a_localhost = a.replace("127.0.0.1", "localhost")
    path = cells_file(tmp_path, monkeypatch, body.format(a=a, b=b, a_localhost=a_localhost))
    result = cli("db", "upgrade", "--all-cells")
    assert result.code == 2, result
    assert said in result.err and str(path) in result.err, result.err
    assert "\n" not in result.err.strip()
    assert (revision(a), revision(b)) == (None, None)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["status", "--cell", "zz"], "no cell 'zz' in"),
        (["status", "--cell", "eu", "--database-url", "postgresql://h/db"], "--cell eu and --database-url"),
        (["status", "--all-cells", "--cell", "eu"], "--all-cells and --cell"),
    ],
)
def test_a_bad_cell_on_the_command_line_is_one_line(
    cli: Cli,
    new_database: Callable[[bool], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    said: str,
) -> None:
    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, eu=new_database(True)))
    result = cli(*args)
    assert result.code == 2 and said in result.err, result


def test_no_cells_file_no_cells(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOX_CELLS_FILE", raising=False)
    monkeypatch.delenv("OUTBOX_DATABASE_URL")
    result = cli("status", "--cell", "eu")
    assert result.code == 2 and "no cells are named: set OUTBOX_CELLS_FILE" in result.err, result


def test_status_of_all_cells_is_one_line_a_cell_and_a_cell_down_costs_the_others_nothing(
    cli: Cli, new_database: Callable[[bool], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eu, us = new_database(True), new_database(False)
    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, eu=eu, down=DOWN, us=us))
    result = cli("status", "--all-cells", "--json")
    assert result.code == 1, result
    lines = {line["cell"]: line for line in result.json()}
    assert list(lines) == ["eu", "down", "us"]  # the file's order
    assert lines["eu"]["revision"] == migrate.head() and lines["eu"]["summary"]["backlog"] == 0
    assert lines["eu"]["fault"] is None
    assert lines["down"]["summary"] is None and "cannot connect to the database" in lines["down"]["fault"]
    assert "no outbox schema" in lines["us"]["fault"]
    assert "2 of 3 cells could not be read: down, us" in result.err
    assert "s3cret-pw" not in result.out + result.err

    table = cli("status", "--all-cells")
    assert table.code == 1 and "cannot connect to the database" in table.out and "s3cret-pw" not in table.out


def test_an_error_of_one_cell_names_the_cell(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, down=DOWN))
    result = cli("status", "--cell", "down")
    assert result.code == 1 and result.err.startswith("error: cell down: cannot connect to the database"), result
    assert "s3cret-pw" not in result.err


def test_upgrade_of_all_cells_goes_cell_by_cell_and_stops_at_the_first_failure(
    cli: Cli, new_database: Callable[[bool], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, last = new_database(False), new_database(False)
    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, first=first, down=DOWN, last=last))
    result = cli("db", "upgrade", "--all-cells")
    assert result.code == 1, result
    head = migrate.head()
    assert (revision(first), revision(last)) == (head, None)
    lines = result.err.splitlines()
    assert lines[0] == f"cell first: outbox schema at revision {head} (was none)"
    assert lines[1].startswith("cell down: the upgrade failed at revision none: cannot connect to the database")
    assert lines[2] == "cell last: not upgraded, at revision none"
    assert "the upgrade stopped at cell down" in lines[3]

    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, first=first, last=last))
    result = cli("db", "upgrade", "--all-cells")
    assert result.code == 0, result
    assert result.err.splitlines() == [
        f"cell first: outbox schema at revision {head} (was {head})",
        f"cell last: outbox schema at revision {head} (was none)",
    ]
    assert revision(last) == head


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_cells_file_is_read_or_refused_with_a_cells_error(body: str) -> None:
    """Whatever a cells file holds, reading it gives cells with valid names or a CellsError: never another
    exception, never a name a metric label could not carry."""
    path = Path(f"/tmp/outbox-cells-{os.getpid()}.toml")
    try:
        path.write_text(body, encoding="utf-8", errors="surrogatepass")
    except UnicodeEncodeError:
        return
    try:
        cells = read_cells(path)
    except CellsError:
        return
    finally:
        path.unlink(missing_ok=True)
    assert all(CELL_NAME.fullmatch(name) for name in cells.names)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=40))
def test_a_cell_name_is_taken_only_as_the_file_s_rule_says(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    path = tmp_path_factory.mktemp("cells") / "cells.toml"
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    path.write_text(f'[cells."{quoted}"]\ndatabase_url = "postgresql://h/db"\n', encoding="utf-8")
    try:
        cells = read_cells(path)
    except CellsError as error:
        assert CELL_NAME.fullmatch(name) is None or "is not TOML" in str(error), error
        return
    assert cells.names == (name,) and CELL_NAME.fullmatch(name)


def test_an_erasure_in_all_cells_reaches_the_cell_that_holds_the_account_and_names_a_cell_it_missed(
    cli: Cli, new_database: Callable[[bool], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eu, us = new_database(True), new_database(True)
    engine = create_engine(us)
    with engine.begin() as conn:
        install_kinds(conn, test_kinds.ALL)
    enqueue(engine, lane="lane-a", subject_account_id=7)
    enqueue(engine, lane="lane-b", subject_account_id=7)
    kept = enqueue(engine, lane="lane-c", subject_account_id=8)
    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, eu=eu, us=us, down=DOWN))

    result = cli("erase-account", "7", "--all-cells", "--json")
    assert result.code == 1, result
    lines = {line["cell"]: line for line in result.json()["cells"]}
    assert (lines["eu"]["erased"], lines["us"]["erased"], lines["down"]["erased"]) == (0, 2, None)
    assert "cannot connect to the database" in lines["down"]["fault"]
    assert "account 7 is not erased in down: run the erasure again" in result.err
    with engine.connect() as conn:
        assert conn.execute(text("SELECT array_agg(id) FROM agent_action")).scalar_one() == [kept]
    engine.dispose()

    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, eu=eu, us=us))
    again = cli("erase-account", "7", "--all-cells")
    assert again.code == 0 and again.out.splitlines() == [
        "cell eu: erased 0 actions of account 7",
        "cell us: erased 0 actions of account 7",
    ], again


def blocks(heading: str, language: str) -> list[str]:
    """The code blocks in `language` of docs/cells.md's section `heading`, in the page's order: the examples the
    tests below run as written."""
    page = (ROOT / "docs" / "cells.md").read_text()
    assert f"\n## {heading}\n" in page, heading
    section = page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def test_the_docs_routing_example_enqueues_in_the_account_s_cell(
    new_database: Callable[[bool], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eu, us = new_database(True), new_database(True)
    cells_file(tmp_path, monkeypatch, by_variable(monkeypatch, eu=eu, us=us))
    monkeypatch.setattr(workspace_registry, "_WORKSPACES", {})  # the example's workspace, this test's only
    register_workspace("acme", token="xoxb-0000-cells-example")
    (code,) = blocks("Route each enqueue to its cell", "python")
    example: dict[str, Any] = {}
    exec(compile(code, "docs/cells.md", "exec"), example)
    try:
        example["order_shipped"](account_id=3, order_id=42)  # 3 % 2: the second cell, us
        example["order_shipped"](account_id=4, order_id=43)
    finally:
        for engine in example["ENGINES"].values():
            engine.dispose()
    for url, order, account in ((us, "42", 3), (eu, "43", 4)):
        engine = create_engine(url)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT kind, subject_account_id, payload->>'text' FROM agent_action")).all()
        engine.dispose()
        assert [tuple(row) for row in rows] == [("SLACK_MESSAGE", account, f"Order {order} shipped")]


# ---- docs/cells.md's Drain, Watch and Add a cell, run as written -------------------------------------------


def commands(block: str) -> list[str]:
    """A shell block's commands, one a line (comments and blank lines left out)."""
    return [line.strip() for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def docs_env(tmp_path: Path, prefect: PrefectServer | None, **urls: str) -> dict[str, str]:
    """A shell's environment for the docs' commands: the venv's `outbox` and `prefect` first on PATH, a cells
    file naming each cell's URL by its variable (`<CELL>_DATABASE_URL`), and the test's Prefect server."""
    cells = tmp_path / "cells.toml"
    cells.write_text("".join(f'[cells.{c}]\ndatabase_url_variable = "{c.upper()}_DATABASE_URL"\n' for c in urls))
    env = {k: v for k, v in (prefect.env() if prefect else os.environ).items() if k != "OUTBOX_DATABASE_URL"}
    env.pop("OUTBOX_CELL", None)
    return {
        **env,
        **{f"{c.upper()}_DATABASE_URL": url for c, url in urls.items()},
        "OUTBOX_CELLS_FILE": str(cells),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }


def shell(script: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{script}\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@contextlib.contextmanager
def started(line: str, env: dict[str, str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A long-running command of the docs, started as written; SIGTERM after, and it must stop cleanly."""
    with log.open("wb") as out:
        process = subprocess.Popen(["bash", "-c", f"exec {line}"], env=env, cwd=cwd, stdout=out, stderr=out)
    try:
        yield process
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def deployments(prefect: PrefectServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in prefect.post("/deployments/filter", {})}


def test_the_docs_drain_commands_run_as_written(
    new_database: Callable[[bool], str], prefect_server: PrefectServer, tmp_path: Path
) -> None:
    env = docs_env(tmp_path, prefect_server, eu=new_database(True), us=new_database(True))
    with_prefect, without = blocks("Drain", "bash")
    *deploy, worker = commands(with_prefect)
    shell("prefect work-pool create outbox --type process --overwrite", env, tmp_path)
    for line in deploy:
        shell(line, env, tmp_path)
    made = deployments(prefect_server)
    for name in ("outbox-drain", "outbox-purge"):
        for cell in ("eu", "us"):
            deployment = made[f"{name}-{cell}"]
            assert deployment["work_pool_name"] == "outbox" and f"cell:{cell}" in deployment["tags"], deployment
            assert deployment["parameters"]["cell"] == cell
    assert made["outbox-drain-eu"]["parameters"]["adapters"] == "myapp.outbox:adapters"

    with started(worker, env, tmp_path, tmp_path / "worker.log"):
        until(lambda: bool(prefect_server.post("/work_pools/outbox/workers/filter", {})), 60, "the worker to join")

    for n, line in enumerate(commands(without)):
        log = tmp_path / f"run-{n}.log"
        serving = ["eu", "us"] if "--all-cells" in line else [line.split("--cell ")[1].split()[0]]
        with started(line, env, tmp_path, log):
            until(lambda: log.read_text().count("carrying out") == len(serving), 60, f"{line} to start")  # noqa: B023
        said = log.read_text()
        for cell in serving:
            assert f"cell {cell}: carrying out EMAIL" in said or f"carrying out EMAIL on cell {cell}" in said, said


def test_the_docs_watch_command_serves_every_cell(new_database: Callable[[bool], str], tmp_path: Path) -> None:
    env = docs_env(tmp_path, None, eu=new_database(True), us=new_database(True))
    (line,) = commands(blocks("Watch", "bash")[0])
    port = free_port()
    with started(f"{line} --port {port}", env, tmp_path, tmp_path / "exporter.log"):  # a free port: the test's
        url = f"http://127.0.0.1:{port}/metrics"
        until(lambda: _answers(url), 60, "the exporter to answer")
        with urllib.request.urlopen(url, timeout=10) as response:
            found = samples(response.read().decode())
    assert {dict(labels).get("cell") for _, labels in found} == {"eu", "us"}
    assert [value(found, "outbox_exporter_up", cell=cell) for cell in ("eu", "us")] == [1, 1]


def test_the_docs_steps_add_a_cell(
    new_database: Callable[[bool], str], prefect_server: PrefectServer, tmp_path: Path
) -> None:
    env = docs_env(tmp_path, prefect_server, eu=new_database(True))
    sa = env["SA_DATABASE_URL"] = new_database(False)
    shell("prefect work-pool create outbox --type process --overwrite", env, tmp_path)
    shell("outbox prefect files deploy --cells", env, tmp_path)  # the files of the cells before
    (steps,) = blocks("Add a cell", "bash")
    shell(steps, env, tmp_path)
    assert revision(sa) == migrate.head()
    assert read_cells(Path(env["OUTBOX_CELLS_FILE"])).names == ("eu", "sa")
    made = deployments(prefect_server)
    assert {"outbox-drain-eu", "outbox-drain-sa", "outbox-purge-eu", "outbox-purge-sa"} <= set(made), set(made)
    assert made["outbox-drain-sa"]["parameters"]["cell"] == "sa" and "cell:sa" in made["outbox-drain-sa"]["tags"]

    (secret,) = blocks("Add a cell", "python")
    exec(compile(secret, "docs/cells.md", "exec"), {})
    from flows.cells import cell_url

    with pytest.MonkeyPatch.context() as patch:  # a worker with eu's variable, without sa's
        patch.delenv("SA_DATABASE_URL", raising=False)
        patch.setenv("EU_DATABASE_URL", env["EU_DATABASE_URL"])
        patch.setenv("OUTBOX_CELLS_FILE", env["OUTBOX_CELLS_FILE"])
        assert asyncio.run(cell_url("sa")) == "postgresql://outbox:change-me@sa-db.internal:5432/app"
