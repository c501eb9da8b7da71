"""Every statement that writes `agent_action` and `agent_lane`, or that the executor runs, named for what it does.

Callers bind parameters by name; nothing else in outbox writes SQL against these tables (the schema lives
in `migrations/`, the operators' read-only views in `store_ops`). The executor's and the purge's statements
take their rows with SKIP LOCKED, so they never wait on a caller's open transaction: they try again later.
"""

from __future__ import annotations

from sqlalchemy import TextClause, text

NOTIFY_CHANNEL = "outbox_action"

ACTION_COLUMNS = (
    "id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, max_attempts,"
    " expires_at, state, attempt, epoch, due_at, lease_expires_at, write_started_at, stop_reason,"
    " readback_ref, created_at, ended_at, last_error, trace"
)

# ---- enqueue and proposals ----------------------------------------------------------------------

DATABASE_NOW = text("SELECT clock_timestamp() AS now")

# A repeated idempotency key inserts nothing; a racing duplicate waits for the first to commit.
INSERT_ACTION = text(f"""
WITH inserted AS (
    INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,
                              subject_account_id, max_attempts, expires_at, state)
    VALUES (:kind, :workspace_id, :lane_key, :idempotency_key, CAST(:payload AS jsonb),
            :subject_account_id, :max_attempts, :expires_at, :state)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING {ACTION_COLUMNS}
)
SELECT * FROM inserted
""")

SELECT_ACTION_BY_KEY = text(f"SELECT {ACTION_COLUMNS} FROM agent_action WHERE idempotency_key = :key")
SELECT_ACTION = text(f"SELECT {ACTION_COLUMNS} FROM agent_action WHERE id = :id")


def decide_pending(to_state: str, stop_reason: str | None, from_states: tuple[str, ...]) -> TextClause:
    """Move one action that has not started; returns the row only when it was in `from_states`."""
    return text(f"""
UPDATE agent_action SET state = '{to_state}', stop_reason = {_literal(stop_reason)}
 WHERE id = :id AND state IN ({", ".join(_literal(s) for s in from_states)})
RETURNING {ACTION_COLUMNS}
""")


