"""The application's statements on the action store, and the typed queries that run them.

    outbox.intake, outbox.erasure ──store.insert_actions / decision / action / erase_account──▶ Query
    outbox.caller.run(conn, query) ──the statement on the caller's connection──▶ query.read(rows) ──▶ Action...

A `Query` holds one statement, its parameters and what its rows become, so a statement can be changed,
measured and batched here, and run on whichever connection the caller holds. Beside these: the retention
purge and the kinds' rows. The executor's statements live in `outbox.store_executor`, the metrics' in
`outbox.store_metrics`, the operators' read-only ones in `outbox.store_ops`; the schema in `migrations/`.
The executor's and the purge's statements take their rows with SKIP LOCKED, so they never wait on a
caller's open transaction: they try again later.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import TextClause, text

from outbox.action import Action
from outbox.requests import ValidRequest

T = TypeVar("T")

NOTIFY_CHANNEL = "outbox_action"

ACTION_COLUMNS = (
    "id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, max_attempts,"
    " expires_at, state, attempt, epoch, due_at, lease_expires_at, write_started_at, stop_reason,"
    " readback_ref, created_at, ended_at, last_error, trace"
)

# ---- enqueue and proposals ----------------------------------------------------------------------

DATABASE_NOW = text("SELECT clock_timestamp() AS now")
_NO_ACTION = ", ".join("NULL" for _ in ACTION_COLUMNS.split(","))

# Many actions in one statement, in the order given (a lane runs in id order). It inserts nothing when a kind
# of the batch has no row in agent_action_kind or a row that declares it otherwise than the code does
# (`:kinds`: each kind of the batch as the code declares it), nor when an expires_at has passed on the
# database clock; it returns why instead, as `refusal` rows (each such kind with its row, and the first such
# expiry). So neither the foreign key nor the guard refuses it, and the caller's transaction stays usable. A
# repeated idempotency key inserts nothing: the statement also returns the rows that held the key before it
# began (`created` false); a racing duplicate waits for the first to commit, and its row is read by
# `SELECT_ACTIONS_BY_KEY` (a new snapshot). ON CONFLICT names no index: an action that marked itself its idle
# lane's holder while another enqueue, not committed yet, did the same for that lane waits for it too and
# inserts nothing (ux_agent_action_lane_head); `outbox.intake` enqueues it again, behind that one. The
# refusals share one column, since every column of the result costs the caller's driver time on every enqueue.
# `:trace_context`: the enqueuing code's W3C trace context (outbox.tracing), one for the whole batch, or null.
INSERT_ACTIONS = text(f"""
WITH input AS MATERIALIZED (
    SELECT r->>0 AS kind, (r->>1)::bigint AS workspace_id, r->>2 AS lane_key, r->>3 AS idempotency_key,
           r->>4 AS payload, (r->>5)::bigint AS subject_account_id, (r->>6)::int AS max_attempts,
           (r->>7)::timestamptz AS expires_at, r->>8 AS state, r->>9 AS destination, position
      FROM jsonb_array_elements(CAST(:requests AS jsonb)) WITH ORDINALITY AS i (r, position)
), refused AS MATERIALIZED (
    SELECT jsonb_build_object('kind', d->>0, 'row', CASE WHEN k.name IS NOT NULL THEN jsonb_build_object(
               'at_most_once', k.at_most_once, 'instance_level', k.instance_level,
               'workspace_level', k.workspace_level) END) AS refusal
      FROM jsonb_array_elements(CAST(:kinds AS jsonb)) AS d
      LEFT JOIN agent_action_kind AS k ON k.name = d->>0
     WHERE (k.at_most_once, k.instance_level, k.workspace_level)
           IS DISTINCT FROM ((d->>1)::boolean, (d->>2)::boolean, (d->>3)::boolean)
    UNION ALL
    (SELECT jsonb_build_object('expired_position', position, 'database_now', clock_timestamp()) FROM input
      WHERE expires_at <= clock_timestamp() ORDER BY position LIMIT 1)
), inserted AS (
    INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,
                              subject_account_id, max_attempts, expires_at, state, trace_context, destination)
    SELECT kind, workspace_id, lane_key, idempotency_key, CAST(payload AS jsonb),
           subject_account_id, max_attempts, expires_at, state, CAST(:trace_context AS jsonb), destination
      FROM input WHERE NOT EXISTS (SELECT FROM refused) ORDER BY position
    ON CONFLICT DO NOTHING
    RETURNING {ACTION_COLUMNS}
)
SELECT true AS created, NULL::jsonb AS refusal, {ACTION_COLUMNS} FROM inserted
UNION ALL
SELECT false, NULL, {ACTION_COLUMNS} FROM agent_action
 WHERE idempotency_key = ANY (ARRAY(SELECT idempotency_key FROM input)) AND NOT EXISTS (SELECT FROM refused)
