"""One exporter for several cells: every series labelled with its cell, a cell down costs the others nothing.

The cells are databases of their own on the test server; a cell that is down is a URL whose port refuses
connections, a cell that hangs is a TCP front that accepts and never answers. The exporter is the real
`outbox metrics serve` process, scraped by a real Prometheus; the dashboard's "All cells" table is read
through that Prometheus.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, create_engine

from dashboards import build
from outbox.metrics.cells import CellsCollector
from outbox.metrics.collector import OutboxCollector
from outbox.metrics.exporter import registry_for_cells
from outbox.testing import install_kinds
from tests import kinds as test_kinds
from tests import test_cells
from tests.support import until
from tests.test_cells import DOWN, by_variable
from tests.test_dashboards import _answers, free_port, query, scraping
from tests.test_executor_results import enqueue
from tests.test_exporter import Front
from tests.test_metrics import samples, value

ROOT = Path(__file__).resolve().parent.parent
MakeDatabase = Callable[[bool], str]
new_database = test_cells.new_database  # the fixture: databases made on the test server, dropped after


def cell_with_backlog(new_database: MakeDatabase, actions: int) -> str:
    """A migrated cell with the test kinds and `actions` due actions, each in a lane of its own."""
    url = new_database(True)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            install_kinds(conn, test_kinds.ALL)
        for lane in range(actions):
            enqueue(engine, lane=f"lane-{lane}")
    finally:
        engine.dispose()
    return url


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Start `outbox metrics serve` with the given options and the test's environment; its /metrics URL."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*options: str) -> str:
        port = free_port()
        log = (tmp_path / f"exporter-{len(started)}.log").open("wb")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("OUTBOX_DATABASE_URL", None)
        command = ["metrics", "serve", "--port", str(port), "--cache-seconds", "0", *options]
        process = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", *command], env=env, cwd=ROOT, stdout=log, stderr=log
        )
        started.append(process)
        url = f"http://127.0.0.1:{port}/metrics"
        until(lambda: _answers(url) or process.poll() is not None, what="the exporter to answer")
        assert process.poll() is None, (tmp_path / f"exporter-{len(started) - 1}.log").read_text()
        return url

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def cells_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **urls: str) -> None:
    path = tmp_path / "cells.toml"
    path.write_text(by_variable(monkeypatch, **urls))
    monkeypatch.setenv("OUTBOX_CELLS_FILE", str(path))
    monkeypatch.delenv("OUTBOX_DATABASE_URL", raising=False)


def by_cell(found: list[dict[str, Any]]) -> dict[str, float]:
    return {str(r["metric"]["cell"]): float(r["value"][1]) for r in found}


def test_a_real_prometheus_scrapes_three_cells_one_down(
    new_database: MakeDatabase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., str],
) -> None:
    eu, us = cell_with_backlog(new_database, 3), cell_with_backlog(new_database, 1)
    cells_file(tmp_path, monkeypatch, eu=eu, ap=DOWN, us=us)
    exporter = serve("--all-cells")
    with scraping(exporter, tmp_path) as prometheus:
        # two scrapes: an increase needs two samples
        scraped = 'count_over_time(outbox_exporter_up{cell="us"}[10m]) >= 2'
        until(lambda: bool(query(prometheus, scraped)), what="two scrapes of the three cells")
        assert by_cell(query(prometheus, "outbox_exporter_up")) == {"eu": 1, "ap": 0, "us": 1}
        backlog = "sum by (cell) (outbox_due_actions) + sum by (cell) (outbox_lane_waiting_actions)"
        assert by_cell(query(prometheus, backlog)) == {"eu": 3, "us": 1}
        # every series of the exporter carries its cell: none without the label, none of another cell
        assert query(prometheus, '{job="outbox", cell="", __name__=~"outbox_.+|action_.+"}') == []
        assert {r["metric"]["cell"] for r in query(prometheus, '{__name__=~"outbox_.+|action_.+"}')} == {
            "eu",
            "ap",
            "us",
        }
        # the dashboard's table: one line per cell, with the figures `outbox status --all-cells` prints
        columns = {
            name: by_cell(query(prometheus, build.in_cells(expr).replace("$cell", ".*")))
            for name, expr in build.CELL_COLUMNS.items()
        }
    assert columns["reads its database"] == {"eu": 1, "ap": 0, "us": 1}
    assert columns["backlog"] == {"eu": 3, "us": 1}
    assert columns["executors"] == columns["destinations paused"] == {"eu": 0, "us": 0}
    assert columns["UNCERTAIN, 24 h"] == {"eu": 0, "us": 0}
    assert set(columns["oldest due (s)"]) == {"eu", "us"}


def test_one_cell_by_name_labels_its_series(
    new_database: MakeDatabase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., str],
) -> None:
    cells_file(tmp_path, monkeypatch, eu=cell_with_backlog(new_database, 2), us=DOWN)
    found = samples(_get(serve("--cell", "eu")))
    assert {dict(labels).get("cell") for _, labels in found} == {"eu"}
    assert value(found, "outbox_exporter_up", cell="eu") == 1
    assert value(found, "outbox_due_actions", cell="eu", kind=test_kinds.NOOP.name) == 2


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_cells_that_hang_cost_the_others_nothing(new_database: MakeDatabase, caplog: pytest.LogCaptureFixture) -> None:
    """Two cells whose host accepts and never answers: each scrape answers within one wait (the cells are
    read side by side: one after the other would take two), the other cells' series are all there and right,
    and each hung cell reads as down, its log line naming it."""
    hanging = [Front(None), Front(None)]
    engines: dict[str, Engine] = {
        "eu": create_engine(cell_with_backlog(new_database, 2)),
        "hung-a": create_engine(f"postgresql+psycopg://outbox:s3cret-pw@127.0.0.1:{hanging[0].port}/outbox"),
        "us": create_engine(cell_with_backlog(new_database, 1)),
        "hung-b": create_engine(f"postgresql+psycopg://outbox:s3cret-pw@127.0.0.1:{hanging[1].port}/outbox"),
    }
    wait = 1.8
    collectors = {
        name: OutboxCollector(engine, cache_seconds=0, wait_seconds=wait, cell=name) for name, engine in engines.items()
    }
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CellsCollector(collectors))
    noop = test_kinds.NOOP.name
    try:
        for _ in range(2):  # the second while the first's snapshots of the hung cells still wait
            started = time.monotonic()
            found = samples(generate_latest(registry).decode())
            took = time.monotonic() - started
            assert wait <= took < wait + 1.5, took
            up = {cell: value(found, "outbox_exporter_up", cell=cell) for cell in engines}
            assert up == {"eu": 1, "hung-a": 0, "us": 1, "hung-b": 0}
            assert value(found, "outbox_due_actions", cell="eu", kind=noop) == 2
            assert value(found, "outbox_due_actions", cell="us", kind=noop) == 1
            assert {dict(labels)["cell"] for name, labels in found if name.startswith("action_")} == {"eu", "us"}
    finally:
        for front in hanging:
            front.close()
        for engine in engines.values():
            engine.dispose()
    down = [r.getMessage() for r in caplog.records if r.name == "outbox.metrics" and "exporter_up 0" in r.getMessage()]
    assert sorted(line.split(" (")[0] for line in down) == [
        "outbox_exporter_up 0: cannot read the outbox database of cell hung-a",
        "outbox_exporter_up 0: cannot read the outbox database of cell hung-b",
    ]
    assert not any("s3cret-pw" in line for line in down), down


def test_the_cells_exposition_passes_promtool(new_database: MakeDatabase) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs Debian's prometheus"
    engines = {"eu": create_engine(cell_with_backlog(new_database, 1)), "us": create_engine(DOWN)}
    try:
        exposition = generate_latest(registry_for_cells(engines, cache_seconds=0))
    finally:
        for engine in engines.values():
            engine.dispose()
    checked = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout.decode() + checked.stderr.decode()
    # each family once, with the samples of both cells
    types = [line.split()[2] for line in exposition.decode().splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)) and "action_attempts_total" in types
    found = samples(exposition.decode())
    assert [value(found, "outbox_exporter_up", cell=cell) for cell in ("eu", "us")] == [1, 0]
