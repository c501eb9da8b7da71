"""The executor's store: the typed calls that run the executor's statements (`outbox.store.executor`) on
connections of its own: claim, sweep, and the group commit.

    Executor ──claim(limit)──────────────▶ CLAIM_READY_HEADS          ─▶ list[ClaimedAction]
                                           (CLAIM_OPEN_DESTINATION_HEADS while a destination is held)
             ──sweep(...)────────────────▶ BEAT, EXPIRE_UNSTARTED,
                                           TAKE_BACK_EXPIRED_LEASES   ─▶ Sweep (ended, claimed again)
    Committer ──commit(writes)───────────▶ FENCE_WRITES (its fences),
                                           COMMIT_WRITES (the rest)   ─▶ one WriteOutcome per write
              (each write: a fence or a result, with the attempt's trace when it noted one)

Every call is one statement in a transaction of its own (the connection is in autocommit), so no executor
transaction ever sits idle holding row locks: a frozen executor (SIGSTOP, a stalled VM) holds nothing, and
an application's enqueue into its lanes never waits for it. The parameters and the mapping of rows to
objects live here, beside the calls.

Every call has an answer within CALL_SECONDS or fails as a lost connection: its statements never wait for a
lock (SKIP LOCKED) but for a moment on a destination's row (on a connection of their own), and take
milliseconds, so a call without an answer means a database or a network that
stopped answering, which neither a statement timeout (the server's) nor TCP (a pooler or a proxy keeps
acknowledging) may ever report. The connection is then closed unread, and the next call opens a new one
(`outbox._internal.connections.opening.connect_async`: through a pooler, nothing is prepared on the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any, TypeVar

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import TextClause

from outbox._internal.connections.opening import connect_async
from outbox.executor.attempt import TraceValue
from outbox.executor.claimed import AttemptReport, ClaimedAction, FinishWrite
from outbox.executor.outcomes import EndedAction
from outbox.kinds import ActionKind
from outbox.store import destinations
from outbox.store import metrics as store_metrics
from outbox.store.caller import psycopg_sql
from outbox.store.executor import (
    CLAIM_OPEN_DESTINATION_HEADS,
    CLAIM_READY_HEADS,
    COMMIT_WRITES,
    EXPIRE_UNSTARTED,
    FENCE_WRITES,
    LATENCY_BUCKETS,
    TAKE_BACK_EXPIRED_LEASES,
    WRITE_COLUMNS,
)

_T = TypeVar("_T")
# the longest an executor call waits for the database's answer; then its connection counts as lost
CALL_SECONDS = 10.0


@dataclass(frozen=True)
class Write:
    """One write of the group commit: a fence (`report` None), or a result with the row values it writes
    (`finish`; None for a result that writes nothing, such as an abandoned attempt) and what it tallies.
    `trace`: the attempt's trace, written with the fence or the result's values; None keeps the stored one."""

    action: ClaimedAction
    report: AttemptReport | None = None
    finish: FinishWrite | None = None
    trace: Mapping[str, TraceValue] | None = None


@dataclass(frozen=True)
class WriteOutcome:
    """What the group commit did with one write: `written`, `held`, `gone`, `stale` (with the epoch and
    state the row has now), `short` or `none`."""

    outcome: str
    found_epoch: int | None = None
    found_state: str | None = None


@dataclass(frozen=True)
class SlowedDown:
    """What a slow-down left: the destination paused for how long from now (infinite: by an operator, until
    resumed), its pace, and whether this slow-down paused it (not one that found it paused)."""

    pause_seconds: float
    pace: float | None
    newly_paused: bool


@dataclass(frozen=True)
class Shares:
    """The slots one destination may take in a claim while others have due heads: `cap` for a destination
    with nothing in flight here, and `rooms` (the cap, or the slow start's window of one that has not answered
    if smaller, less its attempts in flight) for the others. Only the
    destinations in `answered` (their last attempt here was accepted or refused for good) may pass their room:
    one whose attempts have not come back yet, or came back without an answer, may be hanging."""

    cap: int
    rooms: Mapping[str, int]
    answered: frozenset[str] = frozenset()


@dataclass(frozen=True)
class FailureRun:
    """A destination's run of failed attempts and slow-downs since it last accepted one: how many, over how
    many seconds, whether the failure just noted broke it, and whether it is broken."""

    failures: int
    seconds: float
    newly_broken: bool
    broken: bool


@dataclass(frozen=True)
class Turn:
    """An attempt's turn at a held destination: the seconds until it (0: now), whether the destination is
    paused (then no turn was given, and the seconds are the rest of the pause), and when the provider last
    paused it (epoch seconds, None: never), which voids every turn given before."""

    wait_seconds: float
    paused: bool
    slowed_at: float | None


@dataclass(frozen=True)
class Sweep:
    """One sweep: the actions it ended (with the trace each keeps) and those it claimed again."""

    ended: list[EndedAction]
    claimed_again: list[ClaimedAction]


def bucket(seconds: float) -> float:
    """The upper bound of the latency histogram bucket that `seconds` falls in."""
    return next(le for le in LATENCY_BUCKETS if seconds <= le)


class _Session:
    """One connection of the store: psycopg's own, opened from `url` on first use, in autocommit, and kept. A
    lost connection, or a call with no answer within CALL_SECONDS, raises psycopg's OperationalError (an own
    fault, `own_database_fault`); the next call opens a new connection. Its callers share it, so
    its statements run one by one, never in a transaction that would take in another task's statements."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await connect_async(self._url, autocommit=True, row_factory=namedtuple_row)
        return self._conn

    async def bounded(self, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]]) -> _T:
        """`work` on this connection, answered within CALL_SECONDS or failed as a lost connection.

        The wait is not a cancellation of `work`: psycopg answers one by asking the server to cancel and
        waiting up to 10 s more, which a silent network never answers. The connection is dropped first,
        so the cancellation finds nothing to ask."""
        conn = await self.connection()
        task = asyncio.ensure_future(work(conn))
        try:
            done, _ = await asyncio.wait({task}, timeout=CALL_SECONDS)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            self._abandon()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise psycopg.OperationalError(f"the database did not answer within {CALL_SECONDS:g} s")
        try:
            return task.result()
        except (psycopg.OperationalError, psycopg.InterfaceError):
            await self.close()
            raise

    def _abandon(self) -> None:
        """Drop the connection without a word to the server: it did not answer, so a goodbye might not
        return either. The server ends the session when its socket closes."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()


class ExecutorStore:
    """The executor's statements, each a transaction of its own, on two connections this store holds (each a
    `_Session`, from `url`: libpq parameters, `conninfo` of the executor's engine, timeouts included).

    The claims, the sweep and the group commit run on one: a claim or a group commit costs one round trip and
    no pool checkout. The statements an attempt makes of its destination's row (its turn, a slow-down, a
    failure, refused credentials, a mend) run on the other, opened when the first is made: they lock that row
    and may wait for another executor's statement on it, and the claims and commits of every other
    destination must never wait behind them (a receiver answering 503s to one executor's attempts once held
    its claims and commits up to 100 ms at a time).
    """

    def __init__(self, url: str) -> None:
        self._main = _Session(url)
        self._destination_rows = _Session(url)

    async def close(self) -> None:
        await self._main.close()
        await self._destination_rows.close()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        return await self._main.connection()

    async def _rows(self, statement: TextClause, params: dict[str, Any], *, on: _Session | None = None) -> list[Any]:
        return await (on or self._main).bounded(lambda conn: _fetch(conn, statement, params))

    async def _binary_rows(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        """`_rows`, every list parameter sent in binary format (`binary_arrays`)."""
        sql = binary_arrays(statement, frozenset(name for name, value in params.items() if isinstance(value, list)))
        return await self._main.bounded(lambda conn: _fetch_sql(conn, sql, params))

    async def _bounded(self, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]]) -> _T:
        return await self._main.bounded(work)

    async def merge_tallies(self, bound_ms: int) -> bool:
        """Fold the tally rows in one transaction whose every statement and pause is bounded by `bound_ms`;
        False, without waiting, when another executor is merging."""

        async def merge(conn: psycopg.AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                await _fetch(conn, store_metrics.BOUND_MERGE, {"ms": bound_ms})
                lock = store_metrics.TRY_TALLY_MERGE_LOCK
                if not (await _fetch(conn, lock, {"key": store_metrics.TALLY_MERGE_LOCK}))[0][0]:
                    return False
                for statement in store_metrics.MERGE_TALLIES:
                    await _fetch(conn, statement, {})
                return True

        return await self._bounded(merge)

    async def claim(
        self,
        limit: int,
        lease_seconds: float,
        kinds: list[str],
        *,
        some_held: bool = False,
        shares: Shares | None = None,
    ) -> list[ClaimedAction]:
        """Up to `limit` ready lane heads of `kinds` whose destination is not held, claimed under a lease of
        `lease_seconds`. `some_held`: a destination is held, so the heads are found destination by destination
        (CLAIM_OPEN_DESTINATION_HEADS), and the held one's backlog is not read at every claim. `shares`: a
        destination could take more than its share of the executor's slots in this claim, so the heads are
        found destination by destination too, each within its room first."""
        params: dict[str, Any] = {"limit": limit, "lease_seconds": lease_seconds, "kinds": kinds}
        if not some_held and shares is None:
            rows = await self._rows(CLAIM_READY_HEADS, params)
        else:
            rooms = shares.rooms if shares is not None else {}
            params |= {
                "cap": shares.cap if shares is not None else limit,
                "busy": list(rooms),
                "rooms": list(rooms.values()),
                "answered": sorted(shares.answered) if shares is not None else None,
            }
            rows = await self._rows(CLAIM_OPEN_DESTINATION_HEADS, params)
        return [claimed_action(row, fresh=True) for row in rows]

    async def claim_destination(
        self, name: str, limit: int, lease_seconds: float, kinds: list[str], pacing: Mapping[str, float]
    ) -> tuple[list[ClaimedAction], float | None]:
        """Up to `limit` ready lane heads of the held destination `name`, as many as it allows now
        (CLAIM_DESTINATION_HEADS), and the seconds until it may allow more (None: nothing it waits for)."""
        params = {"name": name, "limit": limit, "lease_seconds": lease_seconds, "kinds": kinds, **pacing}
        rows = await self._rows(destinations.CLAIM_DESTINATION_HEADS, params)
        claimed = [claimed_action(row, fresh=True) for row in rows if row.id is not None]
        return claimed, rows[0].next_seconds if rows else None

    async def take_send_tokens(self, name: str, count: int, pacing: Mapping[str, float]) -> list[Turn]:
        """The turns of `count` attempts of the held destination `name`, before their fences, in the order
        asked (destinations.TAKE_SEND_TOKENS): a token is taken for each turn given, none while it is paused."""
        params = {"name": name, "count": count, **pacing}
        rows = await self._rows(destinations.TAKE_SEND_TOKENS, params, on=self._destination_rows)
        if not rows:
            return [Turn(0.0, False, None)] * count
        return [Turn(row.wait_seconds, row.paused, row.slowed_at) for row in rows]

    async def slowed_at(self, name: str) -> float | None:
        """When the provider last paused `name` (epoch seconds; None: never, or no row)."""
        rows = await self._rows(destinations.SLOWED_AT, {"name": name}, on=self._destination_rows)
        return rows[0].slowed_at if rows else None

    async def held_destinations(self) -> list[tuple[str, str, bool]]:
        """The destinations held back from the plain claim (paused, broken, paced or with a rate): name, kind,
        and whether it is broken."""
        return [(row.name, row.kind, row.broken) for row in await self._rows(destinations.HELD_DESTINATIONS, {})]

    async def set_rates(self, rates: Mapping[str, tuple[str, float | None, float]]) -> None:
        """Write the configured rates (name: kind, attempts a second or None, burst) for every executor."""
        rated = {name: value for name, value in rates.items() if value[1] is not None}
        if rated:
            await self._rows(
                destinations.SET_RATES,
                {
                    "names": list(rated),
                    "kinds": [kind for kind, _, _ in rated.values()],
                    "rates": [rate for _, rate, _ in rated.values()],
                    "bursts": [burst for _, _, burst in rated.values()],
                },
            )
        await self._rows(destinations.CLEAR_RATES, {"names": [name for name in rates if name not in rated]})

    async def slow_down(
        self, name: str, kind: str, after: float | None, reason: str, pacing: Mapping[str, float]
    ) -> SlowedDown:
        """Record a provider's slow-down of `name`: its pause (the provider's `after`, or the backoff) and
        its lowered pace (destinations.SLOW_DOWN)."""

        async def write(conn: psycopg.AsyncConnection[Any]) -> SlowedDown:
            await _fetch(conn, destinations.ADD_DESTINATION, {"name": name, "kind": kind})
            params = {"name": name, "after": after, "reason": reason, **pacing}
            row = (await _fetch(conn, destinations.SLOW_DOWN, params))[0]
            if row.newly_paused:  # after the pause committed (autocommit): whoever hears it finds it paused
                await _fetch(conn, destinations.NOTIFY_PAUSED, {"kind": kind, "name": name})
            return SlowedDown(row.pause_seconds, row.pace, row.newly_paused)

        return await self._destination_rows.bounded(write)

    async def note_failure(self, name: str, kind: str, breaker: Mapping[str, float]) -> FailureRun:
        """One more failed attempt or slow-down of `name` (destinations.NOTE_FAILURE, `breaker`: its `window`,
        `min_failures` and `probe_seconds`): its run of failures as the row holds it, and whether this one
        broke it."""

        async def write(conn: psycopg.AsyncConnection[Any]) -> FailureRun:
            await _fetch(conn, destinations.ADD_DESTINATION, {"name": name, "kind": kind})
            row = (await _fetch(conn, destinations.NOTE_FAILURE, {"name": name, **breaker}))[0]
            return FailureRun(row.failures, row.failing_seconds, row.newly, row.broken)

        return await self._destination_rows.bounded(write)

    async def refuse_credentials(self, name: str, kind: str, reason: str, probe_seconds: float) -> bool:
        """The provider refused `name`'s credentials (destinations.REFUSE_CREDENTIALS): broken for every
        executor, its next probe `probe_seconds` away; whether they were not known refused before."""

        async def write(conn: psycopg.AsyncConnection[Any]) -> bool:
            await _fetch(conn, destinations.ADD_DESTINATION, {"name": name, "kind": kind})
            params = {"name": name, "reason": reason, "probe_seconds": probe_seconds}
            return bool((await _fetch(conn, destinations.REFUSE_CREDENTIALS, params))[0].newly)

        return await self._destination_rows.bounded(write)

    async def mend_destination(self, name: str) -> bool:
        """`name` is no longer broken; whether it was."""
        return bool(await self._rows(destinations.MEND, {"name": name}, on=self._destination_rows))

    async def sweep(
        self, executor_id: str, free: int, lease_seconds: float, kinds: list[str], at_most_once: list[str]
    ) -> Sweep:
        """Beat; end what expired before it started; take back up to `free` expired leases."""
        await self._rows(store_metrics.BEAT, {"executor_id": executor_id})
        expired = await self._rows(EXPIRE_UNSTARTED, {"limit": 500})
        ended = [EndedAction(row.id, row.kind, "CANCELLED", "EXPIRED", row.trace or {}) for row in expired]
        params = {"limit": free, "lease_seconds": lease_seconds, "at_most_once": at_most_once, "kinds": kinds}
        again: list[ClaimedAction] = []
        for row in await self._rows(TAKE_BACK_EXPIRED_LEASES, params) if free > 0 else []:
            if row.state == "EXECUTING":
                again.append(claimed_action(row, fresh=False))
            else:
                ended.append(EndedAction(row.id, row.kind, row.state, row.stop_reason, row.trace or {}))
        return Sweep(ended, again)

    async def leave(self, executor_id: str) -> None:
        """Remove this executor's heartbeat row."""
        await self._rows(store_metrics.LEAVE, {"executor_id": executor_id})

    async def commit(self, writes: Sequence[Write], window_seconds: float) -> list[WriteOutcome]:
        """The group commit of `writes` (one per action); one outcome per write, in order. The fences go first,
        in a plain statement; the results, and any fence it did not write, in the group commit's statement
        (each its own transaction: a fence and a result are independent writes)."""
        fences = [write for write in writes if write.report is None]
        fenced = await self._fence(fences, window_seconds) if fences else set()
        rest = [write for write in writes if not (write.report is None and write.action.id in fenced)]
        found: dict[int, WriteOutcome] = {}
        if rest:
            columns = zip(*(_write_row(write) for write in rest), strict=True)
            params: dict[str, Any] = {
                f"w_{name}": list(values) for (name, _), values in zip(WRITE_COLUMNS, columns, strict=True)
            }
            params["window_seconds"] = window_seconds
            rows = await self._binary_rows(COMMIT_WRITES, params)
            found = {row.id: WriteOutcome(row.outcome, row.found_epoch, row.found_state) for row in rows}
        return [
            WriteOutcome("written", write.action.epoch, "EXECUTING")
            if write.report is None and write.action.id in fenced
            else found[write.action.id]
            for write in writes
        ]

    async def _fence(self, fences: list[Write], window_seconds: float) -> set[int]:
        """The ids of the fences FENCE_WRITES wrote."""
        params = {
            "ids": [write.action.id for write in fences],
            "epochs": [write.action.epoch for write in fences],
            "traces": [None if write.trace is None else json.dumps(write.trace) for write in fences],
            "window_seconds": window_seconds,
        }
        return {row.id for row in await self._binary_rows(FENCE_WRITES, params)}