def _literal(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


ADMIT_PROPOSAL = decide_pending("ADMITTED", None, ("PROPOSED",))
REFUSE_PROPOSAL = decide_pending("CANCELLED", "PROPOSAL_REFUSED", ("PROPOSED",))
CANCEL_UNSTARTED = decide_pending("CANCELLED", "OPERATOR_CANCELLED", ("PROPOSED", "ADMITTED"))

# ---- the executor --------------------------------------------------------------------------------

CLAIMED_COLUMNS = (
    "a.id, a.kind, a.lane_key, a.idempotency_key, a.workspace_id, a.subject_account_id, a.payload, a.attempt,"
    " a.max_attempts,"
    " a.epoch, a.write_started_at, a.due_at, a.lease_expires_at,"
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
    -- one primary-key probe per ready lane, whatever the statistics say
    SELECT h.id FROM ready AS r
     CROSS JOIN LATERAL (
        SELECT a.id FROM agent_action AS a
         WHERE a.id = r.head_id AND a.state = 'ADMITTED' AND a.due_at <= now()
           AND a.kind = ANY (CAST(:kinds AS text[])) AND (a.expires_at IS NULL OR a.expires_at > now())
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

# First in every executor transaction: how long it may sit idle while it holds row locks. A frozen
# process (SIGSTOP, a stalled VM, a debugger) or a vanished host would otherwise keep its lane and action
# rows locked, and an application's enqueue into that lane would wait for as long; past this the server
# ends the session, its locks go, and the executor sees a lost connection and tries again.
BOUND_IDLE_IN_TRANSACTION = text("SELECT set_config('idle_in_transaction_session_timeout', CAST(:ms AS text), true)")

# The rows of a group commit that this transaction can hold now; the rest are tried in the next one.
LOCK_ACTIONS = text("SELECT id, epoch, state FROM agent_action WHERE id = ANY (:ids) FOR UPDATE SKIP LOCKED")
LOCK_LANES = text("SELECT lane_key FROM agent_lane WHERE lane_key = ANY (:lanes) FOR UPDATE SKIP LOCKED")
EXISTING_ACTIONS = text("SELECT id FROM agent_action WHERE id = ANY (:ids)")

# What finds an action at its provider once its payload is gone, set by its adapter before its fence under
# the claim's epoch (migration 0006); a newer claim or an erasure leaves it unset, and the fence then refuses.
NOTE_TRACE = text("""
UPDATE agent_action SET trace = CAST(:trace AS jsonb)
 WHERE id = :id AND epoch = :epoch AND state = 'EXECUTING'
""")

# The fence: write_started_at, under the claim's epoch, while at least the write window of the lease is left.
BEGIN_WRITES = text("""
UPDATE agent_action AS a SET write_started_at = now()
  FROM unnest(CAST(:ids AS bigint[]), CAST(:epochs AS bigint[])) AS f (id, epoch)
 WHERE a.id = f.id AND a.epoch = f.epoch AND a.state = 'EXECUTING'
   AND a.lease_expires_at >= now() + make_interval(secs => :window_seconds)
RETURNING a.id
""")

# Every result of an attempt, each named by its claim's epoch. `fence`: keep, clear, or restore the
# value the attempt found at its claim (a deferral writes nothing, so an earlier write stays known).
# `last_error`: the result's reason; a result without one keeps the earlier reason, DONE clears it.
FINISH_ATTEMPTS = text("""
UPDATE agent_action AS a
   SET state = f.state,
       stop_reason = f.stop_reason,
       readback_ref = coalesce(f.readback_ref, a.readback_ref),
       last_error = CASE WHEN f.state = 'DONE' THEN NULL ELSE coalesce(f.last_error, a.last_error) END,
       due_at = CASE WHEN f.state = 'ADMITTED' THEN now() + make_interval(secs => f.delay) ELSE a.due_at END,
       attempt = a.attempt - f.uncount,
       write_started_at = CASE f.fence WHEN 'clear' THEN NULL WHEN 'restore' THEN f.prior_write
                                       ELSE a.write_started_at END
  FROM unnest(CAST(:ids AS bigint[]), CAST(:epochs AS bigint[]), CAST(:states AS text[]),
              CAST(:stop_reasons AS text[]), CAST(:readback_refs AS text[]), CAST(:delays AS float8[]),
              CAST(:uncounts AS int[]), CAST(:fences AS text[]), CAST(:prior_writes AS timestamptz[]),
              CAST(:last_errors AS text[]))
       AS f (id, epoch, state, stop_reason, readback_ref, delay, uncount, fence, prior_write, last_error)
 WHERE a.id = f.id AND a.epoch = f.epoch AND a.state = 'EXECUTING'
RETURNING a.id
""")

# ---- metrics ------------------------------------------------------------------------------------------

# Tallies are only added here; the committer and the purge merge them (`store_metrics.merge_tallies`), so a
# counter never goes backwards and the exporter only reads.
ADD_ATTEMPT_TALLIES = text("""
INSERT INTO agent_action_attempt_tally (kind, result, recorded, n)
SELECT * FROM unnest(CAST(:kinds AS text[]), CAST(:results AS text[]), CAST(:recorded AS boolean[]),
                     CAST(:counts AS bigint[]))
""")
ADD_LATENCY_TALLIES = text("""
INSERT INTO agent_action_latency_tally (kind, metric, le, n, total)
SELECT * FROM unnest(CAST(:kinds AS text[]), CAST(:metrics AS text[]), CAST(:les AS float8[]),
                     CAST(:counts AS bigint[]), CAST(:totals AS float8[]))
""")

# ---- tests and operators ----------------------------------------------------------------------------

MAKE_WAITING_DUE = text("UPDATE agent_action SET due_at = now() WHERE state = 'ADMITTED' AND due_at > now()")
COUNT_DUE = text("""
SELECT count(*) FROM agent_lane WHERE ready_at <= now()
""")
COUNT_EXPIRED_LEASES = text("SELECT count(*) FROM agent_action WHERE state = 'EXECUTING' AND lease_expires_at <= now()")


# ---- retention and erasure ---------------------------------------------------------------------------

# One batch of the purge: the oldest ended actions from :after up to :cutoff, walked on the partial index
# ix_agent_action_ended. Starting where the last batch stopped skips the index entries of rows already
# deleted, which VACUUM cannot clear while some old snapshot is open. SKIP LOCKED lets purges on several
# replicas take disjoint batches; the ids go to the DELETE as an array, so each row is found by primary key
# whatever the statistics say. Ended rows belong to no lane, so the lane trigger has nothing to recompute.
PURGE_ENDED_BATCH = text("""
WITH batch AS MATERIALIZED (
    SELECT id, ended_at FROM agent_action
     WHERE ended_at >= :after AND ended_at < :cutoff
     ORDER BY ended_at
     LIMIT :batch_size
     FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM agent_action WHERE id = ANY (ARRAY(SELECT id FROM batch)) RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT max(ended_at) FROM batch) AS last_ended_at
""")
COUNT_PURGEABLE = text("SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL AND ended_at < :cutoff")

# Every action whose subject is the account, in any state; the lane trigger recomputes the lanes of
# the pending and executing ones under their lane locks.
ERASE_ACCOUNT = text("""
WITH gone AS (DELETE FROM agent_action WHERE subject_account_id = :account_id RETURNING 1)
SELECT count(*) AS erased FROM gone
""")
