"""The executor: claims lane heads, hands each to its kind's adapter through a fenced attempt, records results.

claim (lane heads, SKIP LOCKED, epoch+1) ──▶ ActionAttempt ──fence──▶ adapter.execute ──▶ provider
      ▲                                                       │ result
      │ NOTIFY / poll                                          ▼
enqueue                                  Committer (group commit, each write named by its epoch)
"""

from outbox.executor.adapter import ActionAdapter
from outbox.executor.attempt import ActionAttempt, FenceRefused, WriteWindow
from outbox.executor.executor import Executor, ExecutorConfig
from outbox.executor.results import Abandoned, Cancelled, Defer, Done, Failed, Result, Retry, Uncertain

__all__ = [
    "Abandoned",
    "ActionAdapter",
    "ActionAttempt",
    "Cancelled",
    "Defer",
    "Done",
    "Executor",
    "ExecutorConfig",
    "Failed",
    "FenceRefused",
    "Result",
    "Retry",
    "Uncertain",
    "WriteWindow",
]
