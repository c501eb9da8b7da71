"""Stale holders, at-most-once lease loss, shutdown, and the wake-up on enqueue."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from outbox.db import async_engine
from outbox.executor import ActionAttempt, Done, Executor, ExecutorConfig, Result, Retry
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.test_executor_results import enqueue, row


def expire_lease(engine: Engine, action_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE agent_action SET lease_expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )


class Provider:
    """A provider that remembers every write, so a test can count them."""

    def __init__(self) -> None:
        self.writes: list[int] = []

    def holds(self, action_id: int) -> bool:
        return action_id in self.writes


class SlowFirstHolder:
    """The first attempt fences, then hangs inside its provider call until released."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.in_provider = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, attempt: ActionAttempt) -> Result:
        if attempt.write_started() and self.provider.holds(attempt.action.id):
            return Done("found by read-back")  # an at-least-once kind looks before it writes
        (await attempt.fence().begin_write()).check()
        self.provider.writes.append(attempt.action.id)
        if attempt.action.epoch == 1:
            self.in_provider.set()
            await self.release.wait()
        return Done(f"written under epoch {attempt.action.epoch}")


async def stale_holder_scenario(engine: Engine, aengine: AsyncEngine, kind: Any) -> tuple[int, Executor, Provider]:
    action_id = enqueue(engine, kind=kind)
    provider = Provider()
    behaviour = SlowFirstHolder(provider)
    first = Executor(aengine, [ScriptedAdapter(kind, behaviour)], listen=False)
    running = asyncio.create_task(first.run(until_idle=True))
    await asyncio.wait_for(behaviour.in_provider.wait(), 10)
    expire_lease(engine, action_id)  # the first holder is paused past its lease
    second = Executor(aengine, [ScriptedAdapter(kind, behaviour)], listen=False)
    await second.run(until_idle=True)
    behaviour.release.set()  # the first holder wakes up and reports
    await asyncio.wait_for(running, 10)
    return action_id, first, provider


async def test_a_stale_holders_writes_change_nothing(engine: Engine, aengine: AsyncEngine) -> None:
    action_id, first, provider = await stale_holder_scenario(engine, aengine, kinds.NOOP)
    final = row(engine, action_id)
    # the second claim read back the first write instead of writing again
    assert (final["state"], final["epoch"], final["attempt"]) == ("DONE", 2, 2)
    assert final["readback_ref"] == "found by read-back"
    assert provider.writes == [action_id]
    assert first.outcomes.attempts == {(kinds.NOOP.name, "DONE", False): 1}


async def test_an_at_most_once_action_whose_lease_was_lost_after_its_write_ends_uncertain(
    engine: Engine, aengine: AsyncEngine
) -> None:
    action_id, first, provider = await stale_holder_scenario(engine, aengine, kinds.ONCE)
    final = row(engine, action_id)
    assert (final["state"], final["stop_reason"], final["epoch"]) == ("UNCERTAIN", "LEASE_LOST_AFTER_WRITE", 1)
    assert provider.writes == [action_id]  # the provider was called exactly once
    assert first.outcomes.attempts == {(kinds.ONCE.name, "DONE", False): 1}


async def test_a_lost_lease_before_the_fence_is_claimed_again(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine, kind=kinds.ONCE)
    with engine.begin() as conn:  # a holder claimed it and died before its fence
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
                " lease_expires_at = now() - interval '1 s' WHERE id = :id"
            ),
            {"id": action_id},
        )
    adapter = ScriptedAdapter(kinds.ONCE)
    await Executor(aengine, [adapter], listen=False).run(until_idle=True)
    done = row(engine, action_id)
    assert (done["state"], done["epoch"], done["attempt"]) == ("DONE", 2, 2)


async def test_a_lost_lease_at_the_last_attempt_ends_the_action(engine: Engine, aengine: AsyncEngine) -> None:
    unwritten = enqueue(engine, max_attempts=1, lane="a")
    written = enqueue(engine, max_attempts=1, lane="b")
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
                " lease_expires_at = now() - interval '1 s',"
                " write_started_at = CASE WHEN id = :w THEN now() END"
            ),
            {"w": written},
        )
    adapter = ScriptedAdapter(kinds.NOOP)
    await Executor(aengine, [adapter], listen=False).run(until_idle=True)
    assert adapter.calls == []
    assert (row(engine, unwritten)["state"], row(engine, unwritten)["stop_reason"]) == ("FAILED", "ATTEMPTS_EXHAUSTED")
    assert (row(engine, written)["state"], row(engine, written)["stop_reason"]) == (
        "UNCERTAIN",
        "LEASE_LOST_AFTER_WRITE",
    )


