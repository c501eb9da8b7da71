"""The whole stack with real parts: a Prefect server, deployments applied, two `outbox worker` replicas as
separate processes, a real SMTP sink. Emails go out through drain runs; a worker SIGKILLed mid-run loses
nothing and sends nothing twice while the other keeps draining; runs relay without a gap in executors,
carry their worker's name and their tags, and end Completed when their worker is stopped, or when the
stack stops its drain as the demo does (nothing replaces them then); the Prefect UI shows the runs in a
real browser."""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from demo.run import enqueue_workload
from demo.stack import Stack
from examples.accounts import schema
from tests.support import prefect_post, until
from tests.test_drain_live import browse

EMAILS, LANES = 120, 12
# the states of a flow run that has not ended
UNENDED = ["SCHEDULED", "PENDING", "RUNNING", "CANCELLING", "PAUSED"]


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
    """Every drain run that left Scheduled (the schedule's future ticks are not runs yet)."""
    body = {"flow_runs": {"state": {"type": {"not_any_": ["SCHEDULED"]}}}}
    return [run for run in prefect_post(prefect_url, "/flow_runs/filter", body) if run["name"] != "outbox-purge"]


def states(prefect_url: str) -> Counter[str]:
    return Counter(run["state_name"] for run in flow_runs(prefect_url))


class ExecutorCount:
    """The executors registered in the database (agent_executor), sampled every 50 ms in a thread: the
    fewest seen while the relay hands over."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.samples: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ExecutorCount:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        with self.engine.connect() as conn:
            while not self._done.wait(0.05):
                self.samples.append(int(conn.execute(text("SELECT count(*) FROM agent_executor")).scalar_one()))
                conn.rollback()


def test_a_killed_worker_loses_nothing_and_sends_nothing_twice(engine: Engine, stack: Stack, tmp_path: Path) -> None:
    enqueue_workload(engine, EMAILS, LANES)
    # one run in each worker's own queue, so the other worker keeps draining after the kill (runs from the
    # shared queue may both go to one worker; then nothing drains until the schedule's next tick)
    stack.start_drain_per_worker()
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

    screenshot(stack.prefect_url, tmp_path / "prefect-runs.png")


def test_runs_relay_without_a_gap_and_end_completed_when_their_worker_stops(engine: Engine, stack: Stack) -> None:
    stack.run_drain_now()  # one run per worker
    until(lambda: states(stack.prefect_url)["Running"] == 2, timeout=120, what="two drain runs to run")
    # a run tags itself as it starts its executor
    tagged = {"outbox", "kind:EMAIL", "env:demo"}
    until(lambda: all(tagged <= set(r["tags"]) for r in flow_runs(stack.prefect_url)), timeout=60, what="the run tags")
    first = {run["id"] for run in flow_runs(stack.prefect_url)}
    for run in flow_runs(stack.prefect_url):
        assert re.fullmatch(r"outbox-worker-[12] \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", run["name"]), run["name"]

    # a third run (the next tick): the oldest hands over once it runs, and the executors never drop below two
    with ExecutorCount(engine) as executors:
        stack.run_drain_now(1)
        until(lambda: states(stack.prefect_url)["Completed"] == 1, timeout=120, what="the oldest run to hand over")
        until(lambda: states(stack.prefect_url)["Running"] == 2, timeout=30, what="two runs after the handover")
    assert executors.samples and min(executors.samples) >= 2, executors.samples
    handed_over = [r for r in flow_runs(stack.prefect_url) if r["state_name"] == "Completed"]
    assert handed_over[0]["id"] in first

    # a replica stopped in order, the one holding the most runs: its runs start their replacements on the
    # other replica and end Completed once those claim, so the executors never drop below two
    running = Counter(r["name"].split(" ")[0] for r in flow_runs(stack.prefect_url) if r["state_name"] == "Running")
    stopped, _ = running.most_common(1)[0]
    with ExecutorCount(engine) as executors:
        stack.stop_worker(stopped.removeprefix("outbox-"))
    assert executors.samples and min(executors.samples) >= 2, executors.samples
    on_stopped = [r for r in flow_runs(stack.prefect_url) if r["name"].startswith(f"{stopped} ")]
    assert all(r["state_name"] == "Completed" for r in on_stopped), [(r["name"], r["state_name"]) for r in on_stopped]
    final = states(stack.prefect_url)
    assert set(final) <= {"Completed", "Running"} and final["Running"] == 2, final
    # no run did anything and the outbox was empty: not one artifact (neither a live view nor a hand-over table)
    assert prefect_post(stack.prefect_url, "/artifacts/filter", {}) == []

    # the drain stopped as the demo stops it: the deployment paused, every worker stopped; each run ends
    # Completed, none is replaced, and no run logged an error (such as a run finished in state Cancelling)
    stack.stop_drain()
    assert set(states(stack.prefect_url)) == {"Completed"}, states(stack.prefect_url)
    waiting = {"deployments": {"name": {"any_": ["outbox-drain"]}}, "flow_runs": {"state": {"type": {"any_": UNENDED}}}}
    assert prefect_post(stack.prefect_url, "/flow_runs/filter", waiting) == []
    assert prefect_post(stack.prefect_url, "/logs/filter", {"logs": {"level": {"ge_": logging.ERROR}}}) == []


def screenshot(prefect_url: str, path: Path) -> None:
    browse(f"{prefect_url}/runs", path.parent / "chromium-profile", f"--screenshot={path}")
    assert path.stat().st_size > 10_000, "the Prefect UI rendered nothing"
