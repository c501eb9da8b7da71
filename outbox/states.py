"""The lifecycle of an action: its seven states, the transitions between them, and why it stopped.

`TRANSITIONS` is the one table of allowed moves; the trigger `guard_agent_action` enforces the same table
in the database and `tests/test_store_lifecycle.py` tries all 49 ordered pairs against it, so the two
cannot drift. `StopReason` is the closed set of reasons an ended action carries.
"""

from __future__ import annotations

import enum


class ActionState(enum.StrEnum):
    PROPOSED = "PROPOSED"
    ADMITTED = "ADMITTED"
    EXECUTING = "EXECUTING"
    DONE = "DONE"
    UNCERTAIN = "UNCERTAIN"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def ended(self) -> bool:
        return self in ENDED_STATES

    def may_become(self, target: ActionState) -> bool:
        return target in TRANSITIONS[self]


ENDED_STATES = frozenset({ActionState.DONE, ActionState.UNCERTAIN, ActionState.FAILED, ActionState.CANCELLED})

TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    # the server admits or refuses an agent's proposal (a proposal may also expire)
    ActionState.PROPOSED: frozenset({ActionState.ADMITTED, ActionState.CANCELLED}),
    # a claim takes it, or it expired before it started
    ActionState.ADMITTED: frozenset({ActionState.EXECUTING, ActionState.CANCELLED}),
    # a reclaim after the lease expired, a proven retry or a deferral, or the attempt ended it
    ActionState.EXECUTING: frozenset(
        {
            ActionState.EXECUTING,
            ActionState.ADMITTED,
            ActionState.DONE,
            ActionState.UNCERTAIN,
            ActionState.FAILED,
            ActionState.CANCELLED,
        }
    ),
    ActionState.DONE: frozenset(),
    ActionState.UNCERTAIN: frozenset(),
    ActionState.FAILED: frozenset(),
    ActionState.CANCELLED: frozenset(),
}


class StopReason(enum.StrEnum):
    """Why an ended action stopped. Each reason belongs to exactly one ended state."""

    CONFIRMED = "CONFIRMED"
    PROVIDER_REFUSED = "PROVIDER_REFUSED"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    PROVIDER_UNCERTAIN = "PROVIDER_UNCERTAIN"
    ERROR_AFTER_WRITE = "ERROR_AFTER_WRITE"
    LEASE_LOST_AFTER_WRITE = "LEASE_LOST_AFTER_WRITE"
    EXPIRED = "EXPIRED"
    PROPOSAL_REFUSED = "PROPOSAL_REFUSED"
    NOT_WANTED = "NOT_WANTED"
    # an operator cancelled an action that had not started (`outbox cancel`)
    OPERATOR_CANCELLED = "OPERATOR_CANCELLED"

    @property
    def state(self) -> ActionState:
        return REASON_STATE[self]


REASON_STATE: dict[StopReason, ActionState] = {
    StopReason.CONFIRMED: ActionState.DONE,
    StopReason.PROVIDER_REFUSED: ActionState.FAILED,
    StopReason.ATTEMPTS_EXHAUSTED: ActionState.FAILED,
    StopReason.PROVIDER_UNCERTAIN: ActionState.UNCERTAIN,
    StopReason.ERROR_AFTER_WRITE: ActionState.UNCERTAIN,
    StopReason.LEASE_LOST_AFTER_WRITE: ActionState.UNCERTAIN,
    StopReason.EXPIRED: ActionState.CANCELLED,
    StopReason.PROPOSAL_REFUSED: ActionState.CANCELLED,
    StopReason.NOT_WANTED: ActionState.CANCELLED,
    StopReason.OPERATOR_CANCELLED: ActionState.CANCELLED,
}
