"""The adapter contract: one adapter per kind, called only by the executor."""

from __future__ import annotations

from typing import Protocol

from outbox.executor.attempt import ActionAttempt
from outbox.executor.results import Result
from outbox.kinds import ActionKind


class ActionAdapter(Protocol):
    """Carries out actions of one kind. Call `attempt.fence().begin_write()` just before the provider
    call, never call the provider when it refuses (return Abandoned), and end the provider call before
    the window's deadline. Only `Executor` calls `execute`."""

    @property
    def kind(self) -> ActionKind: ...

    async def execute(self, attempt: ActionAttempt) -> Result: ...
