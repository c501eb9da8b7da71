"""Executor: the claim loop every replica runs, the attempts it carries out, and how it stops.

    loop: sweep (expire unstarted, take back expired leases) ─▶ claim ready lane heads (<= free slots)
          ─▶ one task per attempt: adapter.execute(attempt) ─▶ result ─▶ FinishWrite ─▶ Committer
          wait for: NOTIFY from an enqueue, a finished attempt (its lane's next head), or the poll interval

An adapter notes what finds its action at the provider (`attempt.note`, outbox.executor.attempt): the
committer writes that trace with the fence or the result, and an action that ends (here, or in the sweep,
which reads the trace from its row) reaches Outcomes as an EndedAction carrying it. The executor reads no
payload and names no kind: what the log line and the listeners show of an ended action is its trace.

There is no leader: every replica runs the same loop, and SKIP LOCKED keeps them apart. Every time is
the database clock; local time only measures the write window (monotonic, relative to the fence).
On stop, claiming ends, fences refuse, claimed actions that have not fenced go back to their lanes
without counting the attempt, and fenced ones finish inside their window.

    adapter raised ─▶ fenced?            ─ yes ─▶ Uncertain ERROR_AFTER_WRITE (the effect may exist)
                   ─▶ outbox's own fault? ─ yes ─▶ OutboxFault: back to its lane, attempt not counted,
                                                   1 s doubling to 60 s, one WARNING (class, short message)
                   ─▶ otherwise               ─▶ Retry (counts; FAILED / ATTEMPTS_EXHAUSTED at the last)

An own fault is a failure of outbox's database or connection pool (`own_database_fault`):
the database restarting or failing over, a dropped connection, a pool with no connection free in time. A
bug or bad data (a missing table, a broken constraint) is not one and spends attempts like any other
exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import socket
import uuid
from collections import Counter
from collections.abc import Awaitable, Iterable
from typing import TypeVar

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import tracing
from outbox._internal.connections.engines import conninfo, fault_text, url_conninfo
from outbox._internal.connections.faults import own_database_fault
from outbox._internal.connections.opening import behind_pooler, connect_async
from outbox.executor.adapter import ActionAdapter
from outbox.executor.attempt import ActionAttempt, DestinationWaits, FenceRefused
from outbox.executor.backoff import own_fault_delay, retry_delay
from outbox.executor.claimed import AttemptReport, ClaimedAction, FinishWrite
from outbox.executor.committer import Committer
from outbox.executor.config import WRITE_WINDOW_SECONDS, ExecutorConfig
from outbox.executor.destinations import Destinations
from outbox.executor.outcomes import EndedAction, Outcomes
from outbox.executor.results import (
    Abandoned,
    Cancelled,
    CredentialsRefused,
    Defer,
    Done,
    Failed,
    OutboxFault,
    Result,
    Retry,
    SlowDown,
    Uncertain,
    result_name,
)
from outbox.executor.slow_start import INITIAL_WINDOW
from outbox.executor.store import CALL_SECONDS, ExecutorStore, Shares
from outbox.kinds import ActionKind
from outbox.states import ActionState, StopReason
from outbox.store import application as store
from outbox.store.destinations import PAUSED_CHANNEL

log = logging.getLogger("outbox.executor")

_STOPPING = "the executor is stopping"
_T = TypeVar("_T")
# how long a busy executor with fewer than half a claim's slots free waits for more before it claims for the few
# it has: each claim, fence and result statement costs about the same whatever its size, so fewer, fuller ones
# cost less per action (a no-op burn-down: a quarter's threshold 0.062 s of executor and 0.113 s of server CPU
# per 1,000 actions, half's 0.057 and 0.100)
GATHER_SECONDS = 0.005
# how long the enqueue listener hears nothing before it checks that its connection still answers
LISTEN_CHECK_SECONDS = 30.0
# how long the claims stay plain after a claim by shares found only the one destination past its share
ALONE_SECONDS = 1.0


class Executor:
    def __init__(
        self,
        engine: AsyncEngine,
        adapters: Iterable[ActionAdapter],
        config: ExecutorConfig | None = None,
        *,
        listen: bool = True,
        listen_url: str | None = None,
    ) -> None:
        """`listen`: wake on an enqueue's NOTIFY (else poll every `config.poll_seconds` only). `listen_url`:
        the database URL to LISTEN on (`OUTBOX_LISTEN_DATABASE_URL`: a direct connection, or a pooler in
        session mode) when the engine's connections go through a pooler in transaction mode, where a LISTEN
        would silently stop hearing. None: the engine's own URL, unless its connections go through a pooler;
        then the executor polls."""
        self._engine = engine
        self._listen_url = url_conninfo(listen_url) if listen_url else None
        self._store = ExecutorStore(conninfo(engine))
        self._adapters: dict[str, ActionAdapter] = {}
        for adapter in adapters:
            if adapter.kind.name in self._adapters:
                raise ValueError(f"kind {adapter.kind} has two adapters; each kind has exactly one")
            self._adapters[adapter.kind.name] = adapter
        if not self._adapters:
            raise ValueError("an executor needs at least one adapter")
        self._kinds = sorted(self._adapters)
        self._at_most_once = [k.name for k in ActionKind.all() if k.at_most_once]
        self.config = config or ExecutorConfig()
        self._listen = listen
        self.outcomes = Outcomes()
        self._destinations = Destinations(self._store, self._adapters.values(), self.config, self.outcomes)
        self._inflight: dict[asyncio.Task[None], ActionAttempt] = {}
        # attempts in flight by destination: the claim keeps each within its share while others have due heads
        self._by_destination: Counter[str] = Counter()
        # the destinations whose last attempt here was answered (accepted, or refused for good): only they may
        # pass their share. A timeout, an error, a slow-down takes one out of it (_note_answer)
        self._answered: set[str] = set()
        # until when (loop time) the claim is plain although one destination is past its share: the last claim
        # by shares found no other destination's head
        self._alone_until = 0.0
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._committer: Committer | None = None
        # set once the executor has registered (its heartbeat row) and starts claiming
        self.claiming = asyncio.Event()
        # names this executor's heartbeat row (agent_executor)
        self.executor_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    @property
    def kinds(self) -> list[str]:
        """The kinds this executor carries out (one adapter each), sorted."""
        return list(self._kinds)

    # ---- control ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; hand back what has not fenced; let fenced attempts finish. Safe from a signal."""
        self._stopping = True
        if self._committer is not None:
            self._committer.refuse_fences = _STOPPING
        if self._wake is not None:
            self._wake.set()

    async def run(
        self, *, until_idle: bool = False, max_actions: int | None = None, max_seconds: float | None = None
    ) -> Outcomes:
        """Claim and carry out actions until stopped, or until idle, a claim budget or a time is reached."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._committer = Committer(self._engine)
        self._committer.start()
        if self._stopping:
            self._committer.refuse_fences = _STOPPING
        listener = asyncio.create_task(self._listen_for_notifications()) if self._listen else None
        deadline = loop.time() + max_seconds if max_seconds is not None else math.inf
        budget = max_actions if max_actions is not None else math.inf
        next_sweep = 0.0
        gather_until = 0.0
        started = await self._tried(self._destinations.start())
        try:
            if not started:
                log.warning("the destinations' rates were not written: the database was unavailable")
            while not self._stopping and loop.time() < deadline and budget > 0:
                self._wake.clear()
                found = 0
                if loop.time() >= next_sweep:
                    found += await self._sweep(self._free_slots())
                    next_sweep = loop.time() + self.config.sweep_seconds
                    self.claiming.set()
                want = int(min(self._free_slots(), self.config.claim_size, budget))
                # Busy with few slots free: let more attempts end (at most GATHER_SECONDS) so that one claim
                # takes many heads; an idle executor claims at once.
                gathering = bool(self._inflight) and want < self.config.claim_size // 2 and loop.time() < gather_until
                if want > 0 and not gathering:
                    claimed = await self._claim(want)
                    budget -= len(claimed)
                    found += len(claimed)
                    gather_until = loop.time() + GATHER_SECONDS
                    if len(claimed) == want and self._free_slots() > 0:
                        continue  # more heads may be ready right now
                if until_idle and found == 0 and not self._inflight:
                    break
                timeout = min(
                    self.config.poll_seconds,
                    max(0.0, next_sweep - loop.time()),
                    deadline - loop.time(),
                )
                if self._free_slots() > 0:  # a held destination may allow more then
                    timeout = min(timeout, max(0.0, self._destinations.wake_at - loop.time()))
                if gathering:
                    timeout = min(timeout, gather_until - loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(timeout, 0.001))
        finally:
            await self._wind_down(hand_back=self._stopping)
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
        return self.outcomes

    def _free_slots(self) -> int:
        return self.config.concurrency - len(self._inflight)

    async def _wind_down(self, *, hand_back: bool) -> None:
        """Let in-flight attempts end. On stop, those that have not fenced go back to their lanes."""
        assert self._committer is not None
        if hand_back:
            self._committer.refuse_fences = _STOPPING
            await self._wait_inflight(self.config.handback_grace_seconds)
            for task, attempt in list(self._inflight.items()):
                if not attempt.fenced:
                    task.cancel()
            # fenced attempts end inside their write window; past it they are cut off and end UNCERTAIN
            await self._wait_inflight(WRITE_WINDOW_SECONDS + 5)
        else:
            await self._wait_inflight(self.config.lease_seconds)
        for task in self._inflight:
            task.cancel()
        await self._wait_inflight(None)
        await self._committer.close()
        await self._tried(self._store.leave(self.executor_id))
        await self._store.close()

    async def _wait_inflight(self, seconds: float | None) -> None:
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=seconds)

    # ---- finding work ----------------------------------------------------------------------------

    async def _claim(self, limit: int) -> list[ClaimedAction]:
        """Ready heads of open destinations, then of held ones as far as each allows (outbox.executor.destinations).
        Each statement's heads start before the next statement runs."""
        claimed = await self._claim_open(limit)
        if len(claimed) < limit:
            held = self._destinations.claim(limit - len(claimed), self.config.lease_seconds, self._kinds)
            claimed += await self._start(held)
        return claimed

    async def _claim_open(self, limit: int) -> list[ClaimedAction]:
        """Up to `limit` ready heads of open destinations, none past its share while another has due heads.
        When a destination could pass its share in this claim, the plain claim first takes as many heads as
        every destination has room for (none can pass its share in it): fewer found means nothing more is
        due (an idle executor's pickup, which so never pays the claim by shares); as many, the rest of the
        slots go to a claim by shares."""
        shares = self._shares(limit)
        if shares is not None:
            within = min(shares.rooms.values(), default=shares.cap)  # the room of the fullest destination
            if 0 < within < limit:
                claimed = await self._claim_heads(within, None)
                if len(claimed) < within:
                    return claimed
                return claimed + await self._claim_open(limit - within)
        claimed = await self._claim_heads(limit, shares)
        if shares is not None:
            self._note_alone(shares, claimed)
        return claimed

    async def _claim_heads(self, limit: int, shares: Shares | None) -> list[ClaimedAction]:
        """Up to `limit` ready heads of open destinations, by `shares` if given, each attempt started."""
        return await self._start(
            self._store.claim(
                limit, self.config.lease_seconds, self._kinds, some_held=self._destinations.some_held, shares=shares
            )
        )

    def _shares(self, limit: int) -> Shares | None:
        """Each destination's room for a claim of `limit`, when one could pass its share in it (None: none
        could, and the plain claim takes the first due)."""
        share = self.config.destination_share
        if max(self._by_destination.values(), default=0) + limit <= share:
            return None
        if asyncio.get_running_loop().time() < self._alone_until:
            return None
        rooms = {name: self._most(name, share) - n for name, n in self._by_destination.items() if n > 0}
        for name in self._destinations.starting():
            rooms.setdefault(name, self._most(name, share))
        # any other destination: its share, or what a slow start sends at first when it has not answered
        return Shares(min(share, INITIAL_WINDOW), rooms, frozenset(self._answered))

    def _most(self, name: str, share: int) -> int:
        """The most attempts of `name` a claim by shares leaves in flight here: its share, and while it has not
        answered, no more than its slow start lets send (the rest would hold slots waiting at the gate)."""
        window = None if name in self._answered else self._destinations.window(name)
        return share if window is None else min(share, window)

    def _note_alone(self, shares: Shares, claimed: list[ClaimedAction]) -> None:
        """After a claim by shares: when every head it took is of one destination, more of them than its room,
        and every other destination had room left, no other destination had a due head (the claim takes the
        heads within their rooms before any past one), so the claims of the next ALONE_SECONDS are plain. A
        busy executor serving one destination (one relay) so pays the claim by destination about once a
        second, not at every claim; another destination's new heads wait at most that long for their share."""
        destinations = {action.destination for action in claimed}
        if len(destinations) != 1:
            return
        alone = destinations.pop()
        others_had_room = all(room > 0 for name, room in shares.rooms.items() if name != alone)
        if len(claimed) > shares.rooms.get(alone, shares.cap) and others_had_room:
            self._alone_until = asyncio.get_running_loop().time() + ALONE_SECONDS

    async def _start(self, claim: Awaitable[list[ClaimedAction]]) -> list[ClaimedAction]:
        """The heads `claim` took (none when the database was unavailable), each attempt started."""
        claimed = await self._tried(claim) or []
        for action in claimed:
            self._spawn(action)
        return claimed

    async def _sweep(self, free: int) -> int:
        """Beat; end what expired before it started; take back expired leases. Returns the actions touched."""
        sweep = await self._tried(
            self._store.sweep(self.executor_id, free, self.config.lease_seconds, self._kinds, self._at_most_once)
        )
        await self._tried(self._destinations.refresh(self._kinds))
        if sweep is None:
            return 0
        for ended in sweep.ended:
            self.outcomes.end(ended)
        for action in sweep.claimed_again:
            log.info("action %s: lease expired, claimed again (attempt %s)", action.id, action.attempt)
            self._spawn(action)
        return len(sweep.ended) + len(sweep.claimed_again)

    @staticmethod
    async def _tried(call: Awaitable[_T]) -> _T | None:
        """`call`'s answer (an ExecutorStore call, psycopg's errors); None when the database was unavailable
        (the loop tries again)."""
        try:
            return await call
        except psycopg.Error as error:
            if not own_database_fault(error):
                raise
            log.warning("database unavailable, trying again: %s", fault_text(error))
            return None

    async def _listen_for_notifications(self) -> None:
        """Wake on NOTIFY from an enqueue's commit, and hold a destination another executor's slow-down
        paused (its attempts in flight here then wait for the pause; else only from the next sweep); on any
        failure, reconnect (polling and the sweeps cover the gap).

        A connection that heard nothing for LISTEN_CHECK_SECONDS is asked for a `SELECT 1`: a network that
        dropped it without a word (a proxy or pooler still acknowledging) would otherwise leave the listener
        deaf for good. Behind a pooler without `listen_url`, the executor does not listen: it polls."""
        url = self._listen_url or conninfo(self._engine)
        while True:
            try:
                async with await connect_async(url, autocommit=True) as conn:
                    if self._listen_url is None and behind_pooler(conn):
                        log.info(
                            "the database is reached through a connection pooler, where LISTEN does not last:"
                            " polling every %g s (set OUTBOX_LISTEN_DATABASE_URL to a direct connection to"
                            " wake at once)",
                            self.config.poll_seconds,
                        )
                        return
                    await conn.execute(f"LISTEN {store.NOTIFY_CHANNEL}")
                    await conn.execute(f"LISTEN {PAUSED_CHANNEL}")
                    while True:
                        async for heard in conn.notifies(timeout=LISTEN_CHECK_SECONDS):
                            if heard.channel == PAUSED_CHANNEL:
                                self._destinations.heard_paused(heard.payload, self._kinds)
                            elif self._wake is not None:
                                self._wake.set()
                        async with asyncio.timeout(CALL_SECONDS):
                            await conn.execute("SELECT 1")
            except (psycopg.Error, TimeoutError) as error:
                log.info("notification listener lost its connection (%s); polling meanwhile", error or "no answer")
                await asyncio.sleep(self.config.poll_seconds)

    # ---- one attempt -----------------------------------------------------------------------------

    def _spawn(self, action: ClaimedAction) -> None:
        assert self._committer is not None
        attempt = ActionAttempt(action, self._committer, self._destinations.gate)
        started = asyncio.get_running_loop().time()
        task = asyncio.create_task(self._carry_out(attempt, started), name=f"outbox-action-{action.id}")
        self._inflight[task] = attempt
        self._by_destination[action.destination] += 1
        task.add_done_callback(self._attempt_done)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        attempt = self._inflight.pop(task, None)
        if attempt is not None:
            self._destinations.ended(attempt.action)
            self._by_destination[attempt.action.destination] -= 1
            if self._by_destination[attempt.action.destination] <= 0:
                del self._by_destination[attempt.action.destination]
        if self._wake is not None:
            self._wake.set()  # a slot is free, and the lane's next head may be ready

    async def _carry_out(self, attempt: ActionAttempt, started: float) -> None:
        action = attempt.action
        with tracing.attempt_span(
            f"{action.kind.name} attempt", action.id, action.trace_context, self._span_attributes(action)
        ) as span:
            result = await self._result_of(attempt)
            result = await self._told_destinations(action, result)
            self._note_answer(action.destination, result)
            write, recorded = await self._record(attempt, result, started)
            if span.recording:
                span.finish(*_span_outcome(attempt, result, write, recorded=recorded))

    async def _told_destinations(self, action: ClaimedAction, result: Result) -> Result:
        """The result after its destination heard it (outbox.executor.destinations): a SlowDown waits the
        pause it wrote. A failure to write it never changes the result: the action waits its own backoff."""
        try:
            return await self._destinations.saw(action, result)
        except Exception as error:
            log.warning("destination %s: what an attempt told of it was not written: %s", action.destination, error)
            return result

    def _note_answer(self, destination: str, result: Result) -> None:
        """Whether `destination` answers: an attempt it accepted or refused for good (Done, Failed) lets it pass
        its share while others have due heads; one it did not answer, or answered by failing (Retry, Uncertain, a
        slow-down, refused credentials), keeps it to its share until it answers again. A destination whose attempts
        time out one after another so never takes more than its share, however many of them have ended. Another
        Defer (one action's "not now"), the executor's own fault, a cancel or an abandon says nothing of it."""
        if isinstance(result, Done | Failed):
            self._answered.add(destination)
        elif isinstance(result, Retry | Uncertain | SlowDown | CredentialsRefused):
            self._answered.discard(destination)

    def _span_attributes(self, action: ClaimedAction) -> dict[str, tracing.AttributeValue]:
        """What an attempt's span says from its start: never the lane key, which may name a person."""
        return {
            "outbox.action.id": action.id,
            "outbox.action.kind": action.kind.name,
            "outbox.attempt": action.attempt,
            "outbox.max_attempts": action.max_attempts,
            "outbox.epoch": action.epoch,
            "outbox.executor.id": self.executor_id,
        }

    async def _result_of(self, attempt: ActionAttempt) -> Result:
        """The adapter's result, or the one the executor decides for an exception it raised."""
        action = attempt.action
        adapter = self._adapters[action.kind.name]
        try:
            result: Result = await adapter.execute(attempt)
        except DestinationWaits as waits:
            # its destination is paused, or its turn is far off: nothing was written, the attempt does not count
            result = Defer(waits.seconds, waits.reason)
        except FenceRefused as refused:
            # before the fence: nothing was written. After it: the window closed before the provider call.
            result = Retry(refused.reason) if attempt.fenced else Abandoned(refused.reason)
        except asyncio.CancelledError:
            result = _uncertain_after_error("cancelled") if attempt.fenced else Abandoned(_STOPPING)
        except Exception as error:
            if attempt.fenced:
                log.exception("action %s: adapter failed after its fence", action.id)
                # the class only: the message may hold anything, a recipient included (the log has it)
                result = _uncertain_after_error(f"the adapter raised {type(error).__name__} after its fence")
            elif own_database_fault(error):
                # No window was granted, so the provider was not called. The fence itself may have raised.
                # A connection lost in the fence's transaction, its COMMIT included, does not raise: the
                # committer tries again, and a fence that had committed commits again under the same epoch.
                # What does raise (a pool or driver error the committer does not try again) may come after
                # the fence's COMMIT took effect, so write_started_at may be set under this epoch although
                # nothing was sent. The deferral puts back what the claim found, under the same epoch, once
                # the fence's transaction has ended (the committer skips a locked row and comes back): true
                # either way. An at-most-once action goes back with no mark of a write, as it made none,
                # and a later claim sends it once; a read-back one keeps an earlier attempt's mark. If the
                # deferral is never recorded, the lease expires with the mark set, and an at-most-once
                # action ends UNCERTAIN: never sent twice.
                result = _own_fault(action, error)
            else:
                log.warning("action %s: adapter failed before its fence: %r", action.id, error)
                result = Retry(f"the adapter raised {type(error).__name__} before its fence")
        if isinstance(result, Abandoned) and not attempt.fenced and self._stopping:
            result = Defer(0.0, _STOPPING)  # hand it back to its lane: the attempt does not count
        return result

    async def _record(self, attempt: ActionAttempt, result: Result, started: float) -> tuple[FinishWrite | None, bool]:
        """Write the result (through the committer) and count it; what it wrote, and whether it took effect."""
        action = attempt.action
        write = finish_write(action, result, fenced=attempt.fenced)
        assert self._committer is not None
        seconds = asyncio.get_running_loop().time() - started
        report = AttemptReport(result_name(result), seconds, action.pickup_seconds)
        recorded = await self._committer.finish(action, write, report, attempt.noted_trace())
        self.outcomes.attempt(action.kind.name, result_name(result), recorded)
        if recorded and write is not None and write.stop_reason is not None:
            self.outcomes.end(EndedAction(action.id, action.kind.name, write.state, write.stop_reason, attempt.trace))
        if not recorded and write is not None:
            log.info(
                "action %s: %s under epoch %s was not recorded (a newer claim or an erasure)",
                action.id,
                result_name(result),
                action.epoch,
            )
        return write, recorded


