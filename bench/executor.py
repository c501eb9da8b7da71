"""Executor benchmarks: throughput, pickup latency, and claim cost on a large table.

    python -m bench.executor [--actions 50000] [--lanes 1000] [--skip-large]

1. throughput: 2 executor processes drain N pre-enqueued no-op actions over L lanes (fence and finish
   writes included), timed from the commit that wakes them to the last action ended.
2. pickup: one idle executor; actions enqueued one per transaction at 50/s; enqueue commit to adapter start.
3. large table: 1,000,000 ended rows and 100,000 pending, half of them in one hot lane; the rate at which the
   other 50,000 drain, against the small-table rate of run 1 (target: within 1.5x).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, text

from bench import harness


def throughput(server: str, actions: int, lanes: int, executors: int = 2) -> float:
    with harness.fresh_database(server, "bench_throughput") as (url, engine):
        processes = harness.start_executors(url, executors, "bench.adapters:noop_adapters")
        try:
            harness.wait_listening(engine, executors)
            harness.bulk_admit(engine, actions, lanes)
            seconds = harness.wait_drained(engine)
        finally:
            harness.stop(processes)
    return actions / seconds


def pickup(
    server: str,
    count: int = 500,
    rate: float = 50.0,
    *,
    through: Callable[[str], str] = str,
    extra_env: dict[str, str] | None = None,
    listens: bool = True,
) -> list[float]:
    """Pickup delays in ms. `through`: the executor's URL from the database's (a pooler's, say); `listens`:
    whether the executor LISTENs (else it polls, and the enqueue starts once it has beaten)."""
    with harness.fresh_database(server, "bench_pickup") as (url, engine), tempfile.TemporaryDirectory() as tmp:
        pickups = Path(tmp) / "pickups"
        processes = harness.start_executors(
            through(url),
            1,
            "bench.adapters:pickup_adapters",
            {"OUTBOX_BENCH_PICKUP_FILE": str(pickups), **(extra_env or {})},
            "--lease-seconds",
            "300",
        )
        committed: dict[int, int] = {}
        try:
            if listens:
                harness.wait_listening(engine, 1)
            else:
                harness.wait_beating(engine, 1)
            import outbox
            from bench import kinds

            for i in range(count):
                with engine.begin() as conn:
                    action = outbox.enqueue(
                        conn,
                        outbox.ActionRequest(
                            kind=kinds.NOOP, workspace_id=1, lane_key=f"p-{i}", idempotency_key=f"p-{i}", payload={}
                        ),
                    )
                committed[action.id] = time.time_ns()
                time.sleep(1 / rate)
            harness.wait_drained(engine)
        finally:
            harness.stop(processes)
        started = {int(a): int(t) for a, t in (line.split() for line in pickups.read_text().splitlines())}
    return sorted((started[i] - committed[i]) / 1e6 for i in committed)


def large_table(server: str, executors: int = 2) -> tuple[float, tuple[float, float], int]:
    """(rate of the 50,000 other actions, claim times of 50 heads in ms, hot-lane actions done meanwhile)."""
    with harness.fresh_database(server, "bench_large") as (url, engine):
        seed_ended(engine, 1_000_000)
        hot_and_others(engine)
        claim_ms = explain_claim_ms(engine)
        processes = harness.start_executors(url, executors, "bench.adapters:noop_adapters")
        try:
            harness.wait_listening(engine, executors)
            with engine.begin() as conn:
                conn.execute(text("SELECT pg_notify('outbox_action', '')"))
            seconds = harness.wait_drained(engine, "lane_key <> 'hot'")
            hot_done = harness.ended(engine, "lane_key = 'hot'")
        finally:
            harness.stop(processes)
    return 50_000 / seconds, claim_ms, hot_done


def seed_ended(engine: Engine, count: int) -> None:
    """Ended rows as the retention window keeps them. Bulk-loaded with triggers off (setup only)."""
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state,
                                      attempt, epoch, stop_reason, readback_ref, ended_at, write_started_at)
            SELECT 'TEST_NOOP', 1, 'old-' || (g % 5000), 'old-' || g, NULL, 5, 'DONE', 1, 1, 'CONFIRMED', 'noop',
                   now() - interval '1 day', now() - interval '1 day'
              FROM generate_series(1, :count) AS g
        """),
            {"count": count},
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE agent_action"))


def hot_and_others(engine: Engine) -> None:
    """50,000 pending in one hot lane, enqueued first, then 1,000 lanes with 50 each."""
    with engine.begin() as conn:
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
            SELECT 'TEST_NOOP', 1, 'hot', 'hot-' || g, '{}', 5, 'ADMITTED' FROM generate_series(1, 50000) AS g
        """)
        )
    harness.bulk_admit(engine, 50_000, 1_000, lane_prefix="other")
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))


# The straightforward lane-head claim (NOT EXISTS an executing action in the lane), measured on the same data.
NAIVE_CLAIM = """
SELECT a.id FROM agent_action a
WHERE a.state = 'ADMITTED' AND a.due_at <= now()
  AND NOT EXISTS (SELECT 1 FROM agent_action e WHERE e.lane_key = a.lane_key AND e.state = 'EXECUTING')
  AND NOT EXISTS (SELECT 1 FROM agent_action p WHERE p.lane_key = a.lane_key AND p.id < a.id
                  AND p.state IN ('PROPOSED','ADMITTED'))
ORDER BY a.due_at, a.id LIMIT 50 FOR UPDATE SKIP LOCKED
"""


def explain_ms(engine: Engine, statement: str, params: dict[str, object]) -> float:
    """A statement's own execution time, rolled back."""
    with engine.connect() as conn:
        plan = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + statement), params).scalar_one()
        conn.rollback()
    return float(plan[0]["Execution Time"])


def explain_claim_ms(engine: Engine) -> tuple[float, float]:
    """(our claim of 50 heads, the naive claim of 50 heads), in ms."""
    from outbox.store import executor as store_executor

    ours = explain_ms(
        engine, str(store_executor.CLAIM_READY_HEADS.text), {"limit": 50, "lease_seconds": 300, "kinds": ["TEST_NOOP"]}
    )
    return ours, explain_ms(engine, NAIVE_CLAIM, {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=50_000)
    parser.add_argument("--lanes", type=int, default=1_000)
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args()
    server = harness.server_url()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" PostgreSQL {harness.server_version(server)}"
    )
    rate = throughput(server, args.actions, args.lanes)
    print(
        f"throughput: {args.actions} no-op actions, {args.lanes} lanes, 2 executors: {rate:,.0f} actions/s"
        f" (target 3,000: {rate / 3000:.2f}x)"
    )
    latencies = pickup(server)
    q = statistics.quantiles(latencies, n=100)
    print(
        f"pickup (enqueue commit to adapter start, {len(latencies)} actions at 50/s):"
        f" p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms, p99 {q[98]:.1f} ms (targets p50 < 10, p99 < 50)"
    )
    if not args.skip_large:
        large_rate, (claim_ms, naive_ms), hot_done = large_table(server)
        print(
            f"large table (1,000,000 ended, 100,000 pending, hot lane 50,000): others drain at"
            f" {large_rate:,.0f} actions/s, {rate / large_rate:.2f}x slower than the small table (target <= 1.5x);"
            f" the hot lane ran {hot_done:,} actions meanwhile"
        )
        print(
            f"claim of 50 lane heads on that table: {claim_ms:.2f} ms; the naive NOT EXISTS claim:"
            f" {naive_ms:.1f} ms ({naive_ms / claim_ms:.0f}x)"
        )


if __name__ == "__main__":
    main()
