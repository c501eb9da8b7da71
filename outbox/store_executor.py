"""The executor's statements and the typed calls that run them: claim, sweep, and the group commit.

    Executor ──claim(limit)──────────────▶ CLAIM_READY_HEADS          ─▶ list[ClaimedAction]
             ──sweep(...)────────────────▶ BEAT, EXPIRE_UNSTARTED,
                                           TAKE_BACK_EXPIRED_LEASES   ─▶ Sweep (ended, claimed again)
    Committer ──commit(writes)───────────▶ COMMIT_WRITES              ─▶ one WriteOutcome per write

Every call is one statement in a transaction of its own (the connection is in autocommit), so no executor
transaction ever sits idle holding row locks: a frozen executor (SIGSTOP, a stalled VM) holds nothing, and
an application's enqueue into its lanes never waits for it. The parameters and the mapping of rows to
objects live here, beside the SQL, so a statement can be changed, measured and batched in one place.

The group commit is one statement for any mix of fences and results: it locks the rows it can (SKIP
LOCKED), and for a result the row of its lane too (the lane trigger recomputes it); it writes each fence
and result whose row still carries its claim's epoch, and adds the attempt and latency tallies of every
result it decided, in the same transaction as the results themselves. What another transaction holds is
reported as held and tried again in the next batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import TextClause, text

from outbox import store_metrics
from outbox.caller import psycopg_sql
from outbox.executor.claimed import AttemptReport, ClaimedAction, FinishWrite
from outbox.kinds import ActionKind

# Upper bounds (seconds) of the attempt duration and pickup delay histograms.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    math.inf,
)  # fmt: skip

CLAIMED_COLUMNS = (
    "a.id, a.kind, a.lane_key, a.idempotency_key, a.workspace_id, a.subject_account_id, a.payload, a.attempt,"
    " a.max_attempts,"
    " a.epoch, a.write_started_at, a.due_at,"
    " extract(epoch FROM a.lease_expires_at - now())::float8 AS lease_seconds,"
    " extract(epoch FROM now() - a.due_at)::float8 AS pickup_seconds"
)

# Due lane heads, many per round trip. The lane rows are locked with SKIP LOCKED, so two replicas never
# take one lane and neither waits; the CTEs are materialized so the LIMIT runs exactly once, and the
# heads are found by primary key from the ready lanes, never by scanning the actions that wait.
CLAIM_READY_HEADS = text(f"""
WITH ready AS MATERIALIZED (
    SELECT lane_key, head_id FROM agent_lane
     WHERE ready_at <= now()
     ORDER BY ready_at
     LIMIT :limit
     FOR UPDATE SKIP LOCKED
), heads AS MATERIALIZED (
    -- one primary-key probe per ready lane, whatever the statistics say: the head's other conditions are
    -- one expression (IS TRUE), which no index can serve, so the planner never walks the due actions
    -- (ix_agent_action_admitted_due) looking for the head
    SELECT h.id FROM ready AS r
     CROSS JOIN LATERAL (
        SELECT a.id FROM agent_action AS a
         WHERE a.id = r.head_id
           AND (a.state = 'ADMITTED' AND a.due_at <= now() AND a.kind = ANY (CAST(:kinds AS text[]))
                AND (a.expires_at IS NULL OR a.expires_at > now())) IS TRUE
           FOR UPDATE SKIP LOCKED
     ) AS h
)
UPDATE agent_action AS a
   SET state = 'EXECUTING', epoch = a.epoch + 1, attempt = a.attempt + 1,
       lease_expires_at = now() + make_interval(secs => :lease_seconds)
  FROM heads WHERE a.id = heads.id
