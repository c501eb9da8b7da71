"""Enqueue an action inside the caller's transaction, decide an agent's proposal, cancel what has not started.

    ActionRequest(s) --validate each--> ValidRequest(s) --one INSERT ... ON CONFLICT DO NOTHING--> agent_action
                                   (it also returns the rows that held a key before it began)
                                                     | a key neither inserted nor seen: a racing duplicate
                                                     v
                                      SELECT by idempotency key (a new snapshot sees the winner)

`enqueue` and `enqueue_many` run the same statement: one round trip for one action or a batch, an expiry
checked on the database clock inside it.

The caller owns the transaction: outbox never commits or rolls back, so the action exists exactly when
the caller's change commits. Sync (SQLAlchemy `Connection`, `Session`, a psycopg `Connection`) and async
(`AsyncConnection`, `AsyncSession`, a psycopg `AsyncConnection`) functions mirror each other by name;
`outbox.caller` runs the statements on whichever the caller holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import TextClause

from outbox import store
from outbox.action import Action
from outbox.caller import AsyncConn, SyncConnection, run, run_async
from outbox.errors import ActionNotFound, InvalidRequest, TransitionRefused
from outbox.requests import ActionRequest, ValidRequest, validate


def _valid(requests: Sequence[ActionRequest]) -> list[ValidRequest]:
    """Every request checked before anything is written; the first refusal names the request's position."""
    if isinstance(requests, ActionRequest) or not isinstance(requests, Sequence):
        raise InvalidRequest("requests", f"must be a sequence of outbox.ActionRequest, not {type(requests).__name__}")
    valid = []
    for position, request in enumerate(requests):
        try:
            valid.append(validate(request))
        except InvalidRequest as refused:
            raise InvalidRequest(f"requests[{position}].{refused.field}", refused.message) from None
    return valid


def _expired(valid: ValidRequest, database_now: datetime, field: str) -> InvalidRequest:
    assert valid.expires_at is not None
    return InvalidRequest(
        field, f"{valid.expires_at.isoformat()} has already passed (database clock {database_now.isoformat()})"
    )


def _found(valid: list[ValidRequest], inserted: store.Inserted, *, many: bool) -> tuple[dict[str, Action], list[str]]:
    """The actions by key, and the keys not seen yet (a racing duplicate committed after the statement began)."""
    if inserted.expired is not None:
        position, database_now = inserted.expired
        field = f"requests[{position}].expires_at" if many else "expires_at"
        raise _expired(valid[position], database_now, field)
    return inserted.by_key, [v.idempotency_key for v in valid if v.idempotency_key not in inserted.by_key]


def enqueue_many(conn: SyncConnection, requests: Sequence[ActionRequest]) -> list[Action]:
    """Insert the actions in the caller's transaction, in one round trip; return them in request order.

    Every request is checked first: one refusal (InvalidRequest naming `requests[i].<field>`) writes nothing.
    A key repeated in the batch, or held by an earlier action, returns that first action. Actions of one
    lane run in the order given."""
    valid = _valid(requests)
    if not valid:
        return []
    by_key, missing = _found(valid, run(conn, store.insert_actions(valid)), many=True)
    if missing:
        raced = run(conn, store.actions_by_key(missing))
        by_key = by_key | raced
    return [by_key[v.idempotency_key] for v in valid]


async def enqueue_many_async(conn: AsyncConn, requests: Sequence[ActionRequest]) -> list[Action]:
    """`enqueue_many` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    valid = _valid(requests)
    if not valid:
        return []
    by_key, missing = _found(valid, await run_async(conn, store.insert_actions(valid)), many=True)
    if missing:
        raced = await run_async(conn, store.actions_by_key(missing))
        by_key = by_key | raced
    return [by_key[v.idempotency_key] for v in valid]


def enqueue(conn: SyncConnection, request: ActionRequest) -> Action:
    """Insert the action in the caller's transaction; return it, or the first one with the same key."""
    valid = [validate(request)]
    by_key, missing = _found(valid, run(conn, store.insert_actions(valid)), many=False)
    if missing:
        by_key = run(conn, store.actions_by_key(missing))
    return by_key[valid[0].idempotency_key]


async def enqueue_async(conn: AsyncConn, request: ActionRequest) -> Action:
    """`enqueue` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    valid = [validate(request)]
    by_key, missing = _found(valid, await run_async(conn, store.insert_actions(valid)), many=False)
    if missing:
        by_key = await run_async(conn, store.actions_by_key(missing))
    return by_key[valid[0].idempotency_key]


def _decide(conn: SyncConnection, statement: TextClause, action_id: int, wanted: str) -> Action:
    decided = run(conn, store.decision(statement, action_id))
    if decided is not None:
        return decided
    current = run(conn, store.action(action_id))
    if current is None:
        raise ActionNotFound(action_id)
    raise TransitionRefused(action_id, current.state, wanted)


def admit(conn: SyncConnection, action_id: int) -> Action:
    """Admit a PROPOSED action: it becomes ADMITTED and waits its turn in its lane."""
    return _decide(conn, store.ADMIT_PROPOSAL, action_id, "ADMITTED")


def refuse(conn: SyncConnection, action_id: int) -> Action:
    """Refuse a PROPOSED action: it ends CANCELLED with PROPOSAL_REFUSED."""
    return _decide(conn, store.REFUSE_PROPOSAL, action_id, "CANCELLED")


def cancel(conn: SyncConnection, action_id: int) -> Action:
    """Cancel an action that has not started (PROPOSED or ADMITTED): it ends CANCELLED with OPERATOR_CANCELLED."""
    return _decide(conn, store.CANCEL_UNSTARTED, action_id, "CANCELLED")