def _span_outcome(
    attempt: ActionAttempt, result: Result, write: FinishWrite | None, *, recorded: bool
) -> tuple[dict[str, tracing.AttributeValue | None], str | None]:
    """An attempt span's closing attributes, and its error (UNCERTAIN or FAILED: the result's reason). Every
    result but Done says why in `outbox.reason` (a status or a reply, as `last_error` keeps it: never an
    address), and a Defer how long it waits."""
    attributes: dict[str, tracing.AttributeValue | None] = {
        "outbox.result": result_name(result),
        "outbox.reason": None if isinstance(result, Done) else result.reason or None,
        "outbox.defer_seconds": result.after if isinstance(result, Defer) else None,
        "outbox.recorded": recorded,
        "outbox.state": str(write.state) if write is not None else None,
        "outbox.stop_reason": str(write.stop_reason) if write is not None and write.stop_reason else None,
    }
    attributes |= {f"outbox.trace.{name}": value for name, value in attempt.trace.items()}
    failed = write is not None and write.state in (ActionState.UNCERTAIN, ActionState.FAILED)
    return attributes, (write.last_error or write.state) if failed and write is not None else None


def _uncertain_after_error(reason: str) -> Uncertain:
    return Uncertain(reason, StopReason.ERROR_AFTER_WRITE)


