"""ActionAttempt: what an adapter receives for one claim, and the fence it must pass before writing.

    adapter ──attempt.fence().begin_write()──▶ Committer: write_started_at = now() under the claim's epoch,
                                                only while >= 60 s of the lease are left (own short txn)
            ◀── WriteWindow (deadline) or FenceRefused (taken by a newer claim, erased, lease too short)

The window's deadline is local monotonic time: the time the fence was sent plus 60 s. The database
granted at least that much lease after it received the fence, so a replica whose wall clock is hours
off computes the same window.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from outbox.errors import OutboxError
from outbox.executor.claimed import ClaimedAction
from outbox.executor.config import WRITE_WINDOW_SECONDS


class WriteFence(Protocol):
    """Records that an attempt's write starts (the committer): None when granted, else why not."""

    async def begin_write(self, action: ClaimedAction) -> str | None: ...


class FenceRefused(OutboxError):
    """The fence refused: do not call the provider. An adapter that lets this escape counts as Abandoned."""

    def __init__(self, action_id: int, reason: str) -> None:
        super().__init__(f"action {action_id}: fence refused: {reason}")
        self.reason = reason


class WriteWindow:
    """Granted by the fence: the provider call must end before `deadline` (event-loop time)."""

    def __init__(self, action_id: int, deadline: float) -> None:
        self.action_id = action_id
        self.deadline = deadline

    def remaining(self) -> float:
        return self.deadline - asyncio.get_running_loop().time()

    def check(self) -> float:
        """Call immediately before the provider call: the seconds left, or FenceRefused if none are."""
        left = self.remaining()
        if left <= 0:
            raise FenceRefused(self.action_id, "the write window closed before the provider call")
        return left


class Fence:
    def __init__(self, attempt: ActionAttempt) -> None:
        self._attempt = attempt

    async def begin_write(self) -> WriteWindow:
        """Record that the write starts, in its own short transaction; raises FenceRefused."""
        attempt = self._attempt
        if attempt.window is not None:
            return attempt.window
        sent_at = asyncio.get_running_loop().time()
        refusal = await attempt.committer.begin_write(attempt.action)
        if refusal is not None:
            raise FenceRefused(attempt.action.id, refusal)
        attempt.window = WriteWindow(attempt.action.id, sent_at + WRITE_WINDOW_SECONDS)
        return attempt.window


class ActionAttempt:
    """One attempt at one action. Only the executor creates it."""

    def __init__(self, action: ClaimedAction, committer: WriteFence) -> None:
        self.action = action
        self.committer = committer
        self.window: WriteWindow | None = None

    def write_started(self) -> bool:
        """True when an earlier attempt may have written: a read-back adapter looks before writing."""
        return self.action.prior_write_started_at is not None

    def fence(self) -> Fence:
        return Fence(self)

    @property
    def fenced(self) -> bool:
        """This attempt passed its fence: from here on an error means the effect may exist."""
        return self.window is not None
