"""The payload of an event kind (WEBHOOK, NATS_EVENT): `{"event_type": name, "event": {...identifiers}}`.

    payload ─▶ parts(payload, kind) ─▶ (event type, event), or InvalidRequest naming the payload's shape
    check_payload: split_checked(payload, kind) (only those two keys) ─▶ the kind's registry finds the type
                   ─▶ checked_event(name, event, check) ─▶ the event type's own check, its errors named
                      `payload.event`

One piece for both kinds, so their payloads and their refusals read the same; each kind's registry and its
own check of the event stay in its module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outbox.errors import InvalidRequest

SHAPE = '{"event_type": name, "event": {...}}'


def parts(payload: Any, kind: str) -> tuple[object, dict[str, Any]]:
    """The event type and the event an action's payload holds (as the adapter reads it)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("event"), dict):
        raise InvalidRequest("payload", f"a {kind} payload is {SHAPE}")
    return payload.get("event_type"), payload["event"]


def split_checked(payload: Any, kind: str) -> tuple[object, object]:
    """The event type and the event of a payload that holds those two keys and nothing else (at enqueue)."""
    if not isinstance(payload, dict):
        raise InvalidRequest("payload", f"a {kind} payload is {SHAPE}, not a {type(payload).__name__}")
    others = sorted(repr(key) for key in payload if key not in ("event_type", "event"))
    if others:
        raise InvalidRequest(
            "payload", f"a {kind} payload holds only event_type and event, not {', '.join(others[:3])}"
        )
    return payload.get("event_type"), payload.get("event")


def checked_event(name: str, event: object, check: Callable[[dict[str, Any]], object]) -> None:
    """`check(event)` for the event type `name`: an event that is not an object, or that the check refuses
    or cannot read, is InvalidRequest naming `payload.event`."""
    if not isinstance(event, dict):
        raise InvalidRequest("payload.event", f"must be an object of the {name} event's identifiers")
    try:
        check(event)
    except InvalidRequest as refused:
        raise InvalidRequest("payload.event", refused.message) from None
    except (LookupError, TypeError, ValueError) as error:
        raise InvalidRequest("payload.event", f"the {name} event cannot read it: {error!r}") from None
