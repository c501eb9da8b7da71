"""The database's own limit for outbox's row writes: insert, claim, fence, finish, with no executor around them.

    minimal  : a bare `job` table (no trigger, no lane table); per round trip of 50:
               claim (UPDATE ... SKIP LOCKED) ─▶ fence (UPDATE write_started_at) ─▶ finish (UPDATE to DONE),
               each its own transaction, as outbox's executor does them
    lifecycle: the same, after inserting those 50 jobs one per transaction, as callers enqueue them
    schema   : outbox's own statements (`outbox.store_executor`: the claim and the group commit) on
               `agent_action` with its triggers and lane table: what the database costs outbox

    python -m bench.peers.sql_loop minimal|lifecycle|schema --url ... --seconds S --out FILE

Each process loops until nothing is left to claim (or `--seconds` for lifecycle) and writes
`<jobs> <first start ns> <last end ns>`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import psycopg

BATCH = 50

CREATE = """
CREATE TABLE job (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lane             text        NOT NULL,
    payload          jsonb,
    state            text        NOT NULL DEFAULT 'ADMITTED',
    epoch            integer     NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    write_started_at timestamptz,
    ended_at         timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80);
CREATE INDEX job_ready ON job (id) WHERE state = 'ADMITTED';
"""
PRELOAD = "INSERT INTO job (lane, payload) SELECT 'lane-' || g, '{}' FROM generate_series(1, %(count)s) AS g"
INSERT = "INSERT INTO job (lane, payload) VALUES (%s, '{}')"
CLAIM = """
UPDATE job SET state = 'EXECUTING', epoch = epoch + 1, lease_expires_at = now() + interval '300 s'
 WHERE id IN (SELECT id FROM job WHERE state = 'ADMITTED' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, epoch
"""
FENCE = """
UPDATE job AS j SET write_started_at = now()
  FROM unnest(%s::bigint[], %s::int[]) AS f (id, epoch)
 WHERE j.id = f.id AND j.epoch = f.epoch AND j.state = 'EXECUTING'
   AND j.lease_expires_at >= now() + interval '60 s'
"""
FINISH = """
UPDATE job AS j SET state = 'DONE', ended_at = now(), payload = NULL, lease_expires_at = NULL
  FROM unnest(%s::bigint[], %s::int[]) AS f (id, epoch)
 WHERE j.id = f.id AND j.epoch = f.epoch AND j.state = 'EXECUTING'
"""


def create_minimal(url: str, preload: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CREATE)  # type: ignore[arg-type]
        if preload:
            conn.execute(PRELOAD, {"count": preload})  # type: ignore[arg-type]
            conn.execute("VACUUM ANALYZE job")


def minimal(url: str, seconds: float | None, insert: bool) -> tuple[int, int, int]:
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic_ns()
        deadline = start + int((seconds or 1e9) * 1e9)
        while time.monotonic_ns() < deadline:
            if insert:
                for i in range(BATCH):
                    conn.execute(INSERT, (f"lane-{done + i}",))  # type: ignore[arg-type]
            rows = conn.execute(CLAIM, (BATCH,)).fetchall()  # type: ignore[arg-type]
            if not rows:
                break
            ids, epochs = [r[0] for r in rows], [r[1] for r in rows]
            conn.execute(FENCE, (ids, epochs))  # type: ignore[arg-type]
            conn.execute(FINISH, (ids, epochs))  # type: ignore[arg-type]
            done += len(rows)
        return done, start, time.monotonic_ns()


def schema(url: str) -> tuple[int, int, int]:
    """outbox's claim and group commit (`ExecutorStore`), fences then results, on its own schema."""
    return asyncio.run(_schema(url))


async def _schema(url: str) -> tuple[int, int, int]:
    import bench.kinds  # noqa: F401  (registers the kinds the claimed rows name)
    from outbox.executor.claimed import AttemptReport, FinishWrite
    from outbox.executor.store import ExecutorStore, Write

    store = ExecutorStore(url)  # the libpq URL the loops take
    done = 0
    start = time.monotonic_ns()
    while claimed := await store.claim(BATCH, 300, ["TEST_NOOP"]):
        await store.commit([Write(a) for a in claimed], 60.0)
        report = AttemptReport("DONE", 0.001, 0.01)
        finish = FinishWrite("DONE", "CONFIRMED", readback_ref="noop")
        await store.commit([Write(a, report, finish) for a in claimed], 60.0)
        done += len(claimed)
    end = time.monotonic_ns()
    await store.close()
    return done, start, end


def read_result(path: Path) -> tuple[int, int, int]:
    jobs, start, end = path.read_text().split()
    return int(jobs), int(start), int(end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant", choices=["minimal", "lifecycle", "schema"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.variant == "schema":
        result = schema(args.url)
    else:
        result = minimal(args.url, args.seconds, insert=args.variant == "lifecycle")
    Path(args.out).write_text(" ".join(str(v) for v in result) + "\n")


if __name__ == "__main__":
    main()