RETURNING {CLAIMED_COLUMNS}
""")

# Executing actions whose lease expired. An at-most-once action whose write started ends UNCERTAIN;
# one at its last attempt ends FAILED (UNCERTAIN if its write started); every other is claimed again
# without waiting for its lane. Ending needs the lane row (SKIP LOCKED); a reclaim does not.
TAKE_BACK_EXPIRED_LEASES = text(f"""
WITH stale AS MATERIALIZED (
    SELECT id, lane_key,
           CASE WHEN write_started_at IS NOT NULL AND kind = ANY (CAST(:at_most_once AS text[]))
                    THEN 'UNCERTAIN'
                WHEN attempt >= max_attempts AND write_started_at IS NOT NULL THEN 'UNCERTAIN'
                WHEN attempt >= max_attempts THEN 'FAILED'
                ELSE 'EXECUTING' END AS next_state
      FROM agent_action
     WHERE state = 'EXECUTING' AND lease_expires_at <= now() AND kind = ANY (CAST(:kinds AS text[]))
     ORDER BY lease_expires_at
     LIMIT :limit
     FOR UPDATE SKIP LOCKED
), lanes AS MATERIALIZED (
    SELECT lane_key FROM agent_lane
     WHERE lane_key IN (SELECT lane_key FROM stale WHERE next_state <> 'EXECUTING')
     FOR UPDATE SKIP LOCKED
)
UPDATE agent_action AS a
   SET state = s.next_state,
       stop_reason = CASE s.next_state WHEN 'UNCERTAIN' THEN 'LEASE_LOST_AFTER_WRITE'
                                        WHEN 'FAILED' THEN 'ATTEMPTS_EXHAUSTED' END,
       epoch = a.epoch + (s.next_state = 'EXECUTING')::int,
       attempt = a.attempt + (s.next_state = 'EXECUTING')::int,
       lease_expires_at = CASE WHEN s.next_state = 'EXECUTING'
                               THEN now() + make_interval(secs => :lease_seconds) END
  FROM stale AS s
 WHERE a.id = s.id AND (s.next_state = 'EXECUTING' OR s.lane_key IN (SELECT lane_key FROM lanes))
RETURNING {CLAIMED_COLUMNS}, a.state, a.stop_reason, a.trace ->> 'notice' AS notice
""")

# Actions that expired before they started end CANCELLED / EXPIRED.
EXPIRE_UNSTARTED = text("""
WITH expired AS MATERIALIZED (
    SELECT id, lane_key FROM agent_action
     WHERE state IN ('PROPOSED', 'ADMITTED') AND expires_at IS NOT NULL AND expires_at <= now()
     ORDER BY expires_at
     LIMIT :limit
     FOR UPDATE SKIP LOCKED
), lanes AS MATERIALIZED (
    SELECT lane_key FROM agent_lane WHERE lane_key IN (SELECT lane_key FROM expired) FOR UPDATE SKIP LOCKED
)
UPDATE agent_action AS a SET state = 'CANCELLED', stop_reason = 'EXPIRED'
  FROM expired AS e
 WHERE a.id = e.id AND e.lane_key IN (SELECT lane_key FROM lanes)
