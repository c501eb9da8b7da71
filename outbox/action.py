"""Action: one row of `agent_action` as callers read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from outbox.states import ActionState, StopReason


@dataclass(frozen=True)
class Action:
    id: int
    kind: str
    workspace_id: int | None
    lane_key: str
    idempotency_key: str
    payload: Any
    subject_account_id: int | None
    max_attempts: int
    expires_at: datetime | None
    state: ActionState
    attempt: int
    epoch: int
    due_at: datetime
    lease_expires_at: datetime | None
    write_started_at: datetime | None
    stop_reason: StopReason | None
    readback_ref: str | None
    created_at: datetime
    ended_at: datetime | None
    # the reason of the latest attempt that did not succeed: stage, reply code, short reason (never an address)
    last_error: str | None = None
    # what finds the action at its provider, kept after it ends; EMAIL: {"notice": ..., "message_id": ...}
    trace: dict[str, str] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Action:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["state"] = ActionState(values["state"])
        if values["stop_reason"] is not None:
            values["stop_reason"] = StopReason(values["stop_reason"])
        return cls(**values)
