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

# What finds an action at its provider once its payload is gone, set by its adapter before its fence under
# the claim's epoch (migration 0006); a newer claim or an erasure leaves it unset, and the fence then refuses.
NOTE_TRACE = text("""
UPDATE agent_action SET trace = CAST(:trace AS jsonb)
 WHERE id = :id AND epoch = :epoch AND state = 'EXECUTING'
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
