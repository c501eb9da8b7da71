"""Enqueue an action inside the caller's transaction, decide an agent's proposal, cancel what has not started.

    ActionRequest --validate--> ValidRequest --INSERT ... ON CONFLICT DO NOTHING--> agent_action
                                                     | nothing inserted: the key exists
                                                     v
                                      SELECT by idempotency key (a new snapshot sees the winner)

The caller owns the transaction: outbox never commits or rolls back, so the action exists exactly when
the caller's change commits. Sync (`Connection`, `Session`) and async (`AsyncConnection`,
`AsyncSession`) functions mirror each other by name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from outbox import store
from outbox.action import Action
from outbox.errors import ActionNotFound, InvalidRequest, TransitionRefused
from outbox.requests import ActionRequest, ValidRequest, validate

SyncConnection = Connection | Session
AsyncConn = AsyncConnection | AsyncSession


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
        _check_not_expired(valid, conn.execute(store.DATABASE_NOW).scalar_one())
    row = conn.execute(store.INSERT_ACTION, _insert_params(valid)).mappings().first()
    if row is None:
        row = conn.execute(store.SELECT_ACTION_BY_KEY, {"key": valid.idempotency_key}).mappings().one()
    return Action.from_row(row)


async def enqueue_async(conn: AsyncConn, request: ActionRequest) -> Action:
    """`enqueue` for an `AsyncConnection` or `AsyncSession`."""
    valid = validate(request)
    if valid.expires_at is not None:
        _check_not_expired(valid, (await conn.execute(store.DATABASE_NOW)).scalar_one())
    row = (await conn.execute(store.INSERT_ACTION, _insert_params(valid))).mappings().first()
    if row is None:
        result = await conn.execute(store.SELECT_ACTION_BY_KEY, {"key": valid.idempotency_key})
        row = result.mappings().one()
    return Action.from_row(row)


def _decide(conn: SyncConnection, statement: TextClause, action_id: int, wanted: str) -> Action:
    row = conn.execute(statement, {"id": action_id}).mappings().first()
    if row is not None:
        return Action.from_row(row)
    current = conn.execute(store.SELECT_ACTION, {"id": action_id}).mappings().first()
    if current is None:
        raise ActionNotFound(action_id)
    raise TransitionRefused(action_id, current["state"], wanted)


def admit(conn: SyncConnection, action_id: int) -> Action:
    """Admit a PROPOSED action: it becomes ADMITTED and waits its turn in its lane."""
    return _decide(conn, store.ADMIT_PROPOSAL, action_id, "ADMITTED")


def refuse(conn: SyncConnection, action_id: int) -> Action:
    """Refuse a PROPOSED action: it ends CANCELLED with PROPOSAL_REFUSED."""
    return _decide(conn, store.REFUSE_PROPOSAL, action_id, "CANCELLED")


def cancel(conn: SyncConnection, action_id: int) -> Action:
    """Cancel an action that has not started (PROPOSED or ADMITTED): it ends CANCELLED with OPERATOR_CANCELLED."""
    return _decide(conn, store.CANCEL_UNSTARTED, action_id, "CANCELLED")
