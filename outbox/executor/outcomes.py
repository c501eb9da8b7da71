"""What an executor did: attempts by kind, result and whether the write took effect; actions it ended.

    attempt's result recorded ─┐
    sweep (expired, lease lost)─┴─▶ Outcomes.end(EndedAction: id, kind, state, reason, trace)
        ─▶ the ended tally ─▶ UNCERTAIN: one WARNING line ─▶ each listener (the drain: a Prefect event)

The labels are the metric labels the dashboards and alerts use. An action that ends UNCERTAIN logs exactly one
WARNING here, with its kind, reason and id, and the trace its adapter noted (outbox.executor.attempt), never
its recipient or payload. Whatever is shown of an ended action beyond its id, kind, state and reason is its
trace, the same for every kind. Whoever runs the executor can listen for the actions it ends (`listeners`):
the Prefect drain turns the UNCERTAIN and FAILED ones into Prefect events. A listener runs on the executor's
event loop and must not block. The changes it makes to destinations (paused, broken, refused, mended, resumed)
are logged (broken and refused as WARNINGs) and go to `destination_listeners` the same way.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("outbox.executor")


@dataclass(frozen=True)
class EndedAction:
    """An action this executor ended: what an operator needs to find it, never its recipient or payload."""

    id: int
    kind: str
    state: str
    reason: str
    # the fields its adapter noted (an email's notice and Message-ID); empty when it noted none
    trace: Mapping[str, Any] = field(default_factory=dict)


def shown_trace(trace: Mapping[str, Any]) -> str:
    """A trace on one line, `field=value` each, a string value in JSON quotes (no control character)."""
    return " ".join(f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in trace.items())


@dataclass(frozen=True)
class DestinationChange:
    """A change this executor made to a destination (outbox.executor.destinations): `paused` (for `seconds`),
    `broken`, `refused` (its credentials: probed again in `seconds`), `mended`, or `resumed` (a pause it made ended);
    `reason` never holds a recipient."""

    name: str
    kind: str
    change: str
    reason: str
    seconds: float | None = None


@dataclass
class Outcomes:
    # (kind, result, recorded) -> attempts
    attempts: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    # (kind, state, reason) -> actions ended by this executor
    ended: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    listeners: list[Callable[[EndedAction], None]] = field(default_factory=list)
    # (destination, change) -> the changes this executor made
    destinations: Counter[tuple[str, str]] = field(default_factory=Counter)
    destination_listeners: list[Callable[[DestinationChange], None]] = field(default_factory=list)

    def attempt(self, kind: str, result: str, recorded: bool) -> None:
        self.attempts[(kind, result, recorded)] += 1

    def end(self, ended: EndedAction) -> None:
        self.ended[(ended.kind, ended.state, ended.reason)] += 1
        if ended.state == "UNCERTAIN":
            trace = f" ({shown_trace(ended.trace)})" if ended.trace else ""
            log.warning("action %s of kind %s ended UNCERTAIN: %s%s", ended.id, ended.kind, ended.reason, trace)
        for listener in self.listeners:
            try:
                listener(ended)
            except Exception:  # a listener's fault never stops the executor
                log.exception("a listener failed on action %s", ended.id)

    def destination(self, change: DestinationChange) -> None:
        self.destinations[(change.name, change.change)] += 1
        lasting = f" for {change.seconds:.3g} s" if change.seconds is not None else ""
        level = logging.WARNING if change.change in ("broken", "refused") else logging.INFO
        log.log(level, "destination %s (%s) %s%s: %s", change.name, change.kind, change.change, lasting, change.reason)
        for listener in self.destination_listeners:
            try:
                listener(change)
            except Exception:  # a listener's fault never stops the executor
                log.exception("a listener failed on destination %s", change.name)

    @property
    def attempted(self) -> int:
        return sum(self.attempts.values())

    @property
    def ended_count(self) -> int:
        return sum(self.ended.values())
