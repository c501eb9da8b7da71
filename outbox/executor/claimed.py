"""What the executor, its attempts and its committer pass between them: the claimed action, the window its
provider call must fit in, the row values one result writes, and what the metrics count of one attempt."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox.kinds import ActionKind


@dataclass(frozen=True)
class ClaimedAction:
    """An action as one claim took it. `epoch` names every write this attempt makes."""

    id: int
    kind: ActionKind
    lane_key: str
    idempotency_key: str
    workspace_id: int | None
    subject_account_id: int | None
    payload: Any
    attempt: int
    max_attempts: int
    epoch: int
    # write_started_at as the claim found it: an earlier attempt may have written
    prior_write_started_at: datetime | None
    due_at: datetime
    # the lease left when the claim committed, on the database clock
    lease_seconds: float
    # due to claim, on the database clock; None for a reclaim after a lost lease
    pickup_seconds: float | None = None
    # the trace earlier attempts noted (outbox.executor.attempt), as the claim found it
    trace: dict[str, Any] | None = None
    # the W3C trace context of the code that enqueued it (outbox.tracing), as stored; None: none was active
    trace_context: Any = None
    # where its effect goes (outbox.executor.destinations)
    destination: str = ""
    # when the claim took it, on the database clock: an adapter's read-back window starts from it, never from
    # the executor's own clock, which may be far off (a read-back from an instant after the write finds nothing)
    claimed_at: datetime | None = None


@dataclass(frozen=True)
class FinishWrite:
    """The row values one result writes."""

    state: str
    stop_reason: str | None = None
    readback_ref: str | None = None
    delay_seconds: float = 0.0
    uncount: int = 0
    # keep the fence, clear it (a proven retry), or restore what the claim found (a deferral)
    fence: str = "keep"
    # the result's reason, kept as the action's last_error; None keeps the earlier one (DONE clears it)
    last_error: str | None = None


@dataclass(frozen=True)
class AttemptReport:
    """What the metrics count of one attempt, tallied in the transaction of its result."""

    result: str
    attempt_seconds: float
    # due to claim; None for a reclaim after a lost lease, whose due time is long past
    pickup_seconds: float | None