def _own_fault(action: ClaimedAction, error: BaseException) -> OutboxFault:
    # epoch - attempt: the claims of this action that did not count so far (own faults, deferrals, stops)
    delay = own_fault_delay(action.epoch - action.attempt)
    text = fault_text(error)
    log.warning(
        "action %s of kind %s: outbox's database failed before the fence (%s); back in %.1f s, "
        "the attempt does not count",
        action.id,
        action.kind.name,
        text,
        delay,
    )
    return OutboxFault(delay, text)


def finish_write(action: ClaimedAction, result: Result, *, fenced: bool = True) -> FinishWrite | None:
    """The row values a result writes, exactly as the results table (outbox.executor.results) says.

    A retry clears only its own attempt's fence. An attempt that never fenced (an exception before the
    fence counts as a retry) proves nothing about an earlier attempt's write: it keeps what its claim
    found, so the next attempt of a read-back kind still looks before it writes. An OutboxFault is a
    Defer and writes as one. Every reason a result carries becomes the action's last_error (`error_text`);
    DONE clears it.
    """
    match result:
        case Done(readback_ref=ref):
            return FinishWrite(ActionState.DONE, StopReason.CONFIRMED, readback_ref=ref)
        case Retry(reason=text, after=after):
            if action.attempt >= action.max_attempts:
                return FinishWrite(ActionState.FAILED, StopReason.ATTEMPTS_EXHAUSTED, last_error=error_text(text))
            delay = after if after is not None else retry_delay(action.attempt, action.kind.retry_schedule)
            fence = "clear" if fenced else "restore"
            return FinishWrite(ActionState.ADMITTED, delay_seconds=delay, fence=fence, last_error=error_text(text))
        case Defer(reason=text, after=after):
            return FinishWrite(
                ActionState.ADMITTED, delay_seconds=after, uncount=1, fence="restore", last_error=error_text(text)
            )
        case Uncertain(reason=text, stop_reason=reason):
            return FinishWrite(ActionState.UNCERTAIN, reason, last_error=error_text(text))
        case Failed(reason=text):
            return FinishWrite(ActionState.FAILED, StopReason.PROVIDER_REFUSED, last_error=error_text(text))
        case Cancelled(reason=text, stop_reason=reason):
            return FinishWrite(ActionState.CANCELLED, reason, last_error=error_text(text))
        case Abandoned():
            return None


# the longest last_error kept (migration 0006 checks the same bound)
LAST_ERROR_LIMIT = 500
# anything shaped like an address (local@domain), bracketed or not
_ADDRESS = re.compile(r"[^\s<>()\[\],;:\"']+@[^\s<>()\[\],;:\"']+")


def error_text(reason: str) -> str | None:
    """A result's reason as the action's last_error: whatever looks like an address left out, at most
    LAST_ERROR_LIMIT characters; None for no reason (the earlier last_error stays)."""
    text = _ADDRESS.sub("(an address)", reason).strip()
    return text[:LAST_ERROR_LIMIT] or None
