"""What an executor did: attempts by kind, result and whether the write took effect; actions it ended.

The labels are the metric labels the dashboards and alerts use. An action that ends UNCERTAIN logs exactly one
WARNING here, with its kind, reason and id, never its recipient or payload. Whoever runs the executor can
listen for the actions it ends (`listeners`): the Prefect drain turns the UNCERTAIN ones, and the FAILED
emails, into Prefect events. A listener runs on the executor's event loop and must not block.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("outbox.executor")


@dataclass(frozen=True)
class EndedAction:
    """An action this executor ended: what an operator needs to find it, never its recipient or payload."""

    id: int
    kind: str
    state: str
    reason: str
    # the email notice's name (EMAIL actions), else None
    notice: str | None


@dataclass
class Outcomes:
    # (kind, result, recorded) -> attempts
    attempts: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    # (kind, state, reason) -> actions ended by this executor
    ended: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    listeners: list[Callable[[EndedAction], None]] = field(default_factory=list)

    def attempt(self, kind: str, result: str, recorded: bool) -> None:
        self.attempts[(kind, result, recorded)] += 1

    def end(self, action_id: int, kind: str, state: str, reason: str, notice: str | None = None) -> None:
        self.ended[(kind, state, reason)] += 1
        if state == "UNCERTAIN":
            log.warning("action %s of kind %s ended UNCERTAIN: %s", action_id, kind, reason)
        ended = EndedAction(action_id, kind, state, reason, notice)
        for listener in self.listeners:
            try:
                listener(ended)
            except Exception:  # a listener's fault never stops the executor
                log.exception("a listener failed on action %s", action_id)

    @property
    def attempted(self) -> int:
        return sum(self.attempts.values())

    @property
    def ended_count(self) -> int:
        return sum(self.ended.values())
