"""The database's own limit for outbox's row writes: insert, claim, fence, finish, with no executor around them.

    minimal     : a bare `job` table (no trigger, no lane table); per round trip of 50:
                  claim (UPDATE ... SKIP LOCKED) ─▶ fence (UPDATE write_started_at) ─▶ finish (UPDATE to DONE),
                  each its own transaction, as outbox's executor does them
    lifecycle   : the same, after inserting those 50 jobs one per transaction, as callers enqueue them
    contract-minimal: what any implementation of outbox's promises pays and nothing more: `agent_action` with the
                  columns of the schema contract, its guard trigger in PL/pgSQL, the unique lane index
                  (`ux_agent_action_lane_executing`), the unique idempotency key, a claim of lane heads by the
                  rule itself (no lane table), the fence in its own transaction, then the result
    schema      : outbox's own statements (`outbox.store.executor`: the claim and the group commit) on
                  `agent_action` with its triggers and lane table: what the database costs outbox

    python -m bench.peers.sql_loop minimal|lifecycle|contract-minimal|schema --url ... --seconds S --out FILE

Each process loops until nothing is left to claim (or `--seconds` for lifecycle) and writes
`<jobs> <first start ns> <last end ns> <CPU seconds of its server backend>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from sqlalchemy import TextClause

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
RETURNING j.id, j.epoch
"""
FINISH = """
UPDATE job AS j SET state = 'DONE', ended_at = now(), payload = NULL, lease_expires_at = NULL
  FROM unnest(%s::bigint[], %s::int[]) AS f (id, epoch)
 WHERE j.id = f.id AND j.epoch = f.epoch AND j.state = 'EXECUTING'
"""

