"""Every statement that reads or writes `agent_action` and `agent_lane`, named for what it does.

Callers bind parameters by name; nothing else in outbox writes SQL against these tables (the schema
itself lives in `migrations/`). Statements the executor runs take their rows with SKIP LOCKED, so an
executor never waits on a caller's open transaction: what it could not lock it tries again.
"""

from __future__ import annotations

from sqlalchemy import TextClause, text

NOTIFY_CHANNEL = "outbox_action"

ACTION_COLUMNS = (
    "id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, max_attempts,"
    " expires_at, state, attempt, epoch, due_at, lease_expires_at, write_started_at, stop_reason,"
    " readback_ref, created_at, ended_at"
)

# ---- enqueue and proposals ----------------------------------------------------------------------

DATABASE_NOW = text("SELECT clock_timestamp()")

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
SELECT inserted.* FROM inserted
LEFT JOIN LATERAL (SELECT pg_notify('{NOTIFY_CHANNEL}', '') WHERE inserted.state = 'ADMITTED') AS wake ON true
""")

SELECT_ACTION_BY_KEY = text(f"SELECT {ACTION_COLUMNS} FROM agent_action WHERE idempotency_key = :key")
SELECT_ACTION = text(f"SELECT {ACTION_COLUMNS} FROM agent_action WHERE id = :id")


def decide_pending(to_state: str, stop_reason: str | None, from_states: tuple[str, ...]) -> TextClause:
    """Move one action that has not started; returns the row only when it was in `from_states`."""
    wake = f", pg_notify('{NOTIFY_CHANNEL}', '')" if to_state == "ADMITTED" else ""
    return text(f"""
UPDATE agent_action SET state = '{to_state}', stop_reason = {_literal(stop_reason)}
 WHERE id = :id AND state IN ({", ".join(_literal(s) for s in from_states)})
RETURNING {ACTION_COLUMNS}{wake}
""")


def _literal(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


ADMIT_PROPOSAL = decide_pending("ADMITTED", None, ("PROPOSED",))
REFUSE_PROPOSAL = decide_pending("CANCELLED", "PROPOSAL_REFUSED", ("PROPOSED",))
