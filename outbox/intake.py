"""Enqueue an action inside the caller's transaction, decide an agent's proposal, cancel what has not started.

    ActionRequest(s) --validate each--> ValidRequest(s) --one INSERT ... ON CONFLICT DO NOTHING--> agent_action
                                   (it also returns the rows that held a key before it began)
                          | a kind without its row, or with a row that declares it otherwise; an expiry passed:
                          | nothing inserted, InvalidRequest naming the request and the step to take
                          | a key neither inserted nor seen: a racing duplicate, or an enqueue into the
                          | same idle lane that marked itself its holder first (ux_agent_action_lane_head)
                          v
                          SELECT by idempotency key (a new snapshot sees the winner); a key still not
                          found is enqueued again, behind the lane's holder
    each request's action --inserted by it--> created True
                          --held its key before--> created False, the fields that differ noted (and logged)

`enqueue` and `enqueue_many` run the same statement: one round trip for one action or a batch, a kind's
row and an expiry checked inside it, so the database never refuses it. `held_action` reads the action a
key holds without inserting, for a caller that would not insert (an email that reaches nobody now).

The caller owns the transaction: outbox never commits or rolls back, so the action exists exactly when
the caller's change commits. Sync (SQLAlchemy `Connection`, `Session`, a psycopg `Connection`) and async
(`AsyncConnection`, `AsyncSession`, a psycopg `AsyncConnection`) functions mirror each other by name;
`outbox.caller` runs the statements on whichever the caller holds. Every route stores the trace context of
the span active at the call (`outbox.tracing`, when the application uses OpenTelemetry) with the actions it
inserts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from sqlalchemy import TextClause

from outbox import tracing
from outbox._internal.checks import kind_rows
from outbox.action import Action
from outbox.errors import ActionNotFound, InvalidRequest, TransitionRefused
from outbox.requests import ActionRequest, ValidRequest, validate
from outbox.store import application as store
from outbox.store.caller import AsyncConn, SyncConnection, run, run_async

log = logging.getLogger("outbox.enqueue")


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


def _field(name: str, position: int, *, many: bool) -> str:
    return f"requests[{position}].{name}" if many else name


def _undeclared_kind(valid: list[ValidRequest], inserted: store.Inserted, *, many: bool) -> InvalidRequest | None:
    """The refusal of the first request whose kind's row is missing or declares it otherwise, if any."""
    for position, request in enumerate(valid):
        if request.kind.name in inserted.undeclared_kinds:
            found = inserted.undeclared_kinds[request.kind.name]
            line = kind_rows.mismatch(request.kind, None if found is None else kind_rows.KindRow(**found))
            assert line is not None, "the statement returns only the kinds whose row is missing or differs"
            return InvalidRequest(_field("kind", position, many=many), line)
    return None


def _expired(valid: list[ValidRequest], inserted: store.Inserted, *, many: bool) -> InvalidRequest | None:
    if inserted.expired is None:
        return None
    position, database_now = inserted.expired
    expires_at = valid[position].expires_at
    assert expires_at is not None
    return InvalidRequest(
        _field("expires_at", position, many=many),
        f"{expires_at.isoformat()} has already passed (database clock {database_now.isoformat()})",
    )


def _found(valid: list[ValidRequest], inserted: store.Inserted, *, many: bool) -> tuple[dict[str, Action], list[str]]:
    """The actions by key, and the keys not seen yet (a racing duplicate committed after the statement began);
    InvalidRequest when the statement inserted nothing for a kind's row or an expiry."""
    refused = _undeclared_kind(valid, inserted, many=many) or _expired(valid, inserted, many=many)
    if refused is not None:
        raise refused
    return inserted.by_key, [v.idempotency_key for v in valid if v.idempotency_key not in inserted.by_key]


# -- a key that already held an action


def _as_stored(payload_json: str) -> Any:
    """The payload as the database reads it back."""
    return json.loads(payload_json, parse_float=_stored_number)


def _stored_number(number: str) -> float | int:
    """A number as `jsonb` keeps it: one given with a positive exponent (Python's form of a float of 1e16 or
    more) as the integer it is, and no negative zero."""
    if "e+" in number:
        return int(Decimal(number))
    return float(number) or 0.0


def _same_json(first: Any, second: Any) -> bool:
    """Equal as JSON: `true` is not `1` (Python's `True == 1`), the order of an object's keys does not count."""
    return json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def _differing_fields(request: ValidRequest, action: Action) -> tuple[str, ...]:
    """The fields of `request` that say what the effect is, and whom and where it addresses, and hold other
    values than `action`, which held its key before. The payload counts while the action keeps it (an ended
    action keeps none); the delivery options (max_attempts, expires_at, proposed) do not count."""
    differing = [
        name
        for name, asked, held in (
            ("kind", request.kind.name, action.kind),
            ("workspace_id", request.workspace_id, action.workspace_id),
            ("lane_key", request.lane_key, action.lane_key),
        )
        if asked != held
    ]
    if action.ended_at is None and not _same_json(_as_stored(request.payload_json), action.payload):
        differing.append("payload")
    if request.subject_account_id != action.subject_account_id:
        differing.append("subject_account_id")
    return tuple(differing)


