"""WebhookEvent: one type of webhook, its endpoint, and the data composed from the database before every attempt.

    event (identifiers) ──query (optional)──▶ rows ──compose──▶ data (a JSON object) ─▶ the body's "data"
    enqueue: None ─▶ the action its idempotency key holds, else InvalidRequest
             data not JSON or too big ─▶ InvalidRequest
    attempt: None ─▶ CANCELLED / NOT_WANTED; data not JSON, too big, or compose raised ─▶ FAILED before sending

An event is declarative, as an email notice is: the action's payload holds only identifiers,
`{"event_type": name, "event": {...}}`, and the data sent is read from the database again before each
attempt, so it says what holds now. The endpoint is the event's class attribute, never the payload's:
no payload chooses where a webhook goes.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import TextClause

from outbox._internal.checks.event_payload import checked_event, parts, split_checked
from outbox.action import Action
from outbox.errors import InvalidRequest, OutboxError
from outbox.event_definition import EventDefinition
from outbox.intake import enqueue, enqueue_async, held_action, held_action_async
from outbox.requests import ActionRequest
from outbox.store.caller import AsyncConn, SyncConnection
from outbox.webhook.endpoints import destination_name, endpoint_named
from outbox.webhook.kind import WEBHOOK
from outbox.webhook.message import InvalidBody, body

# the eight attempts of WEBHOOK's retry schedule (the first and its seven retries)
MAX_ATTEMPTS = 8
_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class UnknownEvent(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_EVENTS)) or "none"
        super().__init__(f"no webhook event is registered as {name!r} (registered: {known})")


class WebhookEvent(EventDefinition):
    """One type of webhook: subclass it once, set the class attributes (`name`, `endpoint`, `workspace_scoped`,
    `query`), write the four methods (`params`, `compose`, `idempotency_key`, `lane_key`), and
    `register_webhook_event` an instance in every process that enqueues it or runs the executor (docs/webhooks.md).
    `event` is always the JSON object of identifiers the action's payload holds. `name` is the body's "type"
    (invoice.paid) and the webhook-id derives from `idempotency_key`. What every kind's definition shares (the
    rows, the action's request, its workspace and account) is EventDefinition's."""

    _kind = WEBHOOK
    _name_key = "event_type"

    # the name of a registered endpoint: where every webhook of this type goes
    endpoint: ClassVar[str]
    # the rows compose reads, run before every attempt with the parameters `params` returns; None: no rows
    query: ClassVar[TextClause | None] = None

    @abstractmethod
    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        """The webhook's data as the rows say now; None when nothing should be sent."""

    def _rows_query(self) -> TextClause | None:
        return self.query

    def request(self, event: dict[str, Any], max_attempts: int = MAX_ATTEMPTS) -> ActionRequest:
        """The WEBHOOK action's request for `event`: the retry schedule's eight attempts unless told otherwise."""
        return super().request(event, max_attempts=max_attempts)


_EVENTS: dict[str, WebhookEvent] = {}


def register_webhook_event(event: WebhookEvent) -> WebhookEvent:
    """Add an event type; its endpoint must be registered first. ValueError names what is wrong."""
    name = getattr(event, "name", None)
    if not isinstance(name, str) or not _TYPE.fullmatch(name):
        raise ValueError(
            "name: a webhook event type is 1 to 100 letters, digits, '.', '_' and '-', starting with a letter or"
            f" digit, not {name!r:.80}"
        )
    try:
        endpoint_named(getattr(event, "endpoint", None))
    except LookupError as unknown:
        raise ValueError(f"endpoint: the {name} event's endpoint: {unknown}") from None
    if not isinstance(getattr(event, "workspace_scoped", None), bool):
        raise ValueError(f"workspace_scoped: the {name} event must say True or False")
    if event.query is not None and not isinstance(event.query, TextClause):
        raise ValueError(f"query: the {name} event's query must be a sqlalchemy text() or None")
    known = _EVENTS.get(name)
    if known is not None and known is not event:
        raise ValueError(f"name: a webhook event named {name!r} is already registered")
    _EVENTS[name] = event
    return event


# the earlier name, kept for code written against it; outbox.nats has its own (register_nats_event)
register = register_webhook_event


def event_named(name: object) -> WebhookEvent:
    event = _EVENTS.get(name) if isinstance(name, str) else None
    if event is None:
        raise UnknownEvent(name)
    return event


def event_of(payload: Any) -> tuple[WebhookEvent, dict[str, Any]]:
    """The event type and the event a WEBHOOK action's payload holds."""
    name, event = parts(payload, "WEBHOOK")
    return event_named(name), event


def check_payload(payload: Any) -> str:
    """The WEBHOOK kind's payload check at enqueue: `{"event_type": name, "event": {...}}` and nothing else,
    the event type registered in this process and its `params` accepting the event; InvalidRequest otherwise.
    Returns the action's destination, its event's endpoint: `webhook:<endpoint>`."""
    name, event = split_checked(payload, "WEBHOOK")
    try:
        definition = event_named(name)
    except UnknownEvent as unknown:
        raise InvalidRequest("payload.event_type", str(unknown)) from None
    checked_event(definition.name, event, definition.params)
    return destination_name(definition.endpoint)


def prepared(definition: WebhookEvent, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The body compose gives for the rows now (None: nothing to send); InvalidBody when it cannot be sent.
    The adapter builds its own with a fresh timestamp; this one checks the data at enqueue."""
    data = definition.compose(event, rows)
    return None if data is None else body(definition.name, data, datetime.now(UTC))


def _checked(definition: WebhookEvent, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> bytes | None:
    try:
        return prepared(definition, event, rows)
    except InvalidBody as invalid:
        raise InvalidRequest("event", str(invalid)) from None


def _held_or_nothing(definition: WebhookEvent, held: Action | None) -> Action:
    if held is None:
        raise InvalidRequest("event", f"the {definition.name} event has nothing to send now (compose returned None)")
    return held


def enqueue_webhook(
    conn: SyncConnection, definition: WebhookEvent, event: dict[str, Any], *, max_attempts: int = MAX_ATTEMPTS
) -> Action:
    """Compose the webhook now and enqueue it in the caller's transaction (see `outbox.enqueue`).

    Data that cannot be sent is refused (InvalidRequest naming `event`); so is an event with nothing to send
    now, unless its idempotency key already holds an action: that action is returned unchanged."""
    check_payload({"event_type": definition.name, "event": event})
    request = definition.request(event, max_attempts)
    if _checked(definition, event, definition.rows(conn, event)) is None:
        return _held_or_nothing(definition, held_action(conn, request))
    return enqueue(conn, request)


async def enqueue_webhook_async(
    conn: AsyncConn, definition: WebhookEvent, event: dict[str, Any], *, max_attempts: int = MAX_ATTEMPTS
) -> Action:
    """`enqueue_webhook` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    check_payload({"event_type": definition.name, "event": event})
    request = definition.request(event, max_attempts)
    if _checked(definition, event, await definition.rows_async(conn, event)) is None:
        return _held_or_nothing(definition, await held_action_async(conn, request))
    return await enqueue_async(conn, request)
