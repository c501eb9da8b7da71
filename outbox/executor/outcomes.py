"""What an executor did: attempts by kind, result and whether the write took effect; actions it ended.

The labels are the metric labels the dashboards and alerts use. An action that ends UNCERTAIN logs exactly one
WARNING here, with its kind, reason and id, never its recipient or payload.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger("outbox.executor")


@dataclass
class Outcomes:
    # (kind, result, recorded) -> attempts
    attempts: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    # (kind, state, reason) -> actions ended by this executor
    ended: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def attempt(self, kind: str, result: str, recorded: bool) -> None:
        self.attempts[(kind, result, recorded)] += 1

    def end(self, action_id: int, kind: str, state: str, reason: str) -> None:
        self.ended[(kind, state, reason)] += 1
        if state == "UNCERTAIN":
            log.warning("action %s of kind %s ended UNCERTAIN: %s", action_id, kind, reason)

    @property
    def attempted(self) -> int:
        return sum(self.attempts.values())

    @property
    def ended_count(self) -> int:
        return sum(self.ended.values())
