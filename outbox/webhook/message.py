"""The request one attempt sends: a Standard Webhooks message, built and signed again before every attempt.

    idempotency key ──sha256──▶ webhook-id `msg_<digest>` (the same for every attempt, on every replica)
    event type, compose's data, now ──▶ body: compact JSON {"type", "timestamp", "data"} ─ > BODY_LIMIT,
                                                                     or a value JSON cannot write ─▶ InvalidBody
    webhook-id, now, body, secrets ──▶ headers: webhook-id, webhook-timestamp, webhook-signature (a v1
                                       signature per secret, separated by a space), content-type, user-agent

The receiver deduplicates by webhook-id, so an attempt after an unclear answer sends the same id with a
fresh timestamp and signature. Errors name the event type and where in the data a value could not be
written (its key and its type), never a value.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from outbox._internal.config.extras import needs
from outbox.errors import OutboxError
from outbox.event_data import UnwritableData, dumped

with needs("webhook"):
    from standardwebhooks import Webhook

# the largest body sent, in bytes
BODY_LIMIT = 256 * 1024
USER_AGENT = f"outbox-webhook/{importlib.metadata.version('outbox')}"


class InvalidBody(OutboxError, ValueError):
    """The data compose returned cannot be sent: not JSON, or a body over BODY_LIMIT. Names no data."""


@dataclass(frozen=True)
class SignedRequest:
    body: bytes
    headers: dict[str, str]


def webhook_id(idempotency_key: str) -> str:
    """The webhook-id every attempt of the action sends: `msg_` and 32 hex digits of the key's SHA-256."""
    return "msg_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def body(event_type: str, data: Mapping[str, Any], now: datetime) -> bytes:
    """The compact JSON body, the data's timestamps, numerics and uuids written as the NATS_EVENT kind writes
    them (outbox.event_data); InvalidBody naming the first value JSON cannot write, or a body over BODY_LIMIT."""
    if not isinstance(data, Mapping):
        raise InvalidBody(f"the {event_type} event's data must be a mapping, not a {type(data).__name__}")
    try:
        encoded = dumped({"type": event_type, "timestamp": rfc3339(now), "data": dict(data)})
    except UnwritableData as unwritable:
        raise InvalidBody(f"the {event_type} event's data cannot be written as JSON: {unwritable.where}") from None
    if len(encoded) > BODY_LIMIT:
        raise InvalidBody(f"the {event_type} event's body is {len(encoded)} bytes, more than {BODY_LIMIT}")
    return encoded


def signers(secrets: Sequence[str]) -> tuple[Webhook, ...]:
    """A signer per secret: one, or two while the secret is rotated."""
    return tuple(Webhook(secret) for secret in secrets)


def signed(msg_id: str, now: datetime, payload: bytes, signers: Sequence[Webhook]) -> SignedRequest:
    """The request's body and headers, signed for the instant `now` by every signer: a receiver that holds
    any one of the secrets verifies it (Standard Webhooks lists signatures separated by a space)."""
    return SignedRequest(
        payload,
        {
            "webhook-id": msg_id,
            "webhook-timestamp": str(math.floor(now.timestamp())),
            "webhook-signature": " ".join(signer.sign(msg_id, now, payload.decode()) for signer in signers),
            "content-type": "application/json",
            "user-agent": USER_AGENT,
        },
    )


def rfc3339(now: datetime) -> str:
    """`now` in UTC as RFC 3339 with microseconds: 2026-12-01T09:42:14.618000Z."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
