"""outbox: carry out a product's effects on the outside world as reliably as the database that records them.

The public API, re-exported; nothing else.
"""

from outbox.action import Action
from outbox.enqueue import admit, enqueue, enqueue_async, refuse
from outbox.errors import ActionNotFound, InvalidRequest, OutboxError, TransitionRefused
from outbox.kinds import ActionKind
from outbox.requests import ActionRequest
from outbox.states import ActionState, StopReason

__all__ = [
    "Action",
    "ActionKind",
    "ActionNotFound",
    "ActionRequest",
    "ActionState",
    "InvalidRequest",
    "OutboxError",
    "StopReason",
    "TransitionRefused",
    "admit",
    "enqueue",
    "enqueue_async",
    "refuse",
]
