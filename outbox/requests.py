"""ActionRequest: what a caller asks for, and the one check it passes before anything is written.

    ActionRequest --validate--> ValidRequest (the values of its `agent_action` row)
                         \\---> InvalidRequest(field, message)

`validate` is total: whatever the fields hold, it returns a ValidRequest or raises InvalidRequest naming
the field, never another exception. Every check that can be made in Python is made here, so the database
never refuses a validated request and the caller's transaction stays usable after a refusal. The order:

    kind -> ids -> keys -> max_attempts -> expires_at -> proposed
         -> payload: walked without recursion (types, keys, text, depth, size) -> JSON text
         -> the kind's own payload check, if it declares one

PostgreSQL stores text as UTF-8 and has no NUL character in `text` or `jsonb`, so every string, payload
keys included, must encode as UTF-8 (no lone surrogate) and hold no NUL.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from outbox.errors import InvalidRequest
from outbox.kinds import ActionKind

# A payload holds identifiers, not documents; these bounds keep rows small and claims fast.
MAX_PAYLOAD_BYTES = 16 * 1024
MAX_PAYLOAD_DEPTH = 32
# Python's own default limit on writing an integer as decimal text
MAX_PAYLOAD_INTEGER_DIGITS = 4300
MAX_KEY_LENGTH = 512
# PostgreSQL `integer`
MAX_ATTEMPTS = 2**31 - 1
# a day short of year 10000, so the instant reads back in every time zone
LATEST_EXPIRY = datetime(9999, 12, 31, tzinfo=UTC)

_INTEGER_LIMIT = 10**MAX_PAYLOAD_INTEGER_DIGITS
_SHOWN_LENGTH = 60


@dataclass(frozen=True)
class ActionRequest:
    """One effect to carry out. See docs/concepts.md, "Enqueue", for each field's rule."""

    kind: ActionKind | str
    lane_key: str
    idempotency_key: str
    payload: Any
    workspace_id: int | None = None
    subject_account_id: int | None = None
    max_attempts: int = 5
    expires_at: datetime | None = None
    # an agent's proposal waits PROPOSED until the server admits or refuses it
    proposed: bool = False


@dataclass(frozen=True)
class ValidRequest:
    """A request that passed every check, as the values of its row."""

    kind: ActionKind
    lane_key: str
    idempotency_key: str
    payload_json: str
    workspace_id: int | None
    subject_account_id: int | None
    max_attempts: int
    expires_at: datetime | None
    state: str
    # where the effect goes: the kind's destination, or the one its payload check named
    destination: str


def validate(request: ActionRequest) -> ValidRequest:
    """The row values of `request`, or InvalidRequest naming the first field that is wrong."""
    if not isinstance(request, ActionRequest):
        raise InvalidRequest("request", f"must be an outbox.ActionRequest, not {_type_of(request)}")
    kind = _kind(request.kind)
    valid = ValidRequest(
        kind=kind,
        workspace_id=_workspace_id(kind, request.workspace_id),
        subject_account_id=check_id("subject_account_id", request.subject_account_id),
        lane_key=_key("lane_key", request.lane_key),
        idempotency_key=_key("idempotency_key", request.idempotency_key),
        max_attempts=_max_attempts(request.max_attempts),
        expires_at=_expires_at(request.expires_at),
        state=_state(request.proposed),
        payload_json=_payload_json(request.payload),
        destination="",
    )
    return dataclasses.replace(valid, destination=kind.check_payload(request.payload))


# -- the fields


def _kind(value: object) -> ActionKind:
    if isinstance(value, ActionKind):
        registered = ActionKind.get(value.name)
        if registered != value:
            raise InvalidRequest("kind", f"{registered.name} is registered with another declaration: {registered!r}")
        return registered
    if isinstance(value, str):
        return ActionKind.get(value)
    raise InvalidRequest("kind", f"must be an ActionKind or the name of one, not {_type_of(value)}")


def _workspace_id(kind: ActionKind, value: object) -> int | None:
    workspace_id = check_id("workspace_id", value)
    if workspace_id is None and not kind.instance_level:
        raise InvalidRequest("workspace_id", f"{kind} belongs to a workspace; workspace_id is missing")
    if workspace_id is not None and not kind.workspace_level:
        raise InvalidRequest("workspace_id", f"{kind} is instance-level; it takes no workspace_id (got {workspace_id})")
    return workspace_id


def check_id(field: str, value: object) -> int | None:
    """`value` when it is None or a positive 64-bit integer (PostgreSQL `bigint`); InvalidRequest otherwise."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not (0 < value < 2**63):
        raise InvalidRequest(field, f"must be a positive 64-bit integer, not {_shown(value)}")
    return value


def _key(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(field, f"must be a non-empty string, not {_type_of(value)}")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidRequest(field, f"is {len(value)} characters; at most {MAX_KEY_LENGTH} are allowed")
    if not value.strip():
        raise InvalidRequest(field, f"must be a non-empty string, not {_shown(value)}")
    _check_text(field, "", value)
    return value


def _max_attempts(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not (1 <= value <= MAX_ATTEMPTS):
        raise InvalidRequest(
            "max_attempts", f"must be an integer of at least 1 and at most {MAX_ATTEMPTS}, not {_shown(value)}"
        )
    return value


def _expires_at(value: object) -> datetime | None:
    """The instant in UTC: the same instant, written with an offset PostgreSQL and every reader accept."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidRequest("expires_at", f"must be a timezone-aware datetime, not {_type_of(value)}")
    try:
        offset = value.utcoffset()
        utc = value.astimezone(UTC) if offset is not None else None
    except (OverflowError, ValueError, TypeError) as error:
        raise InvalidRequest("expires_at", f"is not an instant between the years 1 and 9999 in UTC ({error})") from None
    if utc is None:
        raise InvalidRequest("expires_at", "must be a timezone-aware datetime")
    if utc >= LATEST_EXPIRY:
        raise InvalidRequest(
            "expires_at", f"{utc.isoformat()} is too late: it must be before {LATEST_EXPIRY.isoformat()}"
        )
    return utc