UNION ALL
SELECT NULL, refusal, {_NO_ACTION} FROM refused
""")
SELECT_ACTIONS_BY_KEY = text(
    f"SELECT {ACTION_COLUMNS} FROM agent_action WHERE idempotency_key = ANY (CAST(:keys AS text[]))"
)


@dataclass(frozen=True)
class Query(Generic[T]):
    """One statement, its parameters, and what its rows become: run by `outbox.caller` on the caller's
    connection, whichever library holds it."""

    statement: TextClause
    params: Mapping[str, Any]
    read: Callable[[list[dict[str, Any]]], T]


@dataclass(frozen=True)
class Inserted:
    """What INSERT_ACTIONS found: the actions by idempotency key (inserted now, or there before); or, when it
    inserted nothing, the kinds whose row in agent_action_kind is missing (None) or declares them otherwise
    (the row's three flags), and the position (from 0) of the first request whose expires_at had passed,
    with the database's clock."""

    by_key: dict[str, Action]
    undeclared_kinds: dict[str, dict[str, bool] | None] = field(default_factory=dict)
    expired: tuple[int, datetime] | None = None


def insert_actions(requests: Sequence[ValidRequest], trace_context: str | None = None) -> Query[Inserted]:
    """The actions of `requests`, in their order, in one statement (see INSERT_ACTIONS); `trace_context`: the
    JSON text each new action keeps as its trace_context."""
    rows = [
        [
            r.kind.name,
            r.workspace_id,
            r.lane_key,
            r.idempotency_key,
            r.payload_json,
            r.subject_account_id,
            r.max_attempts,
            r.expires_at.isoformat() if r.expires_at is not None else None,
            r.state,
            r.destination,
        ]
        for r in requests
    ]
    kinds = [[k.name, k.at_most_once, k.instance_level, k.workspace_level] for k in {r.kind for r in requests}]
    # one JSON parameter, however many requests: Python encodes it in C
    params = {"requests": json.dumps(rows), "kinds": json.dumps(kinds), "trace_context": trace_context}
    return Query(INSERT_ACTIONS, params, _inserted)


def _inserted(rows: list[dict[str, Any]]) -> Inserted:
    by_key: dict[str, Action] = {}
    refusals = []
    for row in rows:
        if row["refusal"] is None:
            by_key[row["idempotency_key"]] = Action.from_row(row, created=row["created"])
        else:
            refusals.append(row["refusal"])
    return _refused(refusals) if refusals else Inserted(by_key)


def _refused(refusals: list[dict[str, Any]]) -> Inserted:
    undeclared = {r["kind"]: r["row"] for r in refusals if "kind" in r}
    expired = [
        (r["expired_position"] - 1, datetime.fromisoformat(r["database_now"])) for r in refusals if "kind" not in r
    ]
    return Inserted({}, undeclared, expired[0] if expired else None)


def actions_by_key(keys: Sequence[str]) -> Query[dict[str, Action]]:
    """The actions that hold `keys` (none created by this call), read in a new snapshot: after a racing
    duplicate committed, or for a request that will not be inserted."""
    return Query(SELECT_ACTIONS_BY_KEY, {"keys": list(keys)}, _by_key)


def _by_key(rows: list[dict[str, Any]]) -> dict[str, Action]:
    return {row["idempotency_key"]: Action.from_row(row, created=False) for row in rows}


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


def first_action(rows: list[dict[str, Any]]) -> Action | None:
    return Action.from_row(rows[0]) if rows else None


def decision(statement: TextClause, action_id: int) -> Query[Action | None]:
    """One of the decisions below on one action: the action as it became, or None when it was not in a
    state the decision applies to (or does not exist)."""
    return Query(statement, {"id": action_id}, first_action)


def action(action_id: int) -> Query[Action | None]:
    """The action with this id, or None."""
    return Query(SELECT_ACTION, {"id": action_id}, first_action)


ADMIT_PROPOSAL = decide_pending("ADMITTED", None, ("PROPOSED",))
REFUSE_PROPOSAL = decide_pending("CANCELLED", "PROPOSAL_REFUSED", ("PROPOSED",))
CANCEL_UNSTARTED = decide_pending("CANCELLED", "OPERATOR_CANCELLED", ("PROPOSED", "ADMITTED"))

# ---- retention and erasure ---------------------------------------------------------------------------

# One batch of the purge: the oldest ended actions from :after up to :cutoff, walked on the partial index
# ix_agent_action_ended. Starting where the last batch stopped skips the index entries of rows already
# deleted, which VACUUM cannot clear while some old snapshot is open. SKIP LOCKED lets purges on several
# replicas take disjoint batches; the ids go to the DELETE as an array, so each row is found by primary key
# whatever the statistics say. Ended rows hold no lane (lane_head is false): the delete trigger passes none on.
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

# Every action whose subject is the account, in any state; the delete trigger passes each lane whose holder
# it deleted to the lane's next action.
ERASE_ACCOUNT = text("""
WITH gone AS (DELETE FROM agent_action WHERE subject_account_id = :account_id RETURNING 1)
SELECT count(*) AS erased FROM gone
""")


def erase_account(account_id: int) -> Query[int]:
    """Delete every action of the account; how many there were."""
    return Query(ERASE_ACCOUNT, {"account_id": account_id}, lambda rows: int(rows[0]["erased"]))


# ---- kinds -----------------------------------------------------------------------------------------

SELECT_KINDS = text("SELECT name, at_most_once, instance_level, workspace_level FROM agent_action_kind")
# a row that already says the same is left alone, so a repeated install writes nothing
UPSERT_KIND = text("""
INSERT INTO agent_action_kind AS k (name, at_most_once, instance_level, workspace_level)
VALUES (:name, :at_most_once, :instance_level, :workspace_level)
ON CONFLICT (name) DO UPDATE
   SET at_most_once = excluded.at_most_once, instance_level = excluded.instance_level,
       workspace_level = excluded.workspace_level
 WHERE (k.at_most_once, k.instance_level, k.workspace_level)
       IS DISTINCT FROM (excluded.at_most_once, excluded.instance_level, excluded.workspace_level)
""")
