"""What one enqueue costs the database: backend CPU and WAL per action, one action per transaction.

    a fresh database (the benchmarks' server) ─▶ N enqueues through `outbox.enqueue` on one connection, each
    its own transaction: into a lane of its own (`alone`), or into 10 lanes in turn (`behind`: behind a
    holder, as a busy account's actions queue up) ─▶ the backend's CPU and the server's WAL, per action

    .venv/bin/python -m bench.enqueue_cost [--actions 5000] [--rounds 3]

No executor runs: the actions stay ADMITTED. Run it from two checkouts in turn to compare revisions.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from sqlalchemy import text

import outbox
from bench import harness, kinds
from bench.peers.sql_loop import backend_cpu_seconds

WAL_POSITION = text("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint")


def measure(server: str, shape: str, actions: int) -> tuple[float, float]:
    """(backend CPU µs, WAL bytes) per enqueue."""
    with harness.fresh_database(server, "bench_enqueue") as (_url, engine), engine.connect() as conn:
        backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        conn.commit()
        cpu0, wal0 = backend_cpu_seconds(backend), int(conn.execute(WAL_POSITION).scalar_one())
        conn.commit()
        for n in range(actions):
            lane = f"lane-{n}" if shape == "alone" else f"lane-{n % 10}"
            request = outbox.ActionRequest(
                kind=kinds.NOOP, workspace_id=1, lane_key=lane, idempotency_key=f"enqueue-{n}", payload={}
            )
            outbox.enqueue(conn, request)
            conn.commit()
        cpu, wal = backend_cpu_seconds(backend) - cpu0, int(conn.execute(WAL_POSITION).scalar_one()) - wal0
        conn.commit()
    return cpu / actions * 1e6, wal / actions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = harness.server_url()
    print(f"PostgreSQL {harness.server_version(server)}; load average {Path('/proc/loadavg').read_text().split()[:3]}")
    for shape in ("alone", "behind"):
        runs = [measure(server, shape, args.actions) for _ in range(args.rounds)]
        cpus = " / ".join(f"{cpu:.1f}" for cpu, _ in runs)
        print(
            f"{shape}: backend CPU {statistics.median(cpu for cpu, _ in runs):.1f} µs per enqueue ({cpus}),"
            f" WAL {statistics.median(wal for _, wal in runs):,.0f} B per enqueue",
            flush=True,
        )


if __name__ == "__main__":
    main()