def _state(proposed: object) -> str:
    if not isinstance(proposed, bool):
        raise InvalidRequest("proposed", f"must be True or False, not {_type_of(proposed)}")
    return "PROPOSED" if proposed else "ADMITTED"


# -- the payload


def _payload_json(payload: Any) -> str:
    _check_payload_values(payload)
    try:
        text = json.dumps(payload, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as error:  # a limit of this process (int_max_str_digits)
        raise InvalidRequest("payload", f"is not JSON: {error}") from None
    size = len(text.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidRequest("payload", f"is {size} bytes of JSON; at most {MAX_PAYLOAD_BYTES} are allowed")
    return text


def _check_payload_values(payload: Any) -> None:
    """Every value of the payload, walked with a stack of its own so no depth exhausts Python's."""
    least_bytes = 0  # of its JSON: a byte for each value, and a comma between two items of a container
    for path, depth, value in _walk(payload):
        least_bytes += 1 + (len(value) if isinstance(value, dict | list | tuple) else 0)
        if least_bytes > MAX_PAYLOAD_BYTES:
            raise InvalidRequest("payload", _too_large("holds too many values"))
        if depth > MAX_PAYLOAD_DEPTH and isinstance(value, dict | list | tuple):
            raise InvalidRequest("payload", f"at {_where(path)}: nested deeper than {MAX_PAYLOAD_DEPTH} levels")
        _check_value(path, value)


def _walk(payload: Any) -> Iterator[tuple[tuple[object, ...], int, Any]]:
    """(path, depth, value) for the payload and everything inside it; the payload itself is depth 1.

    An object's keys are checked as the object is opened, before any of its values is reached.
    """
    stack: list[tuple[tuple[object, ...], int, Any]] = [((), 1, payload)]
    while stack:
        path, depth, value = stack.pop()
        yield path, depth, value
        if isinstance(value, dict):
            for key, item in value.items():
                _check_object_key(path, key)
                stack.append(((*path, key), depth + 1, item))
        elif isinstance(value, list | tuple):
            stack.extend(((*path, index), depth + 1, item) for index, item in enumerate(value))


def _check_object_key(path: tuple[object, ...], key: object) -> None:
    if not isinstance(key, str):
        raise InvalidRequest(
            "payload", f"at {_where(path)}: a JSON object's keys are strings, not {_type_of(key)} ({_shown(key)})"
        )
    if len(key) > MAX_PAYLOAD_BYTES:
        raise InvalidRequest("payload", _too_large(f"at {_where(path)}: holds a key of {len(key)} characters"))
    _check_text("payload", f"at {_where(path)}: a key ", key)


def _check_value(path: tuple[object, ...], value: Any) -> None:
    if value is None or isinstance(value, bool | dict | list | tuple):
        return
    if isinstance(value, str):
        if len(value) > MAX_PAYLOAD_BYTES:
            raise InvalidRequest("payload", _too_large(f"at {_where(path)}: holds {len(value)} characters"))
        _check_text("payload", f"at {_where(path)}: ", value)
    elif isinstance(value, int):
        if not -_INTEGER_LIMIT < value < _INTEGER_LIMIT:
            raise InvalidRequest(
                "payload", f"at {_where(path)}: an integer has more than {MAX_PAYLOAD_INTEGER_DIGITS} digits"
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest("payload", f"is not JSON: at {_where(path)}: {value!r} has no JSON form")
    else:
        raise InvalidRequest("payload", f"is not JSON: at {_where(path)}: {_type_of(value)} has no JSON form")


# -- text and messages


def _check_text(field: str, where: str, text: str) -> None:
    """Text PostgreSQL can store: encodable as UTF-8 (no lone surrogate) and without NUL."""
    if "\x00" in text:
        raise InvalidRequest(field, f"{where}must not contain a NUL character (PostgreSQL cannot store it)")
    try:
        text.encode()
    except UnicodeEncodeError as error:
        bad = ascii(text[error.start : error.end])
        raise InvalidRequest(
            field, f"{where}must be valid Unicode: it holds a lone surrogate {bad} at index {error.start}"
        ) from None


def _where(path: tuple[object, ...]) -> str:
    """Where a value sits in the payload, as Python would index it: payload["items"][0]."""
    steps = "".join(f"[{_shown(step)}]" for step in path)
    return "payload" + steps


def _too_large(what: str) -> str:
    return f"{what}, so more than {MAX_PAYLOAD_BYTES} bytes of JSON; at most {MAX_PAYLOAD_BYTES} are allowed"


def _type_of(value: object) -> str:
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _shown(value: object) -> str:
    """A short, printable form of a value for a message; never raises."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(10**40) < value < 10**40:
        return f"an integer of {value.bit_length()} bits"
    try:
        shown = ascii(value)
    except Exception:  # a message must never fail on the value it describes
        return _type_of(value)
    return shown if len(shown) <= _SHOWN_LENGTH else shown[: _SHOWN_LENGTH - 3] + "..."
