"""The message a NATS_EVENT publishes: its id, its subject, its headers and its JSON body, each checked.

    idempotency key ──sha256──▶ token (32 hex digits): the event's id, its Nats-Msg-Id, its subject's last token
    event's subject (orders.created) + token ──▶ orders.created.<token>
    event type, token, now, data ──▶ {"type", "id", "time", "data"} as compact JSON (UTF-8)

A subject is what the application's event names: one to MAX_SUBJECT_TOKENS tokens of ASCII letters,
digits, `-` and `_`, separated by dots, at most MAX_SUBJECT_LENGTH characters; no wildcard (`*`, `>`), no
empty token, no whitespace, nothing reserved (a token starting with `$`, such as `$JS.API`, cannot be
written; a first token starting with `_INBOX` is refused). An event type is letters, digits, `.`, `_` and
`-`, starting with a letter or digit, at most MAX_EVENT_TYPE_LENGTH characters. A message is at most
MAX_MESSAGE_BYTES (1 MiB) with its headers, and at most the server's max_payload (the adapter checks that
one). Errors name what was wrong.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from outbox.errors import InvalidRequest
from outbox.event_data import UnwritableData, dumped

MAX_MESSAGE_BYTES = 1 << 20
MAX_SUBJECT_LENGTH = 128
MAX_SUBJECT_TOKENS = 16
MAX_EVENT_TYPE_LENGTH = 64
MSG_ID_HEADER = "Nats-Msg-Id"

_EVENT_TYPE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_EVENT_TYPE_LENGTH - 1}}}")
_SUBJECT_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


class InvalidEvent(InvalidRequest):
    """An event type, subject or body a NATS message cannot carry. Names the field, never a data value."""


def event_token(idempotency_key: str) -> str:
    """The event's id: the first 32 hex digits of the SHA-256 of its idempotency key (any replica, any
    attempt computes the same one)."""
    return hashlib.sha256(idempotency_key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def check_event_type(name: object) -> str:
    if not isinstance(name, str) or not _EVENT_TYPE.fullmatch(name):
        raise InvalidEvent(
            "event type",
            f"{_shown(name)} must be 1 to {MAX_EVENT_TYPE_LENGTH} letters, digits, '.', '_' or '-',"
            " starting with a letter or digit",
        )
    return name


def check_subject(subject: object) -> str:
    """The application's subject as given, or InvalidEvent naming what is wrong with it."""
    if not isinstance(subject, str):
        raise InvalidEvent("subject", f"must be a string, not a {type(subject).__name__}")
    if not subject or len(subject) > MAX_SUBJECT_LENGTH:
        raise InvalidEvent("subject", f"must be 1 to {MAX_SUBJECT_LENGTH} characters, not {len(subject)}")
    tokens = subject.split(".")
    if len(tokens) > MAX_SUBJECT_TOKENS:
        raise InvalidEvent("subject", f"has {len(tokens)} tokens; at most {MAX_SUBJECT_TOKENS}")
    if tokens[0].startswith("_INBOX"):
        raise InvalidEvent("subject", f"{_shown(subject)} is reserved for replies (_INBOX)")
    for token in tokens:
        if token in ("*", ">"):
            raise InvalidEvent("subject", f"{_shown(subject)} holds a wildcard; an event is published on one subject")
        if not _SUBJECT_TOKEN.fullmatch(token):
            raise InvalidEvent(
                "subject",
                f"{_shown(subject)}: each token between dots must be ASCII letters, digits, '-' or '_'",
            )
    return subject


def message_subject(subject: str, token: str) -> str:
    """Where the event is published: its subject, then its id as the last token."""
    return f"{check_subject(subject)}.{token}"


def message_headers(token: str) -> dict[str, str]:
    return {MSG_ID_HEADER: token}


def headers_size(headers: Mapping[str, str]) -> int:
    """The bytes `headers` take on the wire (the NATS/1.0 line, each header, the blank line)."""
    return len("NATS/1.0\r\n") + sum(len(f"{name}: {value}\r\n".encode()) for name, value in headers.items()) + 2


def message_body(event_type: str, token: str, data: Mapping[str, Any], at: datetime) -> bytes:
    """`{"type", "id", "time", "data"}` as compact UTF-8 JSON; InvalidEvent when `data` is no JSON object
    (NaN, a value JSON has no form for: named by its key and type) or the message exceeds 1 MiB. What a
    query row holds is written as outbox.event_data does for both event kinds: a timestamp, date or time in
    ISO 8601, a numeric as its exact decimal text, a uuid as its text."""
    if not isinstance(data, Mapping):
        raise InvalidEvent(
            "data", f"compose must return a mapping (the body's data) or None, not {type(data).__name__}"
        )
    try:
        encoded = dumped({"type": event_type, "id": token, "time": _utc(at), "data": dict(data)})
    except UnwritableData as unwritable:
        raise InvalidEvent("data", f"cannot be written as JSON: {unwritable.where}") from None
    check_size(len(encoded), message_headers(token), MAX_MESSAGE_BYTES)
    return encoded


def check_size(body_bytes: int, headers: Mapping[str, str], limit: int) -> None:
    """InvalidEvent when a body of `body_bytes` with `headers` is more than `limit` bytes."""
    size = body_bytes + headers_size(headers)
    if size > limit:
        raise InvalidEvent("data", f"the message would be {size} bytes with its headers; the limit is {limit}")


def _utc(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"