# The schema contract's table, constraints and guard, and not one index more than the claim by the lane rule
# needs: the due actions in due order, and an earlier unstarted action of a lane by (lane_key, id).
SPEC_CREATE = """
CREATE TABLE agent_action (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind               text        NOT NULL CHECK (kind IN ('EMAIL', 'TEST_NOOP')),
    workspace_id       bigint,
    lane_key           text        NOT NULL,
    idempotency_key    text        NOT NULL CONSTRAINT ux_agent_action_idempotency_key UNIQUE,
    payload            jsonb,
    subject_account_id bigint,
    max_attempts       integer     NOT NULL CHECK (max_attempts > 0),
    expires_at         timestamptz,
    state              text        NOT NULL CHECK (state IN ('PROPOSED', 'ADMITTED', 'EXECUTING', 'DONE',
                                                            'UNCERTAIN', 'FAILED', 'CANCELLED')),
    attempt            integer     NOT NULL DEFAULT 0,
    epoch              bigint      NOT NULL DEFAULT 0,
    due_at             timestamptz NOT NULL DEFAULT now(),
    lease_expires_at   timestamptz,
    write_started_at   timestamptz,
    stop_reason        text        CHECK (stop_reason IN ('CONFIRMED', 'PROVIDER_REFUSED', 'ATTEMPTS_EXHAUSTED',
                                                          'PROVIDER_UNCERTAIN', 'ERROR_AFTER_WRITE',
                                                          'LEASE_LOST_AFTER_WRITE', 'EXPIRED',
                                                          'PROPOSAL_REFUSED', 'NOT_WANTED')),
    readback_ref       text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    ended_at           timestamptz,
    -- an instance-level kind (EMAIL) may run without a workspace; every other needs one
    CONSTRAINT ck_agent_action_workspace CHECK (workspace_id IS NOT NULL OR kind = 'EMAIL'),
    CONSTRAINT ck_agent_action_ended CHECK ((stop_reason IS NULL) = (ended_at IS NULL))
) WITH (fillfactor = 80);
CREATE UNIQUE INDEX ux_agent_action_lane_executing ON agent_action (lane_key) WHERE state = 'EXECUTING';
CREATE INDEX ix_agent_action_subject ON agent_action (subject_account_id) WHERE subject_account_id IS NOT NULL;
CREATE INDEX ix_agent_action_due ON agent_action (due_at, id) WHERE state = 'ADMITTED';
CREATE INDEX ix_agent_action_lane_pending ON agent_action (lane_key, id) WHERE state IN ('PROPOSED', 'ADMITTED');

CREATE FUNCTION guard_agent_action() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') OR NEW.attempt <> 0 OR NEW.epoch <> 0
           OR NEW.lease_expires_at IS NOT NULL OR NEW.write_started_at IS NOT NULL THEN
            RAISE EXCEPTION 'agent_action: a new action is PROPOSED or ADMITTED, with no attempt, epoch, lease or write'
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') THEN
        RAISE EXCEPTION 'agent_action %: an ended action never changes', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state = 'EXECUTING' AND (OLD.state <> 'EXECUTING' OR NEW.epoch <> OLD.epoch) THEN
        -- a claim, or a reclaim after the lease expired
        IF OLD.state NOT IN ('ADMITTED', 'EXECUTING') THEN
            RAISE EXCEPTION 'agent_action %: % -> EXECUTING is not an allowed transition', OLD.id, OLD.state
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.epoch <> OLD.epoch + 1 OR NEW.attempt <> OLD.attempt + 1 THEN
            RAISE EXCEPTION 'agent_action %: a claim raises epoch and attempt by exactly one', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL AND OLD.kind = 'EMAIL' THEN
            RAISE EXCEPTION 'agent_action %: % is at most once and its write started', OLD.id, OLD.kind
                USING ERRCODE = 'check_violation';
        END IF;
    ELSIF NEW.state <> OLD.state OR NEW.epoch <> OLD.epoch THEN
        IF NEW.epoch <> OLD.epoch OR NOT (
            (OLD.state = 'PROPOSED' AND NEW.state IN ('ADMITTED', 'CANCELLED'))
            OR (OLD.state = 'ADMITTED' AND NEW.state = 'CANCELLED')
            OR (OLD.state = 'EXECUTING' AND NEW.state IN ('ADMITTED', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
        ) THEN
            RAISE EXCEPTION 'agent_action %: % -> % is not an allowed transition', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') THEN
        IF NEW.stop_reason IS NULL THEN
            RAISE EXCEPTION 'agent_action %: ending as % needs a stop_reason', OLD.id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.ended_at := now();
        NEW.payload := NULL;
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER guard_agent_action BEFORE INSERT OR UPDATE ON agent_action
    FOR EACH ROW EXECUTE FUNCTION guard_agent_action();
"""
# the rows outbox's benchmark loads (`bench.harness.bulk_admit`): a no-op kind, each action in its own lane
SPEC_PRELOAD = """
INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
SELECT 'TEST_NOOP', 1, 'lane-' || g, 'lane-job-' || g, %(payload)s::jsonb, 5, 'ADMITTED'
  FROM generate_series(1, %(count)s) AS g
"""
# A lane head: an ADMITTED action, due and not expired, with no executing action in its lane and no earlier
# action of its lane that has not started. Two claimers never take one lane: SKIP LOCKED leaves a head another
# claim holds, whose lane's later actions still see it unstarted; the unique lane index refuses the rest.
SPEC_CLAIM = """
WITH heads AS MATERIALIZED (
    SELECT a.id FROM agent_action AS a
     WHERE a.state = 'ADMITTED' AND a.due_at <= now() AND (a.expires_at IS NULL OR a.expires_at > now())
       AND NOT EXISTS (SELECT 1 FROM agent_action AS x WHERE x.lane_key = a.lane_key AND x.state = 'EXECUTING')
       AND NOT EXISTS (SELECT 1 FROM agent_action AS p
                        WHERE p.lane_key = a.lane_key AND p.state IN ('PROPOSED', 'ADMITTED') AND p.id < a.id)
     ORDER BY a.due_at, a.id
     LIMIT %s
     FOR UPDATE SKIP LOCKED
)
UPDATE agent_action AS a
   SET state = 'EXECUTING', epoch = a.epoch + 1, attempt = a.attempt + 1,
       lease_expires_at = now() + interval '300 s'
  FROM heads WHERE a.id = heads.id
RETURNING a.id, a.epoch, a.kind, a.lane_key, a.idempotency_key, a.workspace_id, a.payload, a.attempt,
          a.max_attempts, a.write_started_at
"""
SPEC_FENCE = """
UPDATE agent_action AS a SET write_started_at = now()
  FROM unnest(%s::bigint[], %s::bigint[]) AS f (id, epoch)
 WHERE a.id = f.id AND a.epoch = f.epoch AND a.state = 'EXECUTING'
   AND a.lease_expires_at >= now() + interval '60 s'
RETURNING a.id, a.epoch
"""
# the guard stamps ended_at and clears the payload and the lease
SPEC_FINISH = """
UPDATE agent_action AS a SET state = 'DONE', stop_reason = 'CONFIRMED', readback_ref = 'noop'
  FROM unnest(%s::bigint[], %s::bigint[]) AS f (id, epoch)
 WHERE a.id = f.id AND a.epoch = f.epoch AND a.state = 'EXECUTING'
"""

