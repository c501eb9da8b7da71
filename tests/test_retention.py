"""The retention purge: ended actions go after 30 days, batch by batch, and purges on two replicas share the work."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from outbox.retention import purge_ended, purge_ended_async
from outbox.store import application as store
from tests import kinds
from tests.support import insert_ended
from tests.test_executor_results import enqueue

OLD = timedelta(days=31)
YOUNG = timedelta(days=29)


def remaining(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT split_part(idempotency_key, '-', 1), count(*) FROM agent_action GROUP BY 1"))
        return {prefix: count for prefix, count in rows}


def test_the_purge_deletes_what_ended_before_the_window_in_batches(engine: Engine) -> None:
    insert_ended(engine, ended_ago=OLD, count=5, key_prefix="old")
    insert_ended(engine, ended_ago=OLD, count=2, key_prefix="oldfailed", state="FAILED", stop_reason="PROVIDER_REFUSED")
    insert_ended(engine, ended_ago=YOUNG, count=3, key_prefix="young")
    pending = enqueue(engine, idempotency_key="pending-1")

    assert purge_ended(engine, batch_size=2) == 7  # four batches, the last one short
    assert remaining(engine) == {"young": 3, "pending": 1}
    assert purge_ended(engine) == 0
    with engine.connect() as conn:
        lane = conn.execute(text("SELECT id FROM agent_action WHERE lane_key = 'lane-1' AND lane_head")).scalar_one()
    assert lane == pending  # the lanes are untouched

    assert purge_ended(engine, older_than=timedelta(days=28)) == 3


def test_an_idempotency_key_holds_until_its_action_is_purged(engine: Engine) -> None:
    [young] = insert_ended(engine, ended_ago=YOUNG, key_prefix="young")
    insert_ended(engine, ended_ago=OLD, key_prefix="old")
    purge_ended(engine)

    def enqueue_again(key: str) -> outbox.Action:
        with engine.begin() as conn:
            request = outbox.ActionRequest(
                kind=kinds.NOOP, workspace_id=1, lane_key="again", idempotency_key=key, payload={}
            )
            return outbox.enqueue(conn, request)

    redelivered = enqueue_again("young-1")
    assert (redelivered.id, redelivered.state) == (young, outbox.ActionState.DONE)  # nothing is sent again
    assert enqueue_again("old-1").state is outbox.ActionState.ADMITTED  # 31 days on, the key is free


def test_purges_on_two_replicas_take_different_rows_without_waiting(engine: Engine, database_url: str) -> None:
    insert_ended(engine, ended_ago=OLD, count=10, key_prefix="old")
    # a purge that waited for the other one's locks would fail here instead of hanging
    impatient = create_engine(database_url, connect_args={"options": "-c lock_timeout=5s"})
    with engine.connect() as other_replica:
        cutoff = other_replica.execute(store.DATABASE_NOW).scalar_one() - OLD + timedelta(hours=1)
        params = {"after": cutoff - timedelta(days=1), "cutoff": cutoff, "batch_size": 4}
        assert other_replica.execute(store.PURGE_ENDED_BATCH, params).one().deleted == 4
        # the other replica's batch is not committed yet: this purge skips its rows
        assert purge_ended(impatient, batch_size=3) == 6
        other_replica.commit()
    impatient.dispose()
    assert remaining(engine) == {}


def test_a_connection_purges_only_outside_a_transaction(engine: Engine) -> None:
    insert_ended(engine, ended_ago=OLD, count=3, key_prefix="old")
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        with pytest.raises(ValueError, match="commits each batch"):
            purge_ended(conn)
        conn.rollback()
        assert purge_ended(conn, batch_size=2) == 3
        assert not conn.in_transaction()


@pytest.mark.parametrize(
    ("older_than", "batch_size", "message"),
    [(timedelta(days=-1), 100, "older_than must not be negative"), (timedelta(days=30), 0, "batch_size must be")],
)
def test_bad_arguments_delete_nothing(engine: Engine, older_than: timedelta, batch_size: int, message: str) -> None:
    insert_ended(engine, ended_ago=OLD, count=2, key_prefix="old")
    with pytest.raises(ValueError, match=message):
        purge_ended(engine, older_than, batch_size)
    assert remaining(engine) == {"old": 2}


async def test_the_async_purge(engine: Engine, aengine: AsyncEngine) -> None:
    insert_ended(engine, ended_ago=OLD, count=3, key_prefix="old")
    insert_ended(engine, ended_ago=YOUNG, count=1, key_prefix="young")
    assert await purge_ended_async(aengine, batch_size=2) == 3
    async with aengine.connect() as conn:
        assert await purge_ended_async(conn) == 0
    assert remaining(engine) == {"young": 1}
