"""What an adapter returns: one of seven results.

| result    | use it when                                          | then                                        |
| Done      | the provider confirmed the effect                    | DONE / CONFIRMED, `readback_ref` kept       |
| Retry     | the provider proved it holds nothing; may succeed    | ADMITTED after a backoff, fence cleared;    |
|           |                                                      | FAILED / ATTEMPTS_EXHAUSTED at the last one |
| Defer     | not now, and nothing was written (a rate limit)      | ADMITTED after `after`; attempt not counted |
| SlowDown  | a Defer because the provider asked to slow down      | the same, and its destination pauses        |
| CredentialsRefused | a Defer: the provider refused the credentials | the same; its destination is held, one probe |
|           | (revoked, invalid, deactivated, 401)                 | every 5 minutes, until an attempt succeeds  |
| Uncertain | the effect may exist                                 | UNCERTAIN; nothing sends it again           |
| Failed    | the provider refused it, or nobody can receive it    | FAILED / PROVIDER_REFUSED                   |
| Cancelled | nothing should be written                            | CANCELLED / NOT_WANTED                      |
| Abandoned | the fence refused                                    | nothing: another holder owns the action     |

One more result is the executor's own, never an adapter's: `OutboxFault`, a Defer for an attempt that
outbox's own database or connection pool failed before the fence (see `outbox.executor.executor`).
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.executor.pacing import CREDENTIALS_PROBE_SECONDS
from outbox.states import ActionState, StopReason


def _check_reason(reason: StopReason, state: ActionState) -> None:
    if reason.state is not state:
        raise ValueError(f"a {state} result needs a {state} stop reason, not {reason}")


@dataclass(frozen=True)
class Done:
    readback_ref: str


@dataclass(frozen=True)
class Retry:
    reason: str
    # seconds to wait; None: the executor's exponential backoff with jitter
    after: float | None = None


@dataclass(frozen=True)
class Defer:
    after: float
    reason: str = ""


@dataclass(frozen=True)
class SlowDown(Defer):
    """The provider asked to slow down before anything was written (an SMTP 421, a 429): a Defer of this action,
    and a pause of its whole destination for every executor (outbox.executor.destinations), for `after` when
    the provider named the wait (`named`), else for the destination's backoff. `after` is also this action's
    wait when the pause cannot be written."""

    named: bool = False


@dataclass(frozen=True)
class CredentialsRefused(Defer):
    """The provider refused the destination's credentials (Slack's `invalid_auth`, `token_revoked`,
    `account_inactive`; an HTTP 401): nothing was written and no action can be until a person mends the secret.
    A Defer of this action that never counts, and its destination held for every executor as broken, one
    probe every CREDENTIALS_PROBE_SECONDS, the reason kept on its row and shown by `outbox destinations` and
    the `outbox_destination_credentials_refused` gauge; the first attempt accepted mends it. `reason` names
    what the provider answered, never the credentials. Returned as `CredentialsRefused(reason="...")`."""

    after: float = CREDENTIALS_PROBE_SECONDS


@dataclass(frozen=True)
class OutboxFault(Defer):
    """Outbox's own database or connection pool failed before the fence: a Defer (nothing was written, the
    attempt does not count), counted apart as OUTBOX_FAULT. The executor makes it; an adapter never returns it."""


@dataclass(frozen=True)
class Uncertain:
    reason: str
    # the executor names ERROR_AFTER_WRITE for an exception after the fence
    stop_reason: StopReason = StopReason.PROVIDER_UNCERTAIN

    def __post_init__(self) -> None:
        _check_reason(self.stop_reason, ActionState.UNCERTAIN)


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass(frozen=True)
class Cancelled:
    reason: str
    stop_reason: StopReason = StopReason.NOT_WANTED

    def __post_init__(self) -> None:
        _check_reason(self.stop_reason, ActionState.CANCELLED)


@dataclass(frozen=True)
class Abandoned:
    reason: str


Result = Done | Retry | Defer | Uncertain | Failed | Cancelled | Abandoned

# the label each result carries in metrics and summaries
RESULT_NAMES: dict[type[Result], str] = {
    Done: "DONE",
    Retry: "RETRY",
    Defer: "DEFER",
    SlowDown: "DEFER",
    CredentialsRefused: "DEFER",
    OutboxFault: "OUTBOX_FAULT",
    Uncertain: "UNCERTAIN",
    Failed: "FAILED",
    Cancelled: "CANCELLED",
    Abandoned: "ABANDONED",
}


def result_name(result: Result) -> str:
    return RESULT_NAMES[type(result)]