async def test_stop_hands_back_unfenced_actions_and_lets_fenced_ones_finish(
    engine: Engine, aengine: AsyncEngine
) -> None:
    unfenced_id = enqueue(engine, lane="preparing")
    fenced_id = enqueue(engine, lane="writing")
    both_started = asyncio.Barrier(3)
    release = asyncio.Event()

    async def behaviour(attempt: ActionAttempt) -> Result:
        if attempt.action.id == fenced_id:
            window = await attempt.fence().begin_write()
            await both_started.wait()
            await release.wait()
            window.check()
            return Done("sent while stopping")
        await both_started.wait()
        await release.wait()  # still preparing when the stop comes
        (await attempt.fence().begin_write()).check()
        return Done("must not be sent")

    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], listen=False)
    running = asyncio.create_task(executor.run())
    await asyncio.wait_for(both_started.wait(), 10)
    executor.stop()
    release.set()
    await asyncio.wait_for(running, 30)
    handed_back = row(engine, unfenced_id)
    assert (handed_back["state"], handed_back["attempt"], handed_back["epoch"]) == ("ADMITTED", 0, 1)
    assert handed_back["due_in"] <= 0
    assert (row(engine, fenced_id)["state"], row(engine, fenced_id)["readback_ref"]) == ("DONE", "sent while stopping")


async def test_stop_cancels_an_attempt_that_does_not_reach_its_fence(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)
    started = asyncio.Event()

    async def stuck_before_fence(attempt: ActionAttempt) -> Result:
        started.set()
        await asyncio.Event().wait()  # never returns
        return Done("unreachable")

    executor = Executor(
        aengine,
        [ScriptedAdapter(kinds.NOOP, stuck_before_fence)],
        ExecutorConfig(handback_grace_seconds=0.1),
        listen=False,
    )
    running = asyncio.create_task(executor.run())
    await asyncio.wait_for(started.wait(), 10)
    executor.stop()
    await asyncio.wait_for(running, 10)
    assert (row(engine, action_id)["state"], row(engine, action_id)["attempt"]) == ("ADMITTED", 0)


@contextlib.asynccontextmanager
async def idle_executor(aengine: AsyncEngine, config: ExecutorConfig, *, listen: bool) -> AsyncIterator[asyncio.Event]:
    """A running executor with nothing to do; the event is set when it carries out an action."""
    carried_out = asyncio.Event()

    async def confirm(attempt: ActionAttempt) -> Result:
        carried_out.set()
        return Done("ok")

    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, confirm)], config, listen=listen)
    running = asyncio.create_task(executor.run())
    try:
        yield carried_out
    finally:
        executor.stop()
        await running


# polling and sweeping once an hour: only a notification can wake the executor in time
NOTIFIED_ONLY = ExecutorConfig(poll_seconds=3600, sweep_seconds=3600)


async def test_an_enqueue_wakes_an_idle_executor(engine: Engine, aengine: AsyncEngine) -> None:
    async with idle_executor(aengine, NOTIFIED_ONLY, listen=True) as carried_out:
        await until_listening(engine)
        await asyncio.to_thread(enqueue, engine)
        await asyncio.wait_for(carried_out.wait(), 10)


async def test_refusing_a_proposed_head_wakes_an_idle_executor(engine: Engine, aengine: AsyncEngine) -> None:
    proposal = enqueue(engine, lane="decide", proposed=True)
    behind = enqueue(engine, lane="decide")
    async with idle_executor(aengine, NOTIFIED_ONLY, listen=True) as carried_out:
        await until_listening(engine)
        await asyncio.to_thread(refuse, engine, proposal)
        await asyncio.wait_for(carried_out.wait(), 10)
    assert row(engine, behind)["attempt"] == 1


async def test_polling_finds_work_when_no_notification_comes(engine: Engine, aengine: AsyncEngine) -> None:
    async with idle_executor(aengine, ExecutorConfig(poll_seconds=0.05), listen=False) as carried_out:
        await asyncio.to_thread(enqueue, engine)
        await asyncio.wait_for(carried_out.wait(), 10)


async def until_listening(engine: Engine) -> None:
    def listening() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND query LIKE 'LISTEN %'"
                    )
                ).scalar_one()
            )

    for _ in range(1000):
        if await asyncio.to_thread(listening):
            return
    raise AssertionError("the executor never listened")


def refuse(engine: Engine, action_id: int) -> None:
    with engine.begin() as conn:
        outbox.refuse(conn, action_id)