RETURNING a.id, a.kind
""")

# The group commit: fences ('fence'), results ('finish') and results that write nothing ('none', tallied
# only), each named by its claim's epoch, in one statement.
#   fence:  write_started_at, while at least the write window of the lease is left
#   finish: the result's values. `fence`: keep, clear, or restore the value the attempt found at its claim
#           (a deferral writes nothing, so an earlier write stays known). `last_error`: the result's reason;
#           a result without one keeps the earlier reason, DONE clears it.
# Each write comes back with its outcome: written; held (its row, or for a result its lane's row, is locked
# by another transaction: try again); gone (erased); stale (another claim took it; with the row's epoch and
# state); short (a fence with less than the window left); none (nothing to write). The tallies count every
# result decided here (not the held ones), recorded or not.
# The writes as rows, from one JSON array of arrays (`:writes`, see `_write_row`): one parameter that Python
# encodes in C, however many writes. Read as a CTE where a hash join serves, and again in the result's UPDATE,
# where a function scan lets the planner probe agent_action by primary key for each write.
_WRITES = """(
    SELECT (e->>0)::bigint AS id, (e->>1)::bigint AS epoch, e->>2 AS op, e->>3 AS state, e->>4 AS stop_reason,
           e->>5 AS readback_ref, (e->>6)::float8 AS delay, (e->>7)::int AS uncount, e->>8 AS fence,
           (e->>9)::timestamptz AS prior_write, e->>10 AS last_error, e->>11 AS kind, e->>12 AS result,
           (e->>13)::float8 AS attempt_seconds, (e->>14)::float8 AS attempt_le, (e->>15)::float8 AS pickup_seconds,
           (e->>16)::float8 AS pickup_le
      FROM jsonb_array_elements(CAST(:writes AS jsonb)) AS e
    ) AS {alias}"""

COMMIT_WRITES = text(f"""
WITH w AS MATERIALIZED (
    SELECT * FROM {_WRITES.format(alias="w")}
), locked AS MATERIALIZED (
    SELECT id, epoch, state, lane_key,
           lease_expires_at >= now() + make_interval(secs => :window_seconds) AS has_window
      FROM agent_action
     WHERE id = ANY (ARRAY(SELECT id FROM w WHERE op <> 'none'))
     ORDER BY id
     FOR UPDATE SKIP LOCKED
), current AS MATERIALIZED (
    -- the writes whose row this statement holds, still under their epoch: nobody can change them now,
    -- so the updates below need no other condition (and find each row by primary key)
    SELECT w.id, w.op, l.lane_key, l.has_window FROM w JOIN locked AS l ON l.id = w.id
     WHERE l.epoch = w.epoch AND l.state = 'EXECUTING'
), lanes AS MATERIALIZED (
    -- a result recomputes its lane: hold the lane's row first (an EXECUTING action always has one)
    SELECT lane_key FROM agent_lane
     WHERE lane_key = ANY (ARRAY(SELECT lane_key FROM current WHERE op = 'finish'))
     ORDER BY lane_key
     FOR UPDATE SKIP LOCKED
), fenced AS (
    UPDATE agent_action AS a SET write_started_at = now()
     WHERE a.id = ANY (ARRAY(SELECT id FROM current WHERE op = 'fence' AND has_window))
    RETURNING a.id
), finished AS (
    UPDATE agent_action AS a
       SET state = f.state,
           stop_reason = f.stop_reason,
           readback_ref = coalesce(f.readback_ref, a.readback_ref),
           last_error = CASE WHEN f.state = 'DONE' THEN NULL ELSE coalesce(f.last_error, a.last_error) END,
           due_at = CASE WHEN f.state = 'ADMITTED' THEN now() + make_interval(secs => f.delay) ELSE a.due_at END,
           attempt = a.attempt - f.uncount,
           write_started_at = CASE f.fence WHEN 'clear' THEN NULL WHEN 'restore' THEN f.prior_write
                                           ELSE a.write_started_at END
      FROM {_WRITES.format(alias="f")}
     WHERE a.id = f.id
       AND f.id = ANY (ARRAY(SELECT id FROM current
                              WHERE op = 'finish' AND lane_key = ANY (ARRAY(SELECT lane_key FROM lanes))))
    RETURNING a.id
), decided AS MATERIALIZED (
    SELECT w.id, w.op, w.kind, w.result, w.attempt_seconds, w.attempt_le, w.pickup_seconds, w.pickup_le,
           l.epoch AS found_epoch, l.state AS found_state,
           CASE WHEN w.op = 'none' THEN 'none'
                WHEN w.id IN (SELECT id FROM fenced) OR w.id IN (SELECT id FROM finished) THEN 'written'
                WHEN l.id IS NULL AND EXISTS (SELECT 1 FROM agent_action AS e WHERE e.id = w.id) THEN 'held'
                WHEN l.id IS NULL THEN 'gone'
                WHEN l.epoch <> w.epoch OR l.state <> 'EXECUTING' THEN 'stale'
                WHEN w.op = 'finish' THEN 'held'
                ELSE 'short' END AS outcome
      FROM w LEFT JOIN locked AS l ON l.id = w.id
), tallied AS MATERIALIZED (
    SELECT * FROM decided WHERE op <> 'fence' AND outcome <> 'held'
), attempts AS (
    INSERT INTO agent_action_attempt_tally (kind, result, recorded, n)
    SELECT kind, result, outcome = 'written', count(*) FROM tallied GROUP BY kind, result, outcome = 'written'
), latencies AS (
    INSERT INTO agent_action_latency_tally (kind, metric, le, n, total)
    SELECT kind, 'attempt_duration', attempt_le, count(*), sum(attempt_seconds) FROM tallied
     GROUP BY kind, attempt_le
    UNION ALL
    SELECT kind, 'pickup_delay', pickup_le, count(*), sum(pickup_seconds) FROM tallied
     WHERE pickup_seconds IS NOT NULL GROUP BY kind, pickup_le
)
SELECT id, outcome, found_epoch, found_state FROM decided
""")


@dataclass(frozen=True)
class Write:
    """One write of the group commit: a fence (`report` None), or a result with the row values it writes
    (`finish`; None for a result that writes nothing, such as an abandoned attempt) and what it tallies."""

    action: ClaimedAction
    report: AttemptReport | None = None
    finish: FinishWrite | None = None


@dataclass(frozen=True)
class WriteOutcome:
    """What the group commit did with one write: `written`, `held`, `gone`, `stale` (with the epoch and
    state the row has now), `short` or `none`."""

    outcome: str
    found_epoch: int | None = None
    found_state: str | None = None


@dataclass(frozen=True)
class Sweep:
    """One sweep: the actions it ended (id, kind, state, stop reason, notice) and those it claimed again."""

    ended: list[tuple[int, str, str, str, str | None]]
    claimed_again: list[ClaimedAction]


def bucket(seconds: float) -> float:
    """The upper bound of the latency histogram bucket that `seconds` falls in."""
    return next(le for le in LATENCY_BUCKETS if seconds <= le)


class ExecutorStore:
    """The executor's statements, each a transaction of its own, on a connection this store holds.

    The connection is psycopg's own, opened from `url` (a libpq URL: `outbox.db.libpq_url` of the executor's
    engine, timeouts included) on first use, in autocommit, and kept: a claim or a group commit costs one
    round trip and no pool checkout. A lost connection raises psycopg's OperationalError (an own fault,
    `outbox.executor.committer.database_unavailable`) and is opened again by the next call.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, row_factory=namedtuple_row)
        return self._conn

    async def _rows(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        conn = await self._connection()
        try:
            cursor = await conn.execute(psycopg_sql(statement), params)
            return await cursor.fetchall() if cursor.description is not None else []
        except (psycopg.OperationalError, psycopg.InterfaceError):
            await self.close()
            raise

    async def claim(self, limit: int, lease_seconds: float, kinds: list[str]) -> list[ClaimedAction]:
        """Up to `limit` ready lane heads of `kinds`, claimed under a lease of `lease_seconds`."""
        rows = await self._rows(CLAIM_READY_HEADS, {"limit": limit, "lease_seconds": lease_seconds, "kinds": kinds})
        return [claimed_action(row, fresh=True) for row in rows]

    async def sweep(
        self, executor_id: str, free: int, lease_seconds: float, kinds: list[str], at_most_once: list[str]
    ) -> Sweep:
        """Beat; end what expired before it started; take back up to `free` expired leases."""
        await self._rows(store_metrics.BEAT, {"executor_id": executor_id})
        expired = await self._rows(EXPIRE_UNSTARTED, {"limit": 500})
        ended: list[tuple[int, str, str, str, str | None]] = [
            (row.id, row.kind, "CANCELLED", "EXPIRED", None) for row in expired
        ]
        params = {"limit": free, "lease_seconds": lease_seconds, "at_most_once": at_most_once, "kinds": kinds}
        again: list[ClaimedAction] = []
        for row in await self._rows(TAKE_BACK_EXPIRED_LEASES, params) if free > 0 else []:
            if row.state == "EXECUTING":
                again.append(claimed_action(row, fresh=False))
            else:
                ended.append((row.id, row.kind, row.state, row.stop_reason, row.notice))
        return Sweep(ended, again)

    async def leave(self, executor_id: str) -> None:
        """Remove this executor's heartbeat row."""
        await self._rows(store_metrics.LEAVE, {"executor_id": executor_id})

    async def commit(self, writes: Sequence[Write], window_seconds: float) -> list[WriteOutcome]:
        """The group commit of `writes` (one per action); one outcome per write, in order."""
        encoded = json.dumps([_write_row(write) for write in writes])
        rows = await self._rows(COMMIT_WRITES, {"writes": encoded, "window_seconds": window_seconds})
        found = {row.id: WriteOutcome(row.outcome, row.found_epoch, row.found_state) for row in rows}
        return [found[write.action.id] for write in writes]


def _write_row(write: Write) -> list[Any]:
    """One write as a row of `_WRITES`, in its column order (JSON has no infinity: the last bucket is text)."""
    action, report, finish = write.action, write.report, write.finish
    prior = action.prior_write_started_at.isoformat() if action.prior_write_started_at else None
    row: list[Any] = [action.id, action.epoch, "fence" if report is None else "none" if finish is None else "finish"]
    if finish is None:
        row += [None, None, None, None, None, None, prior, None]
    else:
        row += [
            finish.state,
            finish.stop_reason,
            finish.readback_ref,
            finish.delay_seconds,
            finish.uncount,
            finish.fence,
            prior,
            finish.last_error,
        ]
    row.append(action.kind.name)
    if report is None:
        row += [None, None, None, None, None]
    else:
        pickup = report.pickup_seconds
        row += [
            report.result,
            report.attempt_seconds,
            _json_bound(bucket(report.attempt_seconds)),
            pickup,
            _json_bound(bucket(pickup)) if pickup is not None else None,
        ]
    return row


def _json_bound(le: float) -> float | str:
    return le if le != math.inf else "Infinity"


def claimed_action(row: Any, *, fresh: bool) -> ClaimedAction:
    """A claimed row as the attempt sees it; `fresh` for a claim from its lane (not a reclaim after a lost
    lease, whose due time is long past and says nothing about pickup)."""
    return ClaimedAction(
        id=row.id,
        kind=ActionKind.get(row.kind),
        lane_key=row.lane_key,
        idempotency_key=row.idempotency_key,
        workspace_id=row.workspace_id,
        subject_account_id=row.subject_account_id,
        payload=row.payload,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        epoch=row.epoch,
        prior_write_started_at=row.write_started_at,
        due_at=row.due_at,
        lease_seconds=row.lease_seconds,
        pickup_seconds=max(0.0, row.pickup_seconds) if fresh else None,
    )
