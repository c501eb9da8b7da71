"""The retention purge: ended actions are deleted 30 days (configurable) after they ended, in short batches.

Each batch locks up to `batch_size` ended rows older than a cutoff taken once on the database clock (SKIP
LOCKED, oldest first, from where the last batch stopped), deletes them and commits, until one comes up
short: no long lock or snapshot, and purges on several replicas share the work. After each batch the purge
rests as long as the batch took, so it keeps at most half of one server core busy and the executors' claims
beside it keep their latency (a million rows took 4 to 5 s instead of 1.7 on a 2-core machine). The last batch's
transaction also records the success and merges the metric tally rows (store_metrics.merge_tallies; the
purge never deletes a tally row, so no counter goes backwards). Thirty days outlast any notice's expiry, so
a late redelivery of an event still finds its idempotency key. Sync and async functions mirror each other
by name.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from outbox._internal.config.limits import PURGE_BATCH_SIZE
from outbox.store import application as store
from outbox.store import metrics as store_metrics

# How long an ended action is kept: longer than any notice's expiry, so its idempotency key still counts.
RETENTION = timedelta(days=30)
# where the first batch starts; each next one starts at the last ended_at the batch before it deleted
_BEGINNING = datetime(1, 1, 1, tzinfo=UTC)


def _check(older_than: timedelta, batch_size: int) -> None:
    if older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative, not {older_than}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")


def _own_transactions_only(conn: Connection | AsyncConnection) -> None:
    if conn.in_transaction():
        raise ValueError("the purge commits each batch: pass an engine, or a connection outside a transaction")


@contextmanager
def _transaction(bind: Engine | Connection) -> Iterator[Connection]:
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    else:
        with bind.begin():
            yield bind


@asynccontextmanager
async def _transaction_async(bind: AsyncEngine | AsyncConnection) -> AsyncIterator[AsyncConnection]:
    if isinstance(bind, AsyncEngine):
        async with bind.begin() as conn:
            yield conn
    else:
        async with bind.begin():
            yield bind


def purge_ended(
    bind: Engine | Connection,
    older_than: timedelta = RETENTION,
    batch_size: int = PURGE_BATCH_SIZE,
    stop: threading.Event | None = None,
) -> int:
    """Delete the actions that ended more than `older_than` ago, batch by batch; return how many went.

    `bind` is an engine, or a connection outside a transaction: every batch commits on its own. Once `stop`
    is set, the purge ends after the batch it is in (the next run takes up the rest).
    """
    _check(older_than, batch_size)
    if isinstance(bind, Connection):
        _own_transactions_only(bind)
    with _transaction(bind) as conn:
        cutoff: datetime = conn.execute(store.DATABASE_NOW).scalar_one() - older_than
    params = {"after": _BEGINNING, "cutoff": cutoff, "batch_size": batch_size}
    deleted = 0
    while True:
        started = time.monotonic()
        with _transaction(bind) as conn:
            batch = conn.execute(store.PURGE_ENDED_BATCH, params).one()
            deleted += int(batch.deleted)
            if batch.deleted < batch_size:
                _record_success(conn, deleted)
                return deleted
        rest = time.monotonic() - started  # rest as long as the batch took
        if stop is None:
            time.sleep(rest)
        elif stop.wait(rest):
            return deleted
        params["after"] = batch.last_ended_at


async def purge_ended_async(
    bind: AsyncEngine | AsyncConnection, older_than: timedelta = RETENTION, batch_size: int = PURGE_BATCH_SIZE
) -> int:
    """`purge_ended` for an `AsyncEngine`, or an `AsyncConnection` outside a transaction."""
    _check(older_than, batch_size)
    if isinstance(bind, AsyncConnection):
        _own_transactions_only(bind)
    async with _transaction_async(bind) as conn:
        cutoff: datetime = (await conn.execute(store.DATABASE_NOW)).scalar_one() - older_than
    params = {"after": _BEGINNING, "cutoff": cutoff, "batch_size": batch_size}
    deleted = 0
    while True:
        started = time.monotonic()
        async with _transaction_async(bind) as conn:
            batch = (await conn.execute(store.PURGE_ENDED_BATCH, params)).one()
            deleted += int(batch.deleted)
            if batch.deleted < batch_size:
                await conn.run_sync(_record_success, deleted)
                return deleted
        await asyncio.sleep(time.monotonic() - started)  # rest as long as the batch took
        params["after"] = batch.last_ended_at


def _record_success(conn: Connection, deleted: int) -> None:
    """In the last batch's transaction: the purge succeeded (for the "purge failing" alert), executors
    silent for a day are forgotten, and the tally rows are merged (skipped while an executor merges)."""
    conn.execute(store_metrics.PURGE_SUCCEEDED, {"removed": deleted})
    conn.execute(store_metrics.FORGET_SILENT_EXECUTORS)
    store_metrics.merge_tallies(conn)


def count_purgeable(conn: Connection, older_than: timedelta = RETENTION) -> int:
    """How many actions a purge with `older_than` would delete now (a dry run: deletes nothing)."""
    _check(older_than, 1)
    cutoff = conn.execute(store.DATABASE_NOW).scalar_one() - older_than
    return int(conn.execute(store.COUNT_PURGEABLE, {"cutoff": cutoff}).scalar_one())