async def _fetch(conn: psycopg.AsyncConnection[Any], statement: TextClause, params: Mapping[str, Any]) -> list[Any]:
    return await _fetch_sql(conn, psycopg_sql(statement), params)


async def _fetch_sql(conn: psycopg.AsyncConnection[Any], sql: str, params: Mapping[str, Any]) -> list[Any]:
    cursor = await conn.execute(sql, params)
    return await cursor.fetchall() if cursor.description is not None else []


@cache
def binary_arrays(statement: TextClause, names: frozenset[str]) -> str:
    """`statement` in psycopg's style with the parameters `names` sent in binary format (`%(name)b`): a list
    of them goes as an array of its elements' own binary values, where the text format quotes and escapes
    every element in Python (a trace's JSON escaped quote by quote), the group commit's largest cost to its
    client. A list of nothing but nulls still goes as text (psycopg cannot tell its type)."""
    sql = psycopg_sql(statement)
    for name in names:
        sql = sql.replace(f"%({name})s", f"%({name})b")
    return sql


def _write_row(write: Write) -> list[Any]:
    """One write as a row of `WRITE_COLUMNS`, in its order."""
    action, report, finish = write.action, write.report, write.finish
    prior = action.prior_write_started_at
    row: list[Any] = [action.id, action.epoch, "fence" if report is None else "none" if finish is None else "finish"]
    if finish is None:
        row += [None, None, None, None, None, None, prior, None]
    else:
        row += [
            finish.state,
            finish.stop_reason,
            finish.readback_ref,
            float(finish.delay_seconds),  # one type per array: an int among floats cannot be dumped
            finish.uncount,
            finish.fence,
            prior,
            finish.last_error,
        ]
    row.append(action.kind.name)
    if report is None:
        row += [None, None, None, None, None]
    else:
        pickup = report.pickup_seconds
        row += [
            report.result,
            report.attempt_seconds,
            bucket(report.attempt_seconds),
            pickup,
            bucket(pickup) if pickup is not None else None,
        ]
    row.append(None if write.trace is None else json.dumps(write.trace))
    return row


def claimed_action(row: Any, *, fresh: bool) -> ClaimedAction:
    """A claimed row as the attempt sees it; `fresh` for a claim from its lane (not a reclaim after a lost
    lease, whose due time is long past and says nothing about pickup)."""
    return ClaimedAction(
        id=row.id,
        kind=ActionKind.get(row.kind),
        lane_key=row.lane_key,
        idempotency_key=row.idempotency_key,
        workspace_id=row.workspace_id,
        subject_account_id=row.subject_account_id,
        payload=row.payload,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        epoch=row.epoch,
        prior_write_started_at=row.write_started_at,
        due_at=row.due_at,
        lease_seconds=row.lease_seconds,
        pickup_seconds=max(0.0, row.pickup_seconds) if fresh else None,
        trace=row.trace,
        trace_context=row.trace_context,
        destination=row.destination,
        claimed_at=row.due_at + timedelta(seconds=row.pickup_seconds),
    )
