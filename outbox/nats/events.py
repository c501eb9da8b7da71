"""NatsEvent: one type of event, prepared from its identifiers at enqueue and again before every attempt.

    event (identifiers) ──query (optional)──▶ rows ──compose──▶ data (a JSON object) ──▶ PreparedEvent
    enqueue: nothing to publish ─▶ the action its idempotency key holds, else InvalidRequest
    attempt: nothing to publish ─▶ CANCELLED / NOT_WANTED

An event is declarative: the subject it is published on, an optional SQL query that reads what it tells
now (so the message carries the state at publish time, not a copy frozen at enqueue), and a function
that writes the message's `data`. The query runs on the caller's sync connection at enqueue and on the
adapter's async connection before each attempt. The action's payload is `{"event_type": name, "event":
{...}}`: identifiers only.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import TextClause

from outbox._internal.checks.event_payload import checked_event, parts, split_checked
from outbox.action import Action
from outbox.errors import InvalidRequest, OutboxError
from outbox.event_definition import EventDefinition
from outbox.intake import enqueue, enqueue_async, held_action, held_action_async
from outbox.nats.kind import NATS_EVENT
from outbox.nats.message import check_event_type, event_token, message_body, message_subject
from outbox.store.caller import AsyncConn, SyncConnection


class UnknownEvent(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_EVENTS)) or "none"
        super().__init__(f"no NATS event is registered as {name!r} (registered: {known})")


@dataclass(frozen=True)
class PreparedEvent:
    """The message as it goes now: its full subject (`<subject>.<id>`), its id and its JSON body."""

    subject: str
    token: str
    body: bytes


class NatsEvent(EventDefinition):
    """One type of event: subclass it once, set the class attributes (`name`, `workspace_scoped`, `query`),
    write the methods (`subject`, `params`, `compose`, `idempotency_key`, `lane_key`), and
    `register_nats_event` an instance in every process that enqueues it or runs the executor (docs/nats.md).
    `event` is always the JSON object of identifiers the action's payload holds. `name` is the body's "type"
    and the trace's event_type; the event's id derives from `idempotency_key`. What every kind's definition
    shares (the rows, the action's request, its workspace and account) is EventDefinition's."""

    _kind = NATS_EVENT
    _name_key = "event_type"

    # what `compose` reads, run before every attempt with the parameters `params` returns; None: no rows
    query: ClassVar[TextClause | None] = None

    @abstractmethod
    def subject(self, event: dict[str, Any]) -> str:
        """The subject the event is published under, such as `orders.created` (the event's id is appended)."""

    @abstractmethod
    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        """The body's `data` (a JSON object) from the rows the query found now; None: nothing to publish now."""

    def _rows_query(self) -> TextClause | None:
        return self.query

    def prepared(
        self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]], at: datetime | None = None
    ) -> PreparedEvent | None:
        """The message for the rows the query found, composed at `at` (now); None when there is nothing to
        publish. An invalid subject, or data JSON cannot write or that exceeds 1 MiB, raises InvalidEvent."""
        token = event_token(self.idempotency_key(event))
        subject = message_subject(self.subject(event), token)
        data = self.compose(event, rows)
        if data is None:
            return None
        return PreparedEvent(subject, token, message_body(self.name, token, data, at or datetime.now(UTC)))

    def prepare(self, conn: SyncConnection, event: dict[str, Any]) -> PreparedEvent | None:
        """The message as it would go now, or None when there is nothing to publish."""
        return self.prepared(event, self.rows(conn, event))

    async def prepare_async(self, conn: AsyncConn, event: dict[str, Any]) -> PreparedEvent | None:
        """`prepare` on an async connection (as the adapter runs it before every attempt)."""
        return self.prepared(event, await self.rows_async(conn, event))


_EVENTS: dict[str, NatsEvent] = {}


def register_nats_event(event_def: NatsEvent) -> NatsEvent:
    """Make `event_def` known to this process by its name; refuses an invalid name or a second event of one name."""
    name = check_event_type(getattr(event_def, "name", None))
    known = _EVENTS.get(name)
    if known is not None and known is not event_def:
        raise ValueError(f"a NATS event named {name!r} is already registered")
    _EVENTS[name] = event_def
    return event_def


# the earlier name, kept for code written against it; outbox.webhook has its own (register_webhook_event)
register = register_nats_event


def event_named(name: object) -> NatsEvent:
    found = _EVENTS.get(name) if isinstance(name, str) else None
    if found is None:
        raise UnknownEvent(name)
    return found


def event_of(payload: Any) -> tuple[NatsEvent, dict[str, Any]]:
    """The event type and event a NATS_EVENT action's payload holds."""
    name, event = parts(payload, "NATS_EVENT")
    return event_named(name), event


def check_payload(payload: Any) -> None:
    """The NATS_EVENT kind's payload check at enqueue: `{"event_type": name, "event": {...}}` and nothing
    else, the event type registered in this process, its `params` accepting the event and its `subject`
    giving a valid subject; InvalidRequest otherwise."""
    name, event = split_checked(payload, "NATS_EVENT")
    try:
        event_def = event_named(name)
    except UnknownEvent as unknown:
        raise InvalidRequest("payload.event_type", str(unknown)) from None

    def check(event: dict[str, Any]) -> None:
        event_def.params(event)
        message_subject(event_def.subject(event), event_token(event_def.idempotency_key(event)))

    checked_event(event_def.name, event, check)


def _held_or_nothing(event_def: NatsEvent, held: Action | None) -> Action:
    """The action the event's key already holds; InvalidRequest when there is none."""
    if held is None:
        raise InvalidRequest("event", f"the {event_def.name} event has nothing to publish now (compose returned None)")
    return held


def enqueue_event(
    conn: SyncConnection, event_def: NatsEvent, event: dict[str, Any], *, max_attempts: int = 5
) -> Action:
    """Prepare the event now and enqueue it in the caller's transaction (see `outbox.enqueue`).

    An event with nothing to publish now is refused (InvalidRequest naming `event`), unless its idempotency
    key already holds an action: that action is returned unchanged, as for any repeated key. A message the
    event cannot make (its subject, its data) is refused with InvalidEvent."""
    event_named(event_def.name)
    request = event_def.request(event, max_attempts=max_attempts)
    if event_def.prepare(conn, event) is None:
        return _held_or_nothing(event_def, held_action(conn, request))
    return enqueue(conn, request)


async def enqueue_event_async(
    conn: AsyncConn, event_def: NatsEvent, event: dict[str, Any], *, max_attempts: int = 5
) -> Action:
    """`enqueue_event` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    event_named(event_def.name)
    request = event_def.request(event, max_attempts=max_attempts)
    if await event_def.prepare_async(conn, event) is None:
        return _held_or_nothing(event_def, await held_action_async(conn, request))
    return await enqueue_async(conn, request)
