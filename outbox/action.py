"""Action: one row of `agent_action` as callers read it, and what the enqueue that returned it found.

Two fields are not columns: `created` and `differing_fields` describe the enqueue call that returned the
action (see docs/concepts.md, "Enqueue"). Two actions are equal when their rows are: those fields are left
out of the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
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
    # True when this enqueue inserted the action; False when its idempotency key already held it (an earlier
    # action, or an earlier request of the same batch); None when the action was read, not enqueued
    created: bool | None = field(default=None, compare=False)
    # when the key already held it: the fields of this request that hold other values than the action
    # (of kind, workspace_id, lane_key, payload, subject_account_id); the action itself is unchanged
    differing_fields: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_row(cls, row: Mapping[Any, Any], *, created: bool | None = None) -> Action:
        # the compared fields are the row's columns
        values: dict[str, Any] = {f.name: row[f.name] for f in fields(cls) if f.compare}
        values["created"] = created
        values["state"] = ActionState(values["state"])
        if values["stop_reason"] is not None:
            values["stop_reason"] = StopReason(values["stop_reason"])
        return cls(**values)
