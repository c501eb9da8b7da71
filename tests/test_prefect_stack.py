"""The whole stack with real parts: a Prefect server, deployments applied, two workers as separate processes,
a real SMTP sink. Emails go out through scheduled drain runs; a worker SIGKILLed mid-run loses nothing and
sends nothing twice while the other keeps draining; the Prefect UI shows the runs in a real browser."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from examples.accounts import schema
from outbox.demo import enqueue_workload
from outbox.stack import Stack
from tests.support import until

EMAILS, LANES = 120, 12


@pytest.fixture
def stack(engine: Engine, database_url: str, tmp_path: Path) -> Iterator[Stack]:
    with engine.begin() as conn:
        schema.create(conn)
    running = Stack(database_url=database_url, workdir=tmp_path / "stack", workers=2, flaky=0.0, lease_seconds=65)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def ended(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL")).scalar_one())


def flow_runs(prefect_url: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        f"{prefect_url}/api/flow_runs/filter", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return list(json.loads(response.read()))


def test_a_killed_worker_loses_nothing_and_sends_nothing_twice(engine: Engine, stack: Stack, tmp_path: Path) -> None:
    enqueue_workload(engine, EMAILS, LANES)
    stack.run_drain_now()
    until(lambda: ended(engine) >= EMAILS // 5, timeout=180, what="a fifth of the emails to end")
    stack.kill("worker-1")  # the worker and the flow run it started, as a crashed machine
    until(lambda: ended(engine) == EMAILS, timeout=300, what="every email to end after the kill")

    assert stack.sink is not None
    counts = Counter(r.message_id for r in stack.sink.received)
    assert all(n == 1 for n in counts.values()), "an email was sent twice"
    with engine.connect() as conn:
        outcomes = dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all())
    assert set(outcomes) <= {"DONE", "UNCERTAIN"} and sum(outcomes.values()) == EMAILS
    # every DONE email arrived exactly once; an UNCERTAIN one (the killed run had fenced it) at most once
    assert outcomes.get("DONE", 0) <= len(counts) <= EMAILS

    # the drain runs end their 40 s windows and complete; the killed worker's run does not
    until(
        lambda: any(r["state_type"] == "COMPLETED" for r in flow_runs(stack.prefect_url)),
        timeout=120,
        what="a drain run to complete",
    )
    screenshot(stack.prefect_url, tmp_path / "prefect-runs.png")


def screenshot(prefect_url: str, path: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: .ci/run installs Debian's chromium"
    profile = path.parent / "chromium-profile"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--screenshot={path}",
            "--window-size=1400,900",
            "--virtual-time-budget=15000",
            f"{prefect_url}/runs",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert path.stat().st_size > 10_000, "the Prefect UI rendered nothing"