async def test_a_retry_before_its_own_fence_keeps_an_earlier_write_known(engine: Engine, aengine: AsyncEngine) -> None:
    """Found by the chaos run's design: a reclaimed read-back action whose adapter fails before its own fence
    (here its read-back lookup raises) is retried, and that retry used to clear write_started_at, which an
    earlier attempt had set. The next attempt then believed nothing was written and wrote a second time."""
    action_id = enqueue(engine)
    provider = Provider()
    with engine.begin() as conn:  # attempt 1 fenced and wrote, then its holder died
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
                " lease_expires_at = now() - interval '1 s', write_started_at = now() WHERE id = :id"
            ),
            {"id": action_id},
        )
    provider.writes.append(action_id)
    seen: list[tuple[int, bool]] = []

    async def behaviour(attempt: ActionAttempt) -> Result:
        seen.append((attempt.action.attempt, attempt.write_started()))
        if attempt.action.attempt == 2:
            raise ConnectionError("the provider's read-back lookup failed")  # before the fence: a Retry
        if attempt.write_started() and provider.holds(attempt.action.id):
            return Done("found by read-back")
        (await attempt.fence().begin_write()).check()
        provider.writes.append(attempt.action.id)
        return Done("written again")

    await drain(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)])
    assert seen == [(2, True), (3, True)]  # the retry still knows the first attempt may have written
    assert provider.writes == [action_id]  # so it read back instead of writing twice
    final = row(engine, action_id)
    assert (final["state"], final["readback_ref"]) == ("DONE", "found by read-back")


async def test_a_retry_after_its_own_fence_clears_it(engine: Engine, aengine: AsyncEngine) -> None:
    """The rule for a proven retry stands: the provider holds nothing, so the fence is cleared."""
    action_id = enqueue(engine)
    seen: list[bool] = []

    async def behaviour(attempt: ActionAttempt) -> Result:
        seen.append(attempt.write_started())
        if attempt.action.attempt == 1:
            (await attempt.fence().begin_write()).check()
            return Retry("451: the provider accepted nothing")
        return Done("ok")

    await drain(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)])
    assert seen == [False, False]
    assert row(engine, action_id)["state"] == "DONE"


def test_a_frozen_executor_does_not_block_enqueues_into_its_lanes(engine: Engine, database_url: str) -> None:
    """Found by the chaos run: an executor frozen (SIGSTOP) inside its group commit kept its lane's row
    locked, and an application's enqueue into that lane waited for as long as the process stayed frozen.
    Every statement of the executor is now a transaction of its own: frozen between two of them (here after
    its fence, before its result), it holds no lock, the enqueue goes through at once, and the executor,
    once it wakes, records its result."""
    action_id = enqueue(engine, lane="frozen")
    frozen, release = threading.Event(), threading.Event()
    outcome: list[Any] = []

    async def freeze_before_the_result(attempt: ActionAttempt) -> Result:
        (await attempt.fence().begin_write()).check()
        if attempt.action.id == action_id:
            frozen.set()
            release.wait(60)  # blocks this executor's event loop: its whole process is frozen
        return Done("ok")

    async def run_executor() -> None:
        aengine = async_engine(database_url)
        executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, freeze_before_the_result)], listen=False)
        outcome.append(await executor.run(until_idle=True))
        await aengine.dispose()

    thread = threading.Thread(target=asyncio.run, args=(run_executor(),))
    thread.start()
    try:
        assert frozen.wait(30), "the executor never passed its fence"
        with engine.begin() as conn:  # the application's transaction: it must not wait for the frozen process
            conn.execute(text("SET LOCAL lock_timeout = '10s'"))
            behind = outbox.enqueue(
                conn,
                outbox.ActionRequest(
                    kind=kinds.NOOP, workspace_id=1, lane_key="frozen", idempotency_key="behind", payload={}
                ),
            )
    finally:
        release.set()
        thread.join(60)
    assert not thread.is_alive() and outcome
    assert row(engine, action_id)["state"] == "DONE"  # recorded after the wake-up
    assert row(engine, behind.id)["state"] == "DONE"


async def test_an_executor_outlives_pool_timeouts(engine: Engine, database_url: str) -> None:
    """Found by the chaos run: after a process is frozen longer than its pool's timeout, the connections it
    was waiting for time out at once. That raised out of the claim loop (the process exited) and killed the
    committer's task (every later fence and result waited forever). Both now try again, as after a restart."""
    aengine = async_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=0.3)
    hog_id = enqueue(engine, lane="hog")
    other_id = enqueue(engine, lane="other")
    hogging = asyncio.Event()

    async def behaviour(attempt: ActionAttempt) -> Result:
        if attempt.action.id == hog_id:
            async with aengine.connect():  # the only pooled connection, held past the pool's timeout
                hogging.set()
                await asyncio.sleep(1.0)
        else:
            await hogging.wait()  # this fence waits for a connection the pool cannot give in time
        (await attempt.fence().begin_write()).check()
        return Done("ok")

    config = ExecutorConfig(sweep_seconds=0.05, poll_seconds=0.05)
    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], config, listen=False)
    try:
        await asyncio.wait_for(executor.run(until_idle=True), 30)
    finally:
        await aengine.dispose()
    assert row(engine, hog_id)["state"] == "DONE"
    assert row(engine, other_id)["state"] == "DONE"
