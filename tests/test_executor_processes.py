"""Four executor processes on one database: lanes stay serial and in id order, every action ends once.

Two of the four run with their wall clock six hours off, one each way: leases and due times come from
the database, so nothing they claim looks expired to anyone and no action is claimed twice.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from sqlalchemy import Engine, text

import outbox
from tests import kinds
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
ACTIONS = 5_000
LANES = 200
SKEWS = [0, 0, 6 * 3600, -6 * 3600]


def enqueue_workload(engine: Engine) -> None:
    """Every action in one batch, its ids in request order (each lane in the order of i)."""
    requests = [
        outbox.ActionRequest(
            kind=kinds.NOOP, workspace_id=1, lane_key=f"lane-{i % LANES}", idempotency_key=f"job-{i}", payload={"i": i}
        )
        for i in range(ACTIONS)
    ]
    with engine.begin() as conn:
        outbox.enqueue_many(conn, requests)


def start_executor(database_url: str, record: Path, skew: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_TEST_RECORD_FILE": str(record),
        "OUTBOX_TEST_CLOCK_SKEW_SECONDS": str(skew),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outbox.cli",
            "run",
            "--adapters",
            "tests.adapters:recording_adapters",
            "--concurrency",
            "32",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stopped(process: subprocess.Popen[bytes]) -> int | None:
    """The exit code after SIGTERM; a process that does not stop within a minute is killed (None)."""
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        return None


def ended(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL")).scalar_one())


def test_four_processes_keep_every_lane_serial_and_in_order(engine: Engine, database_url: str, tmp_path: Path) -> None:
    enqueue_workload(engine)
    records = [tmp_path / f"executor-{n}.jsonl" for n in range(len(SKEWS))]
    processes = [start_executor(database_url, record, skew) for record, skew in zip(records, SKEWS, strict=True)]
    try:
        until(lambda: ended(engine) == ACTIONS, timeout=120, what="every action to end")
        finished = True
    except AssertionError:
        finished = False
    for process in processes:
        process.send_signal(signal.SIGTERM)
    codes = [stopped(process) for process in processes]
    logs = [p.stderr.read().decode()[-3000:] for p in processes if p.stderr]
    assert finished and codes == [0, 0, 0, 0], logs

    attempts = [json.loads(line) for record in records for line in record.read_text().splitlines()]
    by_lane: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for action_id, lane, start, end in attempts:
        by_lane[lane].append((start, end, action_id))
    assert len(attempts) == ACTIONS and len({a[0] for a in attempts}) == ACTIONS  # each carried out once
    for lane, runs in by_lane.items():
        runs.sort()
        ids = [action_id for _, _, action_id in runs]
        assert ids == sorted(ids), f"{lane} ran out of id order"
        for (_, end, before), (start, _, after) in itertools.pairwise(runs):
            assert end <= start, f"{lane}: action {after} started before action {before} ended"
    # every process took part, the skewed ones included
    assert all(record.stat().st_size > 0 for record in records)
    with engine.connect() as conn:
        states = conn.execute(text("SELECT state, attempt, epoch, count(*) FROM agent_action GROUP BY 1, 2, 3")).all()
        assert [tuple(s) for s in states] == [("DONE", 1, 1, ACTIONS)]  # no lease looked expired: no reclaim
        assert conn.execute(text("SELECT count(*) FROM agent_action WHERE lane_head")).scalar_one() == 0
