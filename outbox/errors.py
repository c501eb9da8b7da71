"""The errors outbox raises to its callers: each names what was wrong."""

from __future__ import annotations


class OutboxError(Exception):
    """Base of every error outbox raises on purpose."""


class InvalidRequest(OutboxError, ValueError):
    """An input was refused before anything was written; the caller's transaction is still usable."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ActionNotFound(OutboxError, LookupError):
    def __init__(self, action_id: int) -> None:
        super().__init__(f"action {action_id} does not exist")
        self.action_id = action_id


class TransitionRefused(OutboxError):
    """An operator or API call asked for a move the action's current state does not allow."""

    def __init__(self, action_id: int, state: str, wanted: str) -> None:
        super().__init__(f"action {action_id} is {state}; it cannot become {wanted}")
        self.action_id = action_id
        self.state = state
        self.wanted = wanted
