"""Cells under an outage and a rolling upgrade, against real servers.

One cell's server stopped: three cells, each a PostgreSQL server of its own (tests/chaos/postgres.py's
OwnPostgres), each with a backlog, drained by two `outbox run --all-cells` processes. The server of cell ap
is stopped (a fast shutdown) for OUTAGE_SECONDS, then started again. One `outbox metrics serve --all-cells`
is scraped every second by a real Prometheus that evaluates the shipped alert rules every second, each
rule's `for` period read in seconds instead of minutes (5m: 5 s), so that an outage of seconds shows what
an outage of minutes pages with. The other cells drain while ap is down; ap's backlog drains once it is
back; every action is attempted once and ends DONE; the alert that fires names ap and no other cell.

OUTBOX_TEST_CELL_OUTAGE_SECONDS sets the outage (20 s by default; 60 s by hand).

A rolling upgrade: three cells (databases of the test server) at the revision before head, two
`outbox run --all-cells` processes draining them, then `outbox db upgrade --all-cells` while they run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

import outbox
from dashboards import build
from outbox import migrate
from outbox.testing import install_kinds
from tests import kinds as test_kinds
from tests.chaos.postgres import OwnPostgres
from tests.support import until
from tests.test_cells import new_database  # noqa: F401  (a fixture)
from tests.test_cells_drain import attempts, states
from tests.test_dashboards import _answers, free_port, scraping

ROOT = Path(__file__).resolve().parent.parent
CELLS = ("eu", "us", "ap")
STOPPED = "ap"
OUTAGE_SECONDS = float(os.environ.get("OUTBOX_TEST_CELL_OUTAGE_SECONDS", "20"))
BACKLOG = 600  # actions per cell
LANES = 20  # lanes per cell
WORK_SECONDS = 0.1  # the provider's work on each attempt
CONCURRENCY = 4  # attempts in flight per cell in each executor process: the cells drain in about 8 s each


@pytest.fixture
def servers() -> Iterator[dict[str, OwnPostgres]]:
    """A PostgreSQL server per cell, started side by side; stopped and removed after the test."""
    with ThreadPoolExecutor(len(CELLS)) as pool:
        started = dict(zip(CELLS, pool.map(lambda _: OwnPostgres(), CELLS), strict=True))
    yield started
    for server in started.values():
        with contextlib.suppress(RuntimeError):  # already stopped by a failed test: its files are removed all the same
            server.stop()


def cells_env(urls: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment of every outbox process of the test: the cells file, each URL in its variable."""
    cells = tmp_path / "cells.toml"
    cells.write_text("".join(f'[cells.{c}]\ndatabase_url_variable = "CELL_{c.upper()}_URL"\n' for c in urls))
    return {
        **{k: v for k, v in os.environ.items() if k != "OUTBOX_DATABASE_URL"},
        **{f"CELL_{c.upper()}_URL": url for c, url in urls.items()},
        "OUTBOX_CELLS_FILE": str(cells),
        "PYTHONPATH": str(ROOT),
    }


def outbox_command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "outbox.cli", *args]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def add_backlog(url: str, cell: str, count: int, start: int = 0) -> None:
    """The test kinds declared in the cell, and `count` actions over LANES lanes named after it."""
    engine = create_engine(url)
    requests = [
        outbox.ActionRequest(
            kind=test_kinds.NOOP,
            workspace_id=1,
            lane_key=f"{cell}-{n % LANES}",
            idempotency_key=f"{cell}-{n}",
            payload={"n": n},
        )
        for n in range(start, start + count)
    ]
    try:
        with engine.begin() as conn:
            install_kinds(conn, test_kinds.ALL)
            if requests:
                outbox.enqueue_many(conn, requests)
    finally:
        engine.dispose()


def executors(
    env: dict[str, str], tmp_path: Path, count: int = 2, concurrency: int = 8
) -> list[subprocess.Popen[bytes]]:
    """`count` processes of `outbox run --all-cells` with the recording test adapters."""
    command = [
        sys.executable,
        "-m",
        "outbox.cli",
        "run",
        "--all-cells",
        "--adapters",
        "tests.adapters:recording_adapters",
    ]
    command += ["--concurrency", str(concurrency), "--connect-timeout", "2"]
    started = []
    for n in range(count):
        with (tmp_path / f"run-{n}.err").open("wb") as err:
            started.append(subprocess.Popen(command, env=env, cwd=ROOT, stderr=err))
    return started


def beating(url: str) -> int:
    """Executors with a heartbeat row in the cell."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM agent_executor")).scalar_one())
    finally:
        engine.dispose()


def stop_all(processes: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """SIGTERM each process; each must stop cleanly."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for n, process in enumerate(processes):
        assert process.wait(90) == 0, (tmp_path / f"run-{n}.err").read_text()


