"""Group commit: the fences and results of concurrent attempts, many per short transaction.

    attempts ──(fence | result + FinishWrite + AttemptReport, future)──▶ queue ──▶ one transaction:
        lock the rows (and, for a state change, the lane rows) with SKIP LOCKED
        fence:  write_started_at where epoch and state still match and the lease covers the window
        result: the result's state where epoch and state still match; then the attempt tallies
    commit ──▶ resolve each future. A row someone else holds waits for the next transaction.

Every write names its own epoch, so batching never lets one attempt write for another, and a future
resolves only after its transaction committed: a provider call starts after its own fence is durable.

    every TALLY_MERGE_SECONDS, beside the batches ──▶ one short transaction of its own: merge_tallies
        (the tally rows folded into one per label set; skipped while another executor merges)

The merge runs as its own task on its own pooled connection, so a batch never waits for it; it locks only
tally rows (SKIP LOCKED), which the batches only insert, so it never waits for a batch either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from outbox import store, store_metrics
from outbox.executor.claimed import AttemptReport, ClaimedAction, FinishWrite
from outbox.executor.config import WRITE_WINDOW_SECONDS

log = logging.getLogger("outbox.executor")

# how long a batch whose rows are all held by others waits before it tries again
_HELD_RETRY_SECONDS = 0.02
_MAX_BATCH = 500
# how often the tally rows are merged, and how long a merge may take or wait for a lock
TALLY_MERGE_SECONDS = 10.0
_MERGE_TIMEOUT_MS = 5000


# Upper bounds (seconds) of the attempt duration and pickup delay histograms.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    math.inf,
)  # fmt: skip


@dataclass
class _Pending:
    action: ClaimedAction
    future: asyncio.Future[str | None] | asyncio.Future[bool] = field(repr=False)
    # None: a fence. Otherwise a result, which writes `finish` (None: writes nothing, as Abandoned)
    report: AttemptReport | None = None
    finish: FinishWrite | None = None


class Committer:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        idle_in_transaction_seconds: float = 5.0,
        tally_merge_seconds: float = TALLY_MERGE_SECONDS,
    ) -> None:
        self._engine = engine
        self._idle_ms = max(1, round(idle_in_transaction_seconds * 1000))
        self._queue: list[_Pending] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._merge_seconds = tally_merge_seconds
        self._merger: asyncio.Task[None] | None = None
        self._stop_merging = asyncio.Event()
        self.merges = 0
        # when set, every new fence is refused with this reason without touching the database
        self.refuse_fences: str | None = None
        self.commits = 0
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

    async def begin_write(self, action: ClaimedAction) -> str | None:
        """The fence: None when it committed, else the reason it refused."""
        if self.refuse_fences is not None:
            return self.refuse_fences
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._enqueue(_Pending(action, future))
        return await future

    async def finish(self, action: ClaimedAction, write: FinishWrite | None, report: AttemptReport) -> bool:
        """Write one result under the claim's epoch and tally the attempt; False when the write changed
        nothing or there was none (not recorded)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._enqueue(_Pending(action, future, report, write))
        return await future

    async def merge_tallies(self) -> bool:
        """Merge the tally rows now, in a transaction of its own; False when another executor was merging
        or the merge failed (the next one does the work: every row is kept until it is merged)."""
        try:
            async with self._engine.begin() as conn:
                await conn.execute(store_metrics.BOUND_MERGE, {"ms": _MERGE_TIMEOUT_MS})
                merged = await conn.run_sync(store_metrics.merge_tallies)
        except Exception as error:
            if not database_unavailable(error):
                log.warning("could not merge the metric tallies; the next merge will: %s", error)
            return False
        self.merges += int(merged)
        return merged

    async def _merge_periodically(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_merging.wait(), self._merge_seconds)
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
                if not database_unavailable(error):
                    # refused, or a fault of ours: these attempts fail, and the committer goes on with the
                    # next batch (were it to stop, every later fence and result would wait forever)
                    log.exception("group commit refused; its attempts stay EXECUTING until their leases expire")
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(error)
                    continue
                log.warning("group commit could not reach the database, trying again: %s", error)
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
        """One transaction for the batch; resolves what it decided, returns what others hold."""
        resolutions: list[tuple[_Pending, str | bool | None]] = []
        held_elsewhere: list[_Pending] = []
        async with self._engine.begin() as conn:
            await conn.execute(store.BOUND_IDLE_IN_TRANSACTION, {"ms": self._idle_ms})
            ids = sorted({p.action.id for p in batch})
            locked = {row.id: (row.epoch, row.state) for row in await conn.execute(store.LOCK_ACTIONS, {"ids": ids})}
            unlocked = [i for i in ids if i not in locked]
            existing = (
                set((await conn.execute(store.EXISTING_ACTIONS, {"ids": unlocked})).scalars()) if unlocked else set()
            )
            current: list[_Pending] = []
            for pending in batch:
                action = pending.action
                if pending.report is not None and pending.finish is None:
                    resolutions.append((pending, False))  # a result that writes nothing
                elif action.id in existing:
                    held_elsewhere.append(pending)
                elif action.id not in locked:
                    resolutions.append((pending, _refusal(pending, "the action was erased")))
                elif locked[action.id] != (action.epoch, "EXECUTING"):
                    epoch, state = locked[action.id]
                    reason = f"another claim took the action (epoch {epoch}, {state})"
                    resolutions.append((pending, _refusal(pending, reason)))
                else:
                    current.append(pending)
            # a state change recomputes the lane: hold its row first (an EXECUTING action always has one)
            lanes = sorted({p.action.lane_key for p in current if p.report is not None})
            locked_lanes = set((await conn.execute(store.LOCK_LANES, {"lanes": lanes})).scalars()) if lanes else set()
            fences = [p for p in current if p.report is None]
            finishes = [p for p in current if p.report is not None and p.action.lane_key in locked_lanes]
            held_elsewhere += [p for p in current if p.report is not None and p.action.lane_key not in locked_lanes]
            if fences:
                resolutions += await self._begin_writes(conn, fences)
            if finishes:
                resolutions += await self._finish(conn, finishes)
            await _tally(conn, [(p, outcome) for p, outcome in resolutions if p.report is not None])
        self.commits += 1
        for pending, outcome in resolutions:
            if not pending.future.done():
                pending.future.set_result(outcome)  # type: ignore[arg-type]
        return held_elsewhere

    async def _begin_writes(
        self, conn: AsyncConnection, fences: list[_Pending]
    ) -> list[tuple[_Pending, str | bool | None]]:
        params = {
            "ids": [p.action.id for p in fences],
            "epochs": [p.action.epoch for p in fences],
            "window_seconds": WRITE_WINDOW_SECONDS,
        }
        fenced = set((await conn.execute(store.BEGIN_WRITES, params)).scalars())
        short = f"less than {WRITE_WINDOW_SECONDS:.0f} s of the lease are left"
        return [(p, None if p.action.id in fenced else short) for p in fences]

    async def _finish(
        self, conn: AsyncConnection, finishes: list[_Pending]
    ) -> list[tuple[_Pending, str | bool | None]]:
        writes = [(p.action, p.finish) for p in finishes if p.finish is not None]
        params = {
            "ids": [a.id for a, _ in writes],
            "epochs": [a.epoch for a, _ in writes],
            "states": [w.state for _, w in writes],
            "stop_reasons": [w.stop_reason for _, w in writes],
            "readback_refs": [w.readback_ref for _, w in writes],
            "delays": [w.delay_seconds for _, w in writes],
            "uncounts": [w.uncount for _, w in writes],
            "fences": [w.fence for _, w in writes],
            "prior_writes": [a.prior_write_started_at for a, _ in writes],
            "last_errors": [w.last_error for _, w in writes],
        }
        recorded = set((await conn.execute(store.FINISH_ATTEMPTS, params)).scalars())
        return [(p, p.action.id in recorded) for p in finishes]


