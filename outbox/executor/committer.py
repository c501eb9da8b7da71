"""Group commit: the fences and results of concurrent attempts, many per statement.

    attempts ──(fence | result + FinishWrite + AttemptReport, future)──▶ queue ──▶ one statement
        (`ExecutorStore.commit`, its own transaction):
        lock the rows with SKIP LOCKED (a result's FOR UPDATE: an enqueue behind its lane's holder holds it)
        fence:  write_started_at where epoch and state still match and the lease covers the window
        result: the result's state where epoch and state still match; the attempt tallies beside it
        either: the attempt's trace (`attempt.note`), when it noted one, in the same row update
    committed ──▶ resolve each future. A row someone else holds waits for the next statement.

Every write names its own epoch, so batching never lets one attempt write for another, and a future
resolves only after its transaction committed: a provider call starts after its own fence is durable.

    every TALLY_MERGE_SECONDS, beside the batches ──▶ one short transaction of its own: merge_tallies
        (the tally rows folded into one per label set; skipped while another executor merges)

The merge runs as its own task on its own connection, so a batch never waits for it; it locks only tally
rows (SKIP LOCKED), which the batches only insert, so it never waits for a batch either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox._internal.connections.engines import conninfo, fault_text
from outbox._internal.connections.faults import own_database_fault
from outbox.executor.attempt import TraceValue
from outbox.executor.claimed import AttemptReport, ClaimedAction, FinishWrite
from outbox.executor.config import WRITE_WINDOW_SECONDS
from outbox.executor.store import ExecutorStore, Write, WriteOutcome

log = logging.getLogger("outbox.executor")

# how long a batch whose rows are all held by others waits before it tries again
_HELD_RETRY_SECONDS = 0.02
_MAX_BATCH = 500
# how often the tally rows are merged, and how long a merge may take or wait for a lock
TALLY_MERGE_SECONDS = 10.0
_MERGE_TIMEOUT_MS = 5000


@dataclass
class _Pending:
    action: ClaimedAction
    future: asyncio.Future[str | None] | asyncio.Future[bool] = field(repr=False)
    # None: a fence. Otherwise a result, which writes `finish` (None: writes nothing, as Abandoned)
    report: AttemptReport | None = None
    finish: FinishWrite | None = None
    # the attempt's trace to write with the fence or the result; None keeps the stored one
    trace: Mapping[str, TraceValue] | None = None


class Committer:
    def __init__(self, engine: AsyncEngine) -> None:
        self._store = ExecutorStore(conninfo(engine))
        self._merge_store = ExecutorStore(conninfo(engine))
        self._queue: list[_Pending] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._merger: asyncio.Task[None] | None = None
        self._stop_merging = asyncio.Event()
        self.merges = 0
        # when set, every new fence is refused with this reason without touching the database
        self.refuse_fences: str | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="outbox-committer")
        self._merger = asyncio.create_task(self._merge_periodically(), name="outbox-tally-merge")

    async def close(self, seconds: float = 30.0) -> None:
        """Finish what is queued, then stop. Writes still unmade after `seconds` (the database is gone)
        fail: their actions stay as the database has them, and their leases bring them back."""
        if self._task is None:
            return
        if self._merger is not None:
            self._stop_merging.set()
            # a merge in progress ends within its statement timeout, unless the database is unreachable
            merging, _ = await asyncio.wait({self._merger}, timeout=min(seconds, _MERGE_TIMEOUT_MS / 1000 * 2))
            if not merging:
                self._merger.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._merger
        self._closing = True
        self._arrived.set()
        done, _ = await asyncio.wait({self._task}, timeout=seconds)
        if not done:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            for pending in self._queue:
                if not pending.future.done():
                    pending.future.set_exception(ConnectionError("the database was unreachable until shutdown"))
            self._queue.clear()
        await self._store.close()
        await self._merge_store.close()

    async def begin_write(self, action: ClaimedAction, trace: Mapping[str, TraceValue] | None = None) -> str | None:
        """The fence, with the attempt's trace: None when it committed, else the reason it refused."""
        if self.refuse_fences is not None:
            return self.refuse_fences
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._enqueue(_Pending(action, future, trace=trace))
        return await future

    async def finish(
        self,
        action: ClaimedAction,
        write: FinishWrite | None,
        report: AttemptReport,
        trace: Mapping[str, TraceValue] | None = None,
    ) -> bool:
        """Write one result (and the attempt's trace) under the claim's epoch and tally the attempt; False
        when the write changed nothing or there was none (not recorded)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._enqueue(_Pending(action, future, report, write, trace))
        return await future

    async def merge_tallies(self) -> bool:
        """Merge the tally rows now, in a transaction of its own; False when another executor was merging
        or the merge failed (the next one does the work: every row is kept until it is merged)."""
        try:
            merged = await self._merge_store.merge_tallies(_MERGE_TIMEOUT_MS)
        except Exception as error:
            if not own_database_fault(error):
                log.warning("could not merge the metric tallies; the next merge will: %s", error)
            return False
        self.merges += int(merged)
        return merged

    async def _merge_periodically(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_merging.wait(), TALLY_MERGE_SECONDS)
            if self._stop_merging.is_set():
                return
            await self.merge_tallies()

    def _enqueue(self, pending: _Pending) -> None:
        self._queue.append(pending)
        self._arrived.set()

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            batch, self._queue = self._queue[:_MAX_BATCH], self._queue[_MAX_BATCH:]
            try:
                held = await self._commit(batch)
            except Exception as error:
                if not own_database_fault(error):
                    # refused, or a fault of ours: these attempts fail, and the committer goes on with the
                    # next batch (were it to stop, every later fence and result would wait forever)
                    log.exception("group commit refused; its attempts stay EXECUTING until their leases expire")
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(error)
                    continue
                log.warning("group commit could not reach the database, trying again: %s", fault_text(error))
                held = batch
                await asyncio.sleep(0.2)
            if held:
                self._queue[:0] = held
                if len(held) == len(batch) and len(self._queue) == len(held):
                    # everything is held by other transactions: give them a moment
                    self._arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._arrived.wait(), _HELD_RETRY_SECONDS)

    async def _commit(self, batch: list[_Pending]) -> list[_Pending]:
        """One statement for the batch; resolves what it decided, returns what others hold (and a second
        write for an action already in the batch, which waits for the next one)."""
        first: dict[int, _Pending] = {}
        later: list[_Pending] = []
        for pending in batch:
            if pending.action.id in first:
                later.append(pending)
            else:
                first[pending.action.id] = pending
        writes = list(first.values())
        outcomes = await self._store.commit(
            [Write(p.action, p.report, p.finish, p.trace) for p in writes], WRITE_WINDOW_SECONDS
        )
        held = [p for p, o in zip(writes, outcomes, strict=True) if o.outcome == "held"]
        for pending, outcome in zip(writes, outcomes, strict=True):
            if outcome.outcome != "held" and not pending.future.done():
                pending.future.set_result(_resolution(pending, outcome))  # type: ignore[arg-type]
        return held + later


def _resolution(pending: _Pending, outcome: WriteOutcome) -> str | bool | None:
    """A fence resolves to None when it committed, else to the reason it refused; a result to whether it
    was recorded."""
    if pending.report is not None:
        return outcome.outcome == "written"
    match outcome.outcome:
        case "written":
            return None
        case "gone":
            return "the action was erased"
        case "stale":
            return f"another claim took the action (epoch {outcome.found_epoch}, {outcome.found_state})"
        case _:
            return f"less than {WRITE_WINDOW_SECONDS:.0f} s of the lease are left"
