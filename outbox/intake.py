"""Enqueue an action inside the caller's transaction, decide an agent's proposal, cancel what has not started.

    ActionRequest --validate--> ValidRequest --INSERT ... ON CONFLICT DO NOTHING--> agent_action
                                                     | nothing inserted: the key exists
                                                     v
                                      SELECT by idempotency key (a new snapshot sees the winner)

The caller owns the transaction: outbox never commits or rolls back, so the action exists exactly when
the caller's change commits. Sync (SQLAlchemy `Connection`, `Session`, a psycopg `Connection`) and async
(`AsyncConnection`, `AsyncSession`, a psycopg `AsyncConnection`) functions mirror each other by name;
`outbox.caller` runs the statements on whichever the caller holds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import TextClause

from outbox import store
from outbox.action import Action
from outbox.caller import AsyncConn, SyncConnection, fetch, fetch_async
from outbox.errors import ActionNotFound, InvalidRequest, TransitionRefused
from outbox.requests import ActionRequest, ValidRequest, validate


def _insert_params(valid: ValidRequest) -> dict[str, Any]:
    return {
        "kind": valid.kind.name,
        "workspace_id": valid.workspace_id,
        "lane_key": valid.lane_key,
        "idempotency_key": valid.idempotency_key,
        "payload": valid.payload_json,
        "subject_account_id": valid.subject_account_id,
        "max_attempts": valid.max_attempts,
        "expires_at": valid.expires_at,
        "state": valid.state,
    }


def _check_not_expired(valid: ValidRequest, database_now: datetime) -> None:
    if valid.expires_at is not None and valid.expires_at <= database_now:
        raise InvalidRequest(
            "expires_at",
            f"{valid.expires_at.isoformat()} has already passed (database clock {database_now.isoformat()})",
        )


def enqueue(conn: SyncConnection, request: ActionRequest) -> Action:
    """Insert the action in the caller's transaction; return it, or the first one with the same key."""
    valid = validate(request)
    if valid.expires_at is not None:
        _check_not_expired(valid, fetch(conn, store.DATABASE_NOW, {})[0]["now"])
    rows = fetch(conn, store.INSERT_ACTION, _insert_params(valid))
    if not rows:
        rows = fetch(conn, store.SELECT_ACTION_BY_KEY, {"key": valid.idempotency_key})
    return Action.from_row(rows[0])


async def enqueue_async(conn: AsyncConn, request: ActionRequest) -> Action:
    """`enqueue` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    valid = validate(request)
    if valid.expires_at is not None:
        _check_not_expired(valid, (await fetch_async(conn, store.DATABASE_NOW, {}))[0]["now"])
    rows = await fetch_async(conn, store.INSERT_ACTION, _insert_params(valid))
    if not rows:
        rows = await fetch_async(conn, store.SELECT_ACTION_BY_KEY, {"key": valid.idempotency_key})
    return Action.from_row(rows[0])


def _decide(conn: SyncConnection, statement: TextClause, action_id: int, wanted: str) -> Action:
    rows = fetch(conn, statement, {"id": action_id})
    if rows:
        return Action.from_row(rows[0])
    current = fetch(conn, store.SELECT_ACTION, {"id": action_id})
    if not current:
        raise ActionNotFound(action_id)
    raise TransitionRefused(action_id, current[0]["state"], wanted)


def admit(conn: SyncConnection, action_id: int) -> Action:
    """Admit a PROPOSED action: it becomes ADMITTED and waits its turn in its lane."""
    return _decide(conn, store.ADMIT_PROPOSAL, action_id, "ADMITTED")


def refuse(conn: SyncConnection, action_id: int) -> Action:
    """Refuse a PROPOSED action: it ends CANCELLED with PROPOSAL_REFUSED."""
    return _decide(conn, store.REFUSE_PROPOSAL, action_id, "CANCELLED")


def cancel(conn: SyncConnection, action_id: int) -> Action:
    """Cancel an action that has not started (PROPOSED or ADMITTED): it ends CANCELLED with OPERATOR_CANCELLED."""
    return _decide(conn, store.CANCEL_UNSTARTED, action_id, "CANCELLED")
