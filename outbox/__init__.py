"""outbox: carry out a product's effects on the outside world as reliably as the database that records them.

The public API, re-exported; nothing else.
"""

from outbox.action import Action
from outbox.enqueue import admit, cancel, enqueue, enqueue_async, refuse
from outbox.erasure import erase_account, erase_account_async
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
    "cancel",
    "enqueue",
    "enqueue_async",
    "erase_account",
    "erase_account_async",
    "refuse",
]
