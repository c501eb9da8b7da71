"""`outbox demo` itself, as the README's first command runs it: an embedded PostgreSQL, the SMTP sink, the
Prefect server, deployments, the exporter and workers; a small workload; what a visitor reads of it: the
summary, the progress bars and the logs the demo's processes wrote."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2


def test_the_demo_runs_every_action_to_its_end_and_reports_what_a_visitor_should_see(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PREFECT_", "XDG_RUNTIME_DIR"))}
    env.update({"OUTBOX_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT), "COLUMNS": "160"})
    command = ["demo", "--actions", "60", "--lanes", "10", "--workers", str(WORKERS), "--timeout", "400"]
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", *command],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "using an embedded PostgreSQL" in output
    assert "RuntimeDirWarning" not in output and "XDG_RUNTIME_DIR" not in output, output[:2000]
    rows = summary_rows(output)

    assert rows["duplicates at the sink"] == ["0"], rows
    # a third of the backlog each: emails, webhooks to the receiver, events to the stream
    outcomes = {name.removeprefix("backlog: "): int(value[0]) for name, value in rows.items() if "CONFIRMED" in name}
    assert outcomes["WEBHOOK DONE CONFIRMED"] == 20 and outcomes["NATS_EVENT DONE CONFIRMED"] == 20, rows
    effects, deliveries = (int(n) for n in rows["webhooks at the receiver: effects / deliveries"][0].split(" / "))
    assert effects == 20 and deliveries >= effects, rows
    assert rows["events in the stream / distinct Nats-Msg-Id"] == ["20 / 20"], rows
    for name in ("Prefect UI answers", "metrics answers", "mailbox answers"):
        assert rows[name] == ["yes"], rows.get(name)

    # the backlog's bar and its throughput measure one interval: the bar shows whole seconds
    bar = re.search(r"backlog: actions ended since the first enqueue .* 60/60 +0:(\d\d):(\d\d)", output)
    assert bar, output[-4000:]
    throughput = re.search(r"\(60 in ([\d.]+) s\)", rows["backlog: throughput, first enqueue to last end"][0])
    assert throughput, rows
    assert int(bar[1]) * 60 + int(bar[2]) == int(float(throughput[1])), (bar[0], throughput[0])

    # the pickup of idle executors, in milliseconds: generous on a shared 2-core machine
    (pickup,) = rows["pickup at 20/s p50 / p95 / p99 (due to fence)"]
    quantiles = re.search(r"([\d,.]+) ms / ([\d,.]+) ms / ([\d,.]+) ms over \d+ actions", pickup)
    assert quantiles, pickup
    assert float(quantiles[1].replace(",", "")) < 2000, pickup

    # every worker ran a drain run of its own, named after it, and its executor claimed before the workload
    runs = " ".join(rows["drain runs (one per worker)"])
    workdir = tmp_path / "data" / "demo"
    for n in range(1, WORKERS + 1):
        assert f"outbox-worker-{n} " in runs, runs
        assert f"Beginning flow run 'outbox-worker-{n} " in (workdir / f"worker-{n}.log").read_text()
    assert f"{WORKERS} executors claiming" in output

    # no log of the demo's processes holds a traceback, the stop included
    logs = [*workdir.glob("*.log"), tmp_path / "data" / "pg" / "log"]
    assert {log.name for log in logs} >= {"prefect-server.log", "exporter.log", "worker-1.log", "log"}
    with_traceback = [log.name for log in logs if "Traceback" in log.read_text(errors="replace")]
    assert not with_traceback, with_traceback


def test_outside_a_clone_the_demo_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    """An outbox with no demo/ next to it (as installed), run in a folder that is not a clone either."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "outbox", site / "outbox", ignore=shutil.ignore_patterns("__pycache__"))
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PREFECT_"))}
    env |= {"OUTBOX_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "demo"], env=env, cwd=folder, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "runs from a clone of the outbox repository" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()


def summary_rows(output: str) -> dict[str, list[str]]:
    """The summary table's rows by their first cell: the lines of each row's second cell."""
    rows: dict[str, list[str]] = {}
    name = ""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if len(cells) != 2:
            continue
        name = cells[0] or name
        rows.setdefault(name, []).append(cells[1])
    return rows
