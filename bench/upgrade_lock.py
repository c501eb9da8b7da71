"""How long a revision's upgrade holds writes to `agent_action` on a large table, as an application meets it.

    a fresh database at revision FROM ─▶ 1,000,000 ended rows (bulk, triggers off) and 100,000 pending
    (50,000 in one hot lane, 1,000 lanes of 50), ANALYZE
    ─▶ a writer enqueues one action per transaction, without pause, on a connection of its own
    ─▶ after a second of that, `outbox.migrate.upgrade(conn, TO)` on another connection
    ─▶ the longest gap between two of the writer's commits while the upgrade ran: the time writes were held

    .venv/bin/python -m bench.upgrade_lock [--pairs 0013:0014 0014:0015] [--runs 3]

The pairs are alternated within every run, each on a database of its own on one server
(`OUTBOX_BENCH_DATABASE_URL`, or the benchmarks' embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from bench import harness, kinds
from bench.executor import seed_ended
from outbox import migrate
from outbox.testing import install_kinds

ENQUEUE = text("""
INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
VALUES ('TEST_NOOP', 1, :key, :key, '{}', 5, 'ADMITTED')
""")


@dataclass(frozen=True)
class Held:
    pair: str
    upgrade_seconds: float
    longest_gap_seconds: float
    writes: int


def database_at(server: str, name: str, revision: str) -> Engine:
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    engine = create_engine(make_url(server).set(database=name))
    with engine.begin() as conn:
        migrate.upgrade(conn, revision)
        install_kinds(conn, kinds.ALL)
    return engine


def load(engine: Engine) -> None:
    """The large table of `bench.executor`: the ended rows, then the pending ones through the revision's triggers."""
    seed_ended(engine, 1_000_000)
    with engine.begin() as conn:
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
            SELECT 'TEST_NOOP', 1, 'hot', 'hot-' || g, '{}', 5, 'ADMITTED' FROM generate_series(1, 50000) AS g
            """)
        )
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
            SELECT 'TEST_NOOP', 1, 'other-' || (g % 1000), 'other-' || g, '{}', 5, 'ADMITTED'
              FROM generate_series(1, 50000) AS g
            """)
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE agent_action"))


def measure(server: str, pair: str, run: int) -> Held:
    start, end = pair.split(":")
    engine = database_at(server, f"bench_upgrade_{start}_{end}_{run}", start)
    load(engine)
    commits: list[float] = []
    stop = threading.Event()

    def write() -> None:
        with engine.connect() as conn:
            n = 0
            while not stop.is_set():
                conn.execute(ENQUEUE, {"key": f"writer-{n}"})
                conn.commit()
                commits.append(time.monotonic())
                n += 1

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(1.0)  # the writer's steady pace before the upgrade: a measurement window, not synchronisation
    began = time.monotonic()
    with engine.begin() as conn:
        migrate.upgrade(conn, end)
    ended = time.monotonic()
    time.sleep(1.0)
    stop.set()
    writer.join()
    engine.dispose()
    # the gaps between consecutive commits that overlap the upgrade (the first commit after it included)
    during = [t for t in commits if t >= began]
    before = [t for t in commits if t < began][-1:]
    stamps = before + during
    gaps = [b - a for a, b in itertools.pairwise(stamps) if b >= began and a <= ended]
    return Held(pair, ended - began, max(gaps, default=0.0), len(commits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", default=["0013:0014", "0014:0015"])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    server = harness.server_url()
    print(f"PostgreSQL {harness.server_version(server)}; load average {Path('/proc/loadavg').read_text().split()[:3]}")
    results: dict[str, list[Held]] = {pair: [] for pair in args.pairs}
    for run in range(args.runs):
        for pair in args.pairs[run % len(args.pairs) :] + args.pairs[: run % len(args.pairs)]:
            held = measure(server, pair, run)
            results[pair].append(held)
            print(
                f"  {pair} run {run + 1}: upgrade {held.upgrade_seconds:.2f} s, writes held"
                f" {held.longest_gap_seconds:.2f} s ({held.writes:,} writes)",
                flush=True,
            )
    for pair, runs in results.items():
        gaps = [r.longest_gap_seconds for r in runs]
        print(
            f"{pair}: writes held median {statistics.median(gaps):.2f} s (runs: {', '.join(f'{g:.2f}' for g in gaps)})"
        )
    print(f"load average after: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
