"""Erasure: delete every action whose subject is an account, inside the caller's transaction.

    erase_account(conn, account_id) ──DELETE by subject_account_id──▶ the delete trigger passes each lane whose
                                                                      holder it deleted to its next action

A pending action is then never carried out; an executing one is refused at its fence ("the action was
erased"), or, if its write already passed the fence, reaches the provider and its result is not recorded.
outbox never commits: the actions go exactly when the caller's erasure commits.
"""

from __future__ import annotations

from outbox.requests import check_id
from outbox.store import application as store
from outbox.store.caller import AsyncConn, SyncConnection, run, run_async


def erase_account(conn: SyncConnection, account_id: int) -> int:
    """Delete the account's actions in every state, in the caller's transaction; return how many."""
    check_id("account_id", account_id)
    return run(conn, store.erase_account(account_id))


async def erase_account_async(conn: AsyncConn, account_id: int) -> int:
    """`erase_account` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    check_id("account_id", account_id)
    return await run_async(conn, store.erase_account(account_id))
