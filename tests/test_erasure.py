"""Erasing an account deletes its actions in every state, in the caller's transaction, and its lanes run on."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from outbox.executor import ActionAttempt, Cancelled, Done, Failed, Result, Uncertain
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.test_executor_results import enqueue, row

NOOP = kinds.NOOP.name
ERASED = 7
OTHER = 8


def exists(engine: Engine, action_id: int) -> bool:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT 1 FROM agent_action WHERE id = :id"), {"id": action_id})
        return found.first() is not None


def erase(engine: Engine, account_id: int = ERASED) -> int:
    with engine.begin() as conn:
        return outbox.erase_account(conn, account_id)


def lane_head(engine: Engine, lane: str) -> int | None:
    """The lane's holder (`lane_head`), or None when nothing of the lane is left."""
    with engine.connect() as conn:
        head = conn.execute(text("SELECT id FROM agent_action WHERE lane_key = :lane AND lane_head"), {"lane": lane})
        return head.scalar_one_or_none()


@pytest.mark.parametrize("proposed", [True, False], ids=["PROPOSED", "ADMITTED"])
async def test_an_erased_head_never_runs_and_its_lane_runs_on(
    engine: Engine, aengine: AsyncEngine, proposed: bool
) -> None:
    head = enqueue(engine, subject_account_id=ERASED, proposed=proposed)
    follower = enqueue(engine, subject_account_id=OTHER)
    assert lane_head(engine, "lane-1") == head

    assert erase(engine) == 1
    assert not exists(engine, head)
    assert lane_head(engine, "lane-1") == follower

    adapter = ScriptedAdapter(kinds.NOOP)
    outcomes = await drain(aengine, [adapter])
    assert [call.id for call in adapter.calls] == [follower]
    assert outcomes.attempts == {(NOOP, "DONE", True): 1}
    with engine.begin() as conn, pytest.raises(outbox.ActionNotFound):
        outbox.admit(conn, head)


async def test_an_erasure_before_the_fence_is_refused_there(engine: Engine, aengine: AsyncEngine) -> None:
    erased = enqueue(engine, subject_account_id=ERASED)
    follower = enqueue(engine, subject_account_id=OTHER)
    provider: list[int] = []

    async def erased_while_preparing(attempt: ActionAttempt) -> Result:
        if attempt.action.id == erased:
            assert erase(engine) == 1
        (await attempt.fence().begin_write()).check()  # refuses the erased action: it counts Abandoned
        provider.append(attempt.action.id)
        return Done("sent")

    outcomes = await drain(aengine, [ScriptedAdapter(kinds.NOOP, erased_while_preparing)])
    assert provider == [follower]
    assert outcomes.attempts == {(NOOP, "ABANDONED", False): 1, (NOOP, "DONE", True): 1}
    assert not exists(engine, erased)
    assert row(engine, follower)["state"] == "DONE"


async def test_a_write_past_its_fence_reaches_the_provider_once_and_is_not_recorded(
    engine: Engine, aengine: AsyncEngine
) -> None:
    erased = enqueue(engine, subject_account_id=ERASED)
    follower = enqueue(engine, subject_account_id=OTHER)
    provider: list[int] = []

    async def erased_during_the_call(attempt: ActionAttempt) -> Result:
        (await attempt.fence().begin_write()).check()
        provider.append(attempt.action.id)  # the provider call
        if attempt.action.id == erased:
            assert erase(engine) == 1
        return Done("sent")

    outcomes = await drain(aengine, [ScriptedAdapter(kinds.NOOP, erased_during_the_call)])
    assert provider == [erased, follower]
    assert outcomes.attempts == {(NOOP, "DONE", False): 1, (NOOP, "DONE", True): 1}
    assert not exists(engine, erased)
    assert row(engine, follower)["state"] == "DONE"


@pytest.mark.parametrize(
    ("result", "state"),
    [
        (Done("sent"), "DONE"),
        (Failed("refused"), "FAILED"),
        (Uncertain("timeout"), "UNCERTAIN"),
        (Cancelled("unsubscribed"), "CANCELLED"),
    ],
)
async def test_an_ended_action_is_erased(engine: Engine, aengine: AsyncEngine, result: Result, state: str) -> None:
    action_id = enqueue(engine, subject_account_id=ERASED)

    async def ending(attempt: ActionAttempt) -> Result:
        (await attempt.fence().begin_write()).check()
        return result

    await drain(aengine, [ScriptedAdapter(kinds.NOOP, ending)])
    assert row(engine, action_id)["state"] == state
    assert erase(engine) == 1
    assert not exists(engine, action_id)


async def test_an_erasure_takes_effect_when_the_callers_transaction_commits(
    engine: Engine, aengine: AsyncEngine
) -> None:
    mine = [enqueue(engine, lane=f"lane-{n}", subject_account_id=ERASED) for n in range(3)]
    theirs = enqueue(engine, subject_account_id=OTHER)
    with engine.connect() as conn:
        assert outbox.erase_account(conn, ERASED) == 3
        conn.rollback()  # the caller changed its mind: nothing was erased
    assert all(exists(engine, action_id) for action_id in [*mine, theirs])

    async with aengine.begin() as conn:
        assert await outbox.erase_account_async(conn, ERASED) == 3
    assert [exists(engine, action_id) for action_id in [*mine, theirs]] == [False, False, False, True]
    assert erase(engine) == 0
