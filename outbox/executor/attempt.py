"""ActionAttempt: what an adapter receives for one claim, and the fence it must pass before writing.

    adapter ──attempt.fence().begin_write()──▶ Committer: write_started_at = now() under the claim's epoch,
                                                only while >= 60 s of the lease are left (own short txn)
            ◀── WriteWindow (deadline) or FenceRefused (taken by a newer claim, erased, lease too short)

An attempt whose destination is held (paced, rated or paused: outbox.executor.destinations) first waits for
its turn, so that the provider sees the pace however long each attempt took to reach its fence:

    attempt.fence().begin_write() ──gate──▶ its turn now, or after a wait (the attempt sleeps)
                                          ─▶ a wait longer than pacing's GATE_WAIT_SECONDS: DestinationWaits
                                             (the executor ends the attempt Defer: it does not count)

The window's deadline is local monotonic time: the time the fence was sent plus 60 s. The database
granted at least that much lease after it received the fence, so a replica whose wall clock is hours
off computes the same window.

The trace: what finds the action at its provider once its payload is gone (an email's notice and
Message-ID), for any kind. The adapter notes it on its attempt; outbox writes it, the adapter runs no SQL:

    adapter ──attempt.note(field=value, ...)──▶ the attempt's trace: the trace the claim found, these fields
                                                 added (a field noted again takes the new value)
            ──fence──▶ Committer: the trace with write_started_at, in the fence's transaction, so it is
                       durable before the provider call
    result  ──▶ Committer: the trace with the result (an attempt that never fenced, such as a refusal
                before it, keeps what it noted too); an attempt that noted nothing, or nothing since its
                fence wrote the trace, leaves the trace as it is

Whatever the executor shows of an ended action (the UNCERTAIN warning line, the listeners' EndedAction
and so the drain's Prefect events) is this trace. Its fields are names of lower case letters, digits and
underscores; its values are strings, integers, booleans or None; its JSON text is at most TRACE_LIMIT
characters, the bound the database checks (ck_agent_action_trace). It never holds a recipient, an address
or payload data: the reader role, the logs and the events show it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from outbox import tracing
from outbox.errors import OutboxError
from outbox.executor.claimed import ClaimedAction
from outbox.executor.config import WRITE_WINDOW_SECONDS

# the longest trace, as its JSON text (migration 0006 checks the same bound)
TRACE_LIMIT = 500
TraceValue = str | int | bool | None
_FIELD = re.compile(r"[a-z][a-z0-9_]*")


class WriteFence(Protocol):
    """Records that an attempt's write starts (the committer), with the attempt's trace when it noted one:
    None when granted, else why not."""

    async def begin_write(self, action: ClaimedAction, trace: Mapping[str, TraceValue] | None = None) -> str | None: ...


class FenceRefused(OutboxError):
    """The fence refused: do not call the provider. An adapter that lets this escape counts as Abandoned."""

    def __init__(self, action_id: int, reason: str) -> None:
        super().__init__(f"action {action_id}: fence refused: {reason}")
        self.reason = reason


class DestinationWaits(OutboxError):
    """The attempt's destination will not take it for `seconds` (a pause, or a turn further off than an
    attempt waits): the fence was not asked. An adapter lets it escape, and the executor ends the attempt
    Defer for that long. Not a FenceRefused, so an adapter that turns a refused fence into Abandoned leaves
    this one to the executor."""

    def __init__(self, action_id: int, seconds: float, reason: str) -> None:
        super().__init__(f"action {action_id}: {reason}")
        self.seconds = seconds
        self.reason = reason


# before its fence, an attempt waits for its destination's turn (None: an open destination, no wait)
Gate = Callable[[ClaimedAction], Awaitable[None]]


class WriteWindow:
    """Granted by the fence: the provider call must end before `deadline` (event-loop time)."""

    def __init__(self, action_id: int, deadline: float) -> None:
        self.action_id = action_id
        self.deadline = deadline

    def remaining(self) -> float:
        return self.deadline - asyncio.get_running_loop().time()

    def check(self) -> float:
        """Call immediately before the provider call: the seconds left, or FenceRefused if none are."""
        left = self.remaining()
        if left <= 0:
            raise FenceRefused(self.action_id, "the write window closed before the provider call")
        return left


class Fence:
    def __init__(self, attempt: ActionAttempt) -> None:
        self._attempt = attempt

    async def begin_write(self) -> WriteWindow:
        """Record that the write starts, in its own short transaction; raises FenceRefused."""
        attempt = self._attempt
        if attempt.window is not None:
            return attempt.window
        if attempt.gate is not None:
            await attempt.gate(attempt.action)
        sent_at = asyncio.get_running_loop().time()
        refusal = await attempt.committer.begin_write(attempt.action, attempt.noted_trace())
        tracing.fence_event(refusal)
        if refusal is not None:
            raise FenceRefused(attempt.action.id, refusal)
        attempt._noted = False  # the fence wrote the trace as it stands: the result writes it only if noted since
        attempt.window = WriteWindow(attempt.action.id, sent_at + WRITE_WINDOW_SECONDS)
        return attempt.window


class ActionAttempt:
    """One attempt at one action. Only the executor creates it."""

    def __init__(self, action: ClaimedAction, committer: WriteFence, gate: Gate | None = None) -> None:
        self.action = action
        self.committer = committer
        self.gate = gate
        self.window: WriteWindow | None = None
        self._trace: dict[str, TraceValue] = dict(action.trace or {})
        self._noted = False

    def note(self, **fields: TraceValue) -> None:
        """Add `fields` to the action's trace, written with this attempt's fence or result. Refuses (and
        adds nothing) a field name or value the trace cannot hold, or a trace longer than TRACE_LIMIT."""
        for name, value in fields.items():
            _check_field(name, value)
        trace = {**self._trace, **fields}
        length = len(trace_text(trace))
        if length > TRACE_LIMIT:
            raise ValueError(f"the trace would be {length} characters of JSON, more than {TRACE_LIMIT}")
        self._trace = trace
        self._noted = self._noted or bool(fields)

    @property
    def trace(self) -> Mapping[str, TraceValue]:
        """The action's trace as this attempt leaves it: what the claim found, with what it noted."""
        return dict(self._trace)

    def noted_trace(self) -> Mapping[str, TraceValue] | None:
        """The trace to write: None when this attempt noted nothing since its fence wrote the trace, or nothing
        at all (the stored trace stays as it is)."""
        return self.trace if self._noted else None

    def write_started(self) -> bool:
        """True when an earlier attempt may have written: a read-back adapter looks before writing."""
        return self.action.prior_write_started_at is not None

    def claimed_before(self) -> bool:
        """True when this action was claimed before this attempt: an earlier attempt may have written,
        even where a retry after its fence cleared the mark `write_started()` reads. An adapter that looks
        up its earlier write whenever this is true never depends on that mark."""
        return self.action.epoch > 1

    def uncounted_claims(self) -> int:
        """The earlier claims of this action that did not count: deferrals, outbox's own faults and hand-backs
        on stop. A claim raises epoch and attempt together and such a result lowers attempt again, so this is
        `epoch - attempt`. A slow-down's wait grows with it (`outbox.executor.backoff.slow_down_delay`)."""
        return self.action.epoch - self.action.attempt

    def fence(self) -> Fence:
        return Fence(self)

    @property
    def fenced(self) -> bool:
        """This attempt passed its fence: from here on an error means the effect may exist."""
        return self.window is not None


def trace_text(trace: Mapping[str, TraceValue]) -> str:
    """The trace as the JSON text the database measures."""
    return json.dumps(trace, ensure_ascii=False)


def _check_field(name: str, value: object) -> None:
    if not _FIELD.fullmatch(name):
        raise ValueError(f"trace field {name!r}: a name of lower case letters, digits and underscores")
    if value is not None and not isinstance(value, str | int | bool):
        raise TypeError(f"trace field {name}: a str, int, bool or None, not {type(value).__name__}")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"trace field {name}: the database cannot keep a NUL character")