STATEMENTS = {
    "minimal": (CLAIM, FENCE, FINISH),
    "lifecycle": (CLAIM, FENCE, FINISH),
    "contract-minimal": (SPEC_CLAIM, SPEC_FENCE, SPEC_FINISH),
}

Result = tuple[int, int, int, float]


def create_minimal(url: str, preload: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CREATE)
        if preload:
            conn.execute(PRELOAD, {"count": preload})
            conn.execute("VACUUM ANALYZE job")


def create_spec(url: str, preload: int, payload: str = "{}") -> None:
    """The contract-minimal table with `preload` ADMITTED actions (each in its own lane) carrying `payload`."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SPEC_CREATE)
        conn.execute(SPEC_PRELOAD, {"count": preload, "payload": payload})
        conn.execute("VACUUM ANALYZE agent_action")


def backend_cpu_seconds(pid: int) -> float:
    """User and system CPU of one server process (`/proc/<pid>/stat`, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loop(url: str, variant: str, seconds: float | None, statements: tuple[str, str, str] | None = None) -> Result:
    """claim ─▶ fence (the claimed) ─▶ finish (the fenced), each its own transaction, BATCH at a time;
    `statements` replace the variant's (`bench.sql_cost` runs plain statements on outbox's schema this way)."""
    claim, fence, finish = statements or STATEMENTS[variant]
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        backend = conn.info.backend_pid
        cpu0 = backend_cpu_seconds(backend)
        start = time.monotonic_ns()
        deadline = start + int((seconds or 1e9) * 1e9)
        while time.monotonic_ns() < deadline:
            if variant == "lifecycle":
                for i in range(BATCH):
                    conn.execute(INSERT, (f"lane-{done + i}",))
            rows = conn.execute(claim, (BATCH,)).fetchall()
            if not rows:
                break
            fenced = conn.execute(fence, ([r[0] for r in rows], [r[1] for r in rows])).fetchall()
            conn.execute(finish, ([r[0] for r in fenced], [r[1] for r in fenced]))
            done += len(fenced)
        end = time.monotonic_ns()
        return done, start, end, backend_cpu_seconds(backend) - cpu0


def schema(url: str, commit: TextClause | None = None) -> Result:
    """outbox's claim (`ExecutorStore.claim`) and group commit (`ExecutorStore.commit`), fences then results, on
    its own schema; `commit` replaces COMMIT_WRITES (`bench.sql_cost` runs its variants this way)."""
    return asyncio.run(_schema(url, commit))


async def _schema(url: str, commit: TextClause | None) -> Result:
    import bench.kinds  # noqa: F401  (registers the kinds the claimed rows name)
    from outbox.executor import store as executor_store
    from outbox.executor.claimed import AttemptReport, FinishWrite
    from outbox.executor.store import ExecutorStore, Write

    if commit is not None:  # the variant's group commit, run by ExecutorStore.commit as outbox's own is
        setattr(executor_store, "COMMIT_WRITES", commit)  # noqa: B010 (a name the module imported, replaced)
    store = ExecutorStore(url)  # the libpq URL the loops take
    conn = await store._connection()
    backend = conn.info.backend_pid
    cpu0 = backend_cpu_seconds(backend)
    report = AttemptReport("DONE", 0.001, 0.01)
    finish = FinishWrite("DONE", "CONFIRMED", readback_ref="noop")
    done = 0
    start = time.monotonic_ns()
    while claimed := await store.claim(BATCH, 300, ["TEST_NOOP"]):
        for writes in ([Write(a) for a in claimed], [Write(a, report, finish) for a in claimed]):
            await store.commit(writes, 60.0)
        done += len(claimed)
    end = time.monotonic_ns()
    cpu = backend_cpu_seconds(backend) - cpu0
    await store.close()
    return done, start, end, cpu


def write_result(path: Path, result: Result) -> None:
    path.write_text(" ".join(str(v) for v in result) + "\n")


def read_result(path: Path) -> Result:
    jobs, start, end, cpu = path.read_text().split()
    return int(jobs), int(start), int(end), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant", choices=[*STATEMENTS, "schema"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.variant == "schema":
        result = schema(args.url)
    else:
        result = loop(args.url, args.variant, args.seconds if args.variant == "lifecycle" else None)
    write_result(Path(args.out), result)


if __name__ == "__main__":
    main()
