"""ActionRequest: what a caller asks for, and the checks it passes before anything is written.

`validate` turns a request into the row values of `agent_action`, or raises `InvalidRequest` naming the
field. Every check that can be made in Python is made here, so the database never refuses a validated
request and the caller's transaction stays usable after a refusal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox.errors import InvalidRequest
from outbox.kinds import ActionKind

# A payload holds identifiers, not documents; this bound keeps rows small and claims fast.
MAX_PAYLOAD_BYTES = 16 * 1024
MAX_KEY_LENGTH = 512


@dataclass(frozen=True)
class ActionRequest:
    """One effect to carry out. See the README's "Enqueue an effect" for each field's rule."""

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


def validate(request: ActionRequest) -> ValidRequest:
    kind = request.kind if isinstance(request.kind, ActionKind) else ActionKind.get(request.kind)
    ActionKind.get(kind.name)  # a kind object must also be registered
    if request.workspace_id is None and not kind.instance_level:
        raise InvalidRequest("workspace_id", f"{kind} belongs to a workspace; workspace_id is missing")
    if request.workspace_id is not None and not kind.workspace_level:
        raise InvalidRequest(
            "workspace_id", f"{kind} is instance-level; it takes no workspace_id (got {request.workspace_id})"
        )
    check_id("workspace_id", request.workspace_id)
    check_id("subject_account_id", request.subject_account_id)
    _check_key("lane_key", request.lane_key)
    _check_key("idempotency_key", request.idempotency_key)
    if not isinstance(request.max_attempts, int) or isinstance(request.max_attempts, bool) or request.max_attempts < 1:
        raise InvalidRequest("max_attempts", f"must be an integer of at least 1, not {request.max_attempts!r}")
    if request.expires_at is not None and (
        not isinstance(request.expires_at, datetime) or request.expires_at.tzinfo is None
    ):
        raise InvalidRequest("expires_at", "must be a timezone-aware datetime")
    return ValidRequest(
        kind=kind,
        lane_key=request.lane_key,
        idempotency_key=request.idempotency_key,
        payload_json=_payload_json(request.payload),
        workspace_id=request.workspace_id,
        subject_account_id=request.subject_account_id,
        max_attempts=request.max_attempts,
        expires_at=request.expires_at,
        state="PROPOSED" if request.proposed else "ADMITTED",
    )


def _check_key(field: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field, f"must be a non-empty string, not {value!r}")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidRequest(field, f"is {len(value)} characters; at most {MAX_KEY_LENGTH} are allowed")
    if "\x00" in value:
        raise InvalidRequest(field, "must not contain a NUL character")


def check_id(field: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not (0 < value < 2**63):
        raise InvalidRequest(field, f"must be a positive 64-bit integer, not {value!r}")


def _payload_json(payload: Any) -> str:
    try:
        text = json.dumps(payload, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise InvalidRequest("payload", f"is not JSON: {error}") from None
    if "\\u0000" in text:
        raise InvalidRequest("payload", "must not contain a NUL character (PostgreSQL jsonb refuses it)")
    size = len(text.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidRequest("payload", f"is {size} bytes of JSON; at most {MAX_PAYLOAD_BYTES} are allowed")
    return text