def kill_left(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def ends(record: Path, cell: str) -> list[float]:
    """The wall-clock end of each of the cell's attempts (the adapter's record), sorted."""
    found = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return sorted(end / 1e9 for _, lane, _, end in found if lane.rpartition("-")[0] == cell)


def minutes_as_seconds(tmp_path: Path) -> Path:
    """The shipped Prometheus rules, evaluated every second, each `for` period read in seconds instead of
    minutes (5m: 5s, 1h: 60s): the expressions, labels and annotations as shipped."""
    rules = yaml.safe_load(build.PROMETHEUS_RULES_FILE.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            period = str(rule.get("for", "0m"))
            seconds = int(period[:-1]) * {"m": 1, "h": 60}[period[-1]]
            rule["for"] = f"{seconds}s"
    path = tmp_path / "outbox-rules-fast.yml"
    path.write_text(yaml.safe_dump(rules))
    return path


def alerts(prometheus: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{prometheus}/api/v1/alerts", timeout=10) as response:
        return list(json.loads(response.read())["data"]["alerts"])


def firing(prometheus: str) -> list[dict[str, Any]]:
    return [a for a in alerts(prometheus) if a["state"] == "firing"]


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.loads(response.read())["data"]["result"])


def query_range(prometheus: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    """Every series `expr` gave at some second between `start` and `end`."""
    asked = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{asked}", timeout=10) as response:
        return list(json.loads(response.read())["data"]["result"])


def exporter(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "outbox.cli", "metrics", "serve", "--all-cells", "--port", str(port)]
    command += ["--cache-seconds", "0", "--connect-timeout", "2"]
    with (tmp_path / "exporter.log").open("wb") as log:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/metrics"
    until(lambda: _answers(url) or process.poll() is not None, what="the exporter to answer")
    assert process.poll() is None, (tmp_path / "exporter.log").read_text()
    return process, url


def test_one_cell_s_server_stopped_the_others_drain_its_backlog_drains_after_and_its_alert_names_it(
    servers: dict[str, OwnPostgres], tmp_path: Path
) -> None:
    urls = {cell: server.url for cell, server in servers.items()}
    env = cells_env(urls, tmp_path)
    upgraded = outbox_command(env, "db", "upgrade", "--all-cells")
    assert upgraded.returncode == 0, upgraded.stderr
    for cell, url in urls.items():
        add_backlog(url, cell, 0)  # the test kinds only
    record = tmp_path / "attempts.jsonl"
    env["OUTBOX_TEST_RECORD_FILE"] = str(record)
    env["OUTBOX_TEST_WORK_SECONDS"] = str(WORK_SECONDS)
    running = executors(env, tmp_path, concurrency=CONCURRENCY)
    watching: subprocess.Popen[bytes] | None = None
    try:
        # the executors beat in every cell before the exporter is watched (or no executor would alert)
        until(lambda: all(beating(url) == 2 for url in urls.values()), 60, "two executors beating in every cell")
        watching, metrics = exporter(env, tmp_path)
        with scraping(metrics, tmp_path, rules=minutes_as_seconds(tmp_path)) as prometheus:
            until(lambda: len(query(prometheus, "outbox_exporter_up == 1")) == 3, 30, "three cells scraped up")
            for cell, url in urls.items():
                add_backlog(url, cell, BACKLOG)
            until(lambda: all(states(url)["DONE"] >= 5 for url in urls.values()), 30, "every cell to drain")
            # no alert before the outage (a rule's no-data alert of Prometheus's first seconds has resolved)
            until(lambda: not firing(prometheus), 30, "no alert before the outage")

            servers[STOPPED].halt("fast")
            stopped_at = time.time()
            left = {cell: BACKLOG - states(urls[cell])["DONE"] for cell in CELLS if cell != STOPPED}
            assert all(n > 0 for n in left.values()), f"the other cells ended before the outage: {left}"
            seen: list[dict[str, Any]] = []

            def named() -> bool:  # the stopped cell's alert, firing
                seen[:] = firing(prometheus)
                return any(a["labels"].get("cell") == STOPPED for a in seen)

            until(named, OUTAGE_SECONDS, f"an alert to fire for cell {STOPPED}")
            fired_after = time.time() - stopped_at
            for alert in seen:
                assert alert["labels"]["cell"] == STOPPED, seen
                assert alert["annotations"]["summary"].startswith(f"Cell {STOPPED}: "), alert
                assert not any(f"Cell {c}" in alert["annotations"]["summary"] for c in CELLS if c != STOPPED)
            assert {a["labels"]["alertname"] for a in seen} == {"OutboxExporterDown"}, seen
            # the outage lasts its length: the other cells end their backlogs meanwhile
            until(lambda: time.time() >= stopped_at + OUTAGE_SECONDS, OUTAGE_SECONDS + 5, "the outage's end")
            others_done = {c: states(urls[c])["DONE"] for c in left}
            assert all(executor.poll() is None for executor in running), "an executor exited during the outage"
            servers[STOPPED].start()
            started_at = time.time()

            until(lambda: states(urls[STOPPED])["DONE"] == BACKLOG, 120, f"cell {STOPPED} to drain after it returned")
            drained_after = time.time() - started_at
            until(lambda: not firing(prometheus), 60, "the alerts to resolve once the cell is back")
            fired = query_range(prometheus, 'ALERTS{alertstate="firing"}', stopped_at, time.time())
            assert {r["metric"].get("cell") for r in fired} == {STOPPED}, fired
        assert all(executor.poll() is None for executor in running), "an executor exited"
        stop_all(running, tmp_path)
    finally:
        kill_left(running)
        if watching is not None:
            watching.terminate()
            watching.wait(10)

    # the other cells ended their backlogs before ap returned, ending actions all along: no gap of more
    # than 3 s between the stop and their last action
    assert others_done == {c: BACKLOG for c in left}, others_done
    gaps, last = {}, {}
    for cell in left:
        during = [stopped_at] + [end for end in ends(record, cell) if end >= stopped_at]
        assert len(during) > 1, (cell, during)
        gaps[cell] = max(b - a for a, b in itertools.pairwise(during))
        last[cell] = during[-1] - stopped_at
        assert gaps[cell] < 3, (cell, gaps[cell])
    done = attempts(record)
    assert set(done.values()) == {1}, "every action attempted once"
    assert Counter(cell for cell, _ in done) == {cell: BACKLOG for cell in CELLS}
    for url in urls.values():
        assert states(url) == {"DONE": BACKLOG}
    said = "".join((tmp_path / f"run-{n}.err").read_text() for n in range(len(running)))
    assert "Traceback" not in said, said
    print(
        f"outage {OUTAGE_SECONDS:g} s: {left} left in the other cells at the stop, their last {fixed(last)} s"
        f" after it, the longest gap between two ends {fixed(gaps)} s;"
        f" the alert fired {fired_after:.1f} s after the stop; {STOPPED} drained {drained_after:.1f} s after it"
        " returned"
    )


def fixed(figures: dict[str, float]) -> dict[str, str]:
    return {key: f"{value:.2f}" for key, value in figures.items()}


# ---- a rolling upgrade while executors drain -----------------------------------------------------------


def previous_revision() -> str:
    """The revision before head (head-1)."""
    found = ScriptDirectory(str(migrate.MIGRATIONS_DIR)).get_revision(migrate.head())
    assert found is not None and isinstance(found.down_revision, str)
    return found.down_revision


def test_a_rolling_upgrade_of_every_cell_while_executors_drain_them(
    new_database: Callable[[bool], str],  # noqa: F811
    tmp_path: Path,
) -> None:
    urls = {cell: new_database(False) for cell in CELLS}
    env = cells_env(urls, tmp_path)
    behind = previous_revision()
    upgraded = outbox_command(env, "db", "upgrade", behind, "--all-cells")
    assert upgraded.returncode == 0, upgraded.stderr
    for cell, url in urls.items():
        add_backlog(url, cell, 200)
    record = tmp_path / "attempts.jsonl"
    env["OUTBOX_TEST_RECORD_FILE"] = str(record)
    running = executors(env, tmp_path)
    try:
        until(lambda: all(states(url)["DONE"] >= 5 for url in urls.values()), 90, "every cell to drain")
        during = {cell: 200 - states(url)["DONE"] for cell, url in urls.items()}
        assert all(n > 0 for n in during.values()), f"a cell ended its backlog before the upgrade: {during}"
        upgraded = outbox_command(env, "db", "upgrade", "--all-cells")
        assert upgraded.returncode == 0, upgraded.stderr
        head = migrate.head()
        assert upgraded.stderr.splitlines() == [
            f"cell {cell}: outbox schema at revision {head} (was {behind})" for cell in CELLS
        ]
        status = outbox_command(env, "status", "--all-cells", "--json")
        assert status.returncode == 0, status.stderr
        assert {line["cell"]: line["revision"] for line in json.loads(status.stdout)} == dict.fromkeys(CELLS, head)
        for cell, url in urls.items():  # more work at head, for the same executors
            add_backlog(url, cell, 100, start=200)
        until(lambda: all(states(url)["DONE"] == 300 for url in urls.values()), 120, "every cell drained")
        assert all(executor.poll() is None for executor in running), "an executor exited"
        stop_all(running, tmp_path)
    finally:
        kill_left(running)
    done = attempts(record)
    assert set(done.values()) == {1}, "every action attempted once"
    assert Counter(cell for cell, _ in done) == dict.fromkeys(CELLS, 300)
    for url in urls.values():
        assert states(url) == {"DONE": 300}
    print(f"upgraded {behind} to {migrate.head()} with {during} actions left in the cells")