def _reused(request: ValidRequest, action: Action) -> Action:
    """`action`, which held the request's key before this request: as it is, with the fields that differ."""
    differing = _differing_fields(request, action)
    if differing:
        log.warning(
            "enqueue: idempotency key %r already holds action %d (kind %s); this request differs in %s;"
            " the first action is returned unchanged",
            request.idempotency_key,
            action.id,
            action.kind,
            ", ".join(differing),
        )
    return replace(action, created=False, differing_fields=differing)


def _returned(valid: list[ValidRequest], by_key: dict[str, Action]) -> list[Action]:
    """Each request's action in request order: as inserted for the request that created it, as reused for
    every other (an earlier action, or an earlier request of the batch, held its key)."""
    returned = []
    seen: set[str] = set()
    for request in valid:
        action = by_key[request.idempotency_key]
        created_by_it = action.created is True and request.idempotency_key not in seen
        returned.append(action if created_by_it else _reused(request, action))
        seen.add(request.idempotency_key)
    return returned


# -- enqueue


def _insert(valid: list[ValidRequest]) -> store.Query[store.Inserted]:
    """The statement that inserts `valid`, with the trace context of the span active now (if any)."""
    return store.insert_actions(valid, tracing.enqueue_context())


def enqueue_many(conn: SyncConnection, requests: Sequence[ActionRequest]) -> list[Action]:
    """Insert the actions in the caller's transaction, in one round trip; return them in request order.

    Every request is checked first: one refusal (InvalidRequest naming `requests[i].<field>`) writes nothing.
    A key repeated in the batch, or held by an earlier action, returns that first action (`created` False,
    `differing_fields` naming what this request holds otherwise). Actions of one lane run in the order given."""
    valid = _valid(requests)
    return _returned(valid, _inserted(conn, valid, many=True)) if valid else []


async def enqueue_many_async(conn: AsyncConn, requests: Sequence[ActionRequest]) -> list[Action]:
    """`enqueue_many` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    valid = _valid(requests)
    return _returned(valid, await _inserted_async(conn, valid, many=True)) if valid else []


def enqueue(conn: SyncConnection, request: ActionRequest) -> Action:
    """Insert the action in the caller's transaction and return it (`created` True); or return the first one
    with the same key, unchanged (`created` False, `differing_fields` naming what this request holds otherwise)."""
    valid = [validate(request)]
    return _returned(valid, _inserted(conn, valid, many=False))[0]


async def enqueue_async(conn: AsyncConn, request: ActionRequest) -> Action:
    """`enqueue` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    valid = [validate(request)]
    return _returned(valid, await _inserted_async(conn, valid, many=False))[0]


# An enqueue that finds its lane idle marks itself its holder; when another one, not committed yet, did so
# first, the statement inserts nothing for it, and it is enqueued again once that one committed (behind it).
# Each pass waits for the enqueue it raced, so a second pass inserts it; more than a few means something else.
_PASSES = 5


def _lanes_kept_busy(pending: list[ValidRequest]) -> RuntimeError:
    keys = ", ".join(repr(v.idempotency_key) for v in pending[:3])
    return RuntimeError(
        f"enqueue: {len(pending)} actions ({keys}) were neither inserted nor found after {_PASSES} passes:"
        " their lanes' first places kept being taken by enqueues that did not commit"
    )


def _inserted(conn: SyncConnection, valid: list[ValidRequest], *, many: bool) -> dict[str, Action]:
    """Every request's action by key: inserted now, or held before. One round trip, unless a key was taken by
    a racing duplicate (read it) or an enqueue into the same idle lane got there first (the whole batch again:
    what is in now returns as held, and a refusal still names the request by its place in the batch)."""
    by_key: dict[str, Action] = {}
    for _ in range(_PASSES):
        found, missing = _found(valid, run(conn, _insert(valid)), many=many)
        by_key = found | by_key  # an action an earlier pass inserted stays as that pass found it (created)
        if missing:
            raced = run(conn, store.actions_by_key(missing))
            by_key |= raced
        if pending := [v for v in valid if v.idempotency_key not in by_key]:
            continue
        return by_key
    raise _lanes_kept_busy(pending)


async def _inserted_async(conn: AsyncConn, valid: list[ValidRequest], *, many: bool) -> dict[str, Action]:
    """`_inserted` on an async connection."""
    by_key: dict[str, Action] = {}
    for _ in range(_PASSES):
        found, missing = _found(valid, await run_async(conn, _insert(valid)), many=many)
        by_key = found | by_key
        if missing:
            raced = await run_async(conn, store.actions_by_key(missing))
            by_key |= raced
        if pending := [v for v in valid if v.idempotency_key not in by_key]:
            continue
        return by_key
    raise _lanes_kept_busy(pending)


def held_action(conn: SyncConnection, request: ActionRequest) -> Action | None:
    """The action that already holds the request's idempotency key, as `enqueue` would return it (`created`
    False, the differing fields noted and logged); None when none does. Inserts nothing."""
    valid = validate(request)
    held = run(conn, store.actions_by_key([valid.idempotency_key]))
    return _reused(valid, held[valid.idempotency_key]) if held else None


async def held_action_async(conn: AsyncConn, request: ActionRequest) -> Action | None:
    """`held_action` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    valid = validate(request)
    held = await run_async(conn, store.actions_by_key([valid.idempotency_key]))
    return _reused(valid, held[valid.idempotency_key]) if held else None


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
