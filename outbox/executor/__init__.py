"""The executor: claims lane heads, hands each to its kind's adapter through a fenced attempt, records results.

claim (lane heads, SKIP LOCKED, epoch+1) ──▶ ActionAttempt ──fence──▶ adapter.execute ──▶ provider
      ▲                                                       │ result
      │ NOTIFY / poll                                          ▼
enqueue                                  Committer (group commit, each write named by its epoch)

Each name loads its module on first use, so `outbox.executor.config` (the defaults) loads without the
database layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox.executor.adapter import ActionAdapter
    from outbox.executor.attempt import ActionAttempt, DestinationWaits, FenceRefused, WriteWindow
    from outbox.executor.config import ExecutorConfig
    from outbox.executor.executor import Executor
    from outbox.executor.results import (
        Abandoned,
        Cancelled,
        CredentialsRefused,
        Defer,
        Done,
        Failed,
        Result,
        Retry,
        SlowDown,
        Uncertain,
    )

_HOMES = {
    "Abandoned": "outbox.executor.results",
    "ActionAdapter": "outbox.executor.adapter",
    "ActionAttempt": "outbox.executor.attempt",
    "Cancelled": "outbox.executor.results",
    "CredentialsRefused": "outbox.executor.results",
    "Defer": "outbox.executor.results",
    "DestinationWaits": "outbox.executor.attempt",
    "Done": "outbox.executor.results",
    "Executor": "outbox.executor.executor",
    "ExecutorConfig": "outbox.executor.config",
    "Failed": "outbox.executor.results",
    "FenceRefused": "outbox.executor.attempt",
    "Result": "outbox.executor.results",
    "Retry": "outbox.executor.results",
    "SlowDown": "outbox.executor.results",
    "Uncertain": "outbox.executor.results",
    "WriteWindow": "outbox.executor.attempt",
}

__all__ = [
    "Abandoned",
    "ActionAdapter",
    "ActionAttempt",
    "Cancelled",
    "CredentialsRefused",
    "Defer",
    "DestinationWaits",
    "Done",
    "Executor",
    "ExecutorConfig",
    "Failed",
    "FenceRefused",
    "Result",
    "Retry",
    "SlowDown",
    "Uncertain",
    "WriteWindow",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