def _refusal(pending: _Pending, reason: str) -> str | bool:
    """What a write that cannot take effect resolves to: a fence's reason, or a result not recorded."""
    return reason if pending.report is None else False


async def _tally(conn: AsyncConnection, results: list[tuple[_Pending, str | bool | None]]) -> None:
    """The attempts decided in this transaction, counted in it: durable as the results themselves."""
    if not results:
        return
    attempts: Counter[tuple[str, str, bool]] = Counter()
    latency: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    for pending, recorded in results:
        report, kind = pending.report, pending.action.kind.name
        assert report is not None
        attempts[(kind, report.result, bool(recorded))] += 1
        latency[(kind, "attempt_duration", _bucket(report.attempt_seconds))].append(report.attempt_seconds)
        if report.pickup_seconds is not None:
            latency[(kind, "pickup_delay", _bucket(report.pickup_seconds))].append(report.pickup_seconds)
    await conn.execute(
        store.ADD_ATTEMPT_TALLIES,
        {
            "kinds": [k for k, _, _ in attempts],
            "results": [r for _, r, _ in attempts],
            "recorded": [c for _, _, c in attempts],
            "counts": list(attempts.values()),
        },
    )
    await conn.execute(
        store.ADD_LATENCY_TALLIES,
        {
            "kinds": [k for k, _, _ in latency],
            "metrics": [m for _, m, _ in latency],
            "les": [le for _, _, le in latency],
            "counts": [len(v) for v in latency.values()],
            "totals": [sum(v) for v in latency.values()],
        },
    )


def _bucket(seconds: float) -> float:
    return next(le for le in LATENCY_BUCKETS if seconds <= le)


def connection_lost(error: DBAPIError) -> bool:
    return error.connection_invalidated or isinstance(error.orig, psycopg.OperationalError)


def database_unavailable(error: BaseException) -> bool:
    """A lost connection, or no pooled connection free in time (a slow database, or this process frozen
    longer than the pool's timeout): try again later, as after a restart."""
    if isinstance(error, DBAPIError):
        return connection_lost(error)
    return isinstance(error, PoolTimeout)
