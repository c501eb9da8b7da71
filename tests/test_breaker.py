"""The breaker, judged from a destination's row: whichever executor saw its failures, however far apart.

    Retry or SlowDown ──▶ Destinations.saw ──▶ NOTE_FAILURE: agent_destination.failing_since kept, failures + 1
    the run lasted `break_seconds`, with BREAK_FAILURES, nothing accepted since it began ──▶ broken
    an attempt accepted meanwhile (a DONE in the actions' record) ──▶ the run starts again from it

The time a run has lasted is made by moving `failing_since` back, as the minutes between a timed-out head's
retries would; every executor here is a Destinations of its own on its own connection, as replicas are.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox._internal.connections.engines import conninfo
from outbox.executor import ActionAttempt, Executor, Result
from outbox.executor.config import ExecutorConfig
from outbox.executor.destinations import Destinations
from outbox.executor.executor import ALONE_SECONDS
from outbox.executor.outcomes import Outcomes
from outbox.executor.pacing import BREAK_FAILURES
from outbox.executor.results import Done, Retry, SlowDown
from outbox.executor.slow_start import INITIAL_WINDOW
from outbox.executor.store import ExecutorStore
from tests import kinds
from tests.adapters import ScriptedAdapter, fence_and_confirm
from tests.test_destinations import accepted_just_now, gated_action, insert_due
from tests.test_nats import until_async

CONFIG = ExecutorConfig()


class Replica:
    """One executor's side of destinations, on a connection of its own."""

    def __init__(self, engine: Engine) -> None:
        self.store = ExecutorStore(conninfo(engine))
        self.outcomes = Outcomes()
        self.destinations = Destinations(self.store, [], CONFIG, self.outcomes)

    async def fail(self, n: int, result: Retry | SlowDown, engine: Engine | None = None) -> None:
        """`n` attempts answered `result`; with `engine`, each after the pause before it is over."""
        for i in range(n):
            if engine is not None:
                with engine.begin() as conn:
                    conn.execute(text("UPDATE agent_destination SET paused_until = now()"))
            await self.destinations.saw(gated_action(i), result)

    def broke(self) -> int:
        return self.outcomes.destinations[("test_noop", "broken")]


def row(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT broken_since IS NOT NULL AS broken, failures,"
                " extract(epoch FROM now() - failing_since)::float8 AS failing_seconds"
                " FROM agent_destination WHERE name = 'test_noop'"
            )
        ).one()


def run_began(engine: Engine, seconds_ago: float) -> None:
    """The run of failures began `seconds_ago`: the minutes a head's retry waits, passed."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE agent_destination SET failing_since = now() - make_interval(secs => :s)"), {"s": seconds_ago}
        )


async def replicas(engine: Engine, n: int) -> list[Replica]:
    return [Replica(engine) for _ in range(n)]


async def closed(found: list[Replica]) -> None:
    for replica in found:
        await replica.store.close()


def test_failures_split_between_executors_and_minutes_apart_break_the_destination(engine: Engine) -> None:
    """Two replicas, each seeing fewer failures than BREAK_FAILURES, the second ones after the first ones'
    retries waited past the window: the destination's run holds them all, and it is broken once."""

    async def scenario() -> tuple[int, int, Any, Any]:
        first, second = found = await replicas(engine, 2)
        try:
            await first.fail(BREAK_FAILURES - 2, Retry("response: no answer within 15 s after the request was sent"))
            before = row(engine)
            run_began(engine, CONFIG.break_seconds + 180)
            await second.fail(2, Retry("response: no answer within 15 s after the request was sent"))
            return first.broke(), second.broke(), before, row(engine)
        finally:
            await closed(found)

    first_broke, second_broke, before, after = asyncio.run(scenario())
    assert not before.broken and before.failures == BREAK_FAILURES - 2
    assert after.broken and after.failures == BREAK_FAILURES
    assert (first_broke, second_broke) == (0, 1)


def test_a_provider_that_only_slows_down_for_the_window_is_broken(engine: Engine) -> None:
    """503 without Retry-After to everything: each a slow-down (the action waits the pause, uncounted), and
    the run of them, as long as the window with nothing accepted, breaks the destination."""

    async def scenario() -> tuple[Any, Any, Any, int]:
        (replica,) = found = await replicas(engine, 1)
        try:
            refused = SlowDown(0.5, "503: the receiver did not take the webhook")
            await replica.fail(3, refused)  # one pause: the slow-downs answered during it are the same refusal
            one_pause = row(engine)
            await replica.fail(BREAK_FAILURES - 1, refused, engine)  # a pause each
            within = row(engine)
            run_began(engine, CONFIG.break_seconds + 1)
            await replica.fail(1, refused, engine)
            return one_pause, within, row(engine), replica.broke()
        finally:
            await closed(found)

    one_pause, within, after, broke = asyncio.run(scenario())
    assert one_pause.failures == 1
    assert not within.broken and within.failures == BREAK_FAILURES  # inside the window: paused, not broken
    assert after.broken and broke == 1


def test_an_attempt_accepted_during_the_run_starts_it_again_from_there(engine: Engine) -> None:
    """A throttling provider refuses now and then and accepts in between: its runs never last the window."""

    async def scenario() -> tuple[Any, Any]:
        (replica,) = found = await replicas(engine, 1)
        try:
            await replica.fail(BREAK_FAILURES, Retry("503"))
            run_began(engine, CONFIG.break_seconds + 60)
            accepted_just_now(engine, 1)  # accepted after the run began: a DONE in the actions' record
            await replica.fail(1, Retry("503"))
            restarted = row(engine)
            await replica.fail(BREAK_FAILURES, Retry("503"))
            return restarted, row(engine)
        finally:
            await closed(found)

    restarted, later = asyncio.run(scenario())
    assert not restarted.broken and restarted.failures == 1 and restarted.failing_seconds < 60
    assert not later.broken  # many failures since, but within the window of the acceptance


def test_a_broken_destination_s_probe_that_succeeds_mends_it_and_ends_its_run(engine: Engine) -> None:
    insert_due(engine, 1)

    async def scenario() -> tuple[Any, int]:
        (replica,) = found = await replicas(engine, 1)
        try:
            await replica.fail(BREAK_FAILURES, Retry("refused"))
            run_began(engine, CONFIG.break_seconds)
            await replica.fail(1, Retry("refused"))
            await replica.fail(3, Retry("refused"))  # the probes' failures: nothing written
            broken = row(engine)
            await replica.destinations.saw(gated_action(0), Done("200"))
            return broken, replica.outcomes.destinations[("test_noop", "mended")]
        finally:
            await closed(found)

    broken, mended = asyncio.run(scenario())
    assert broken.broken and broken.failures == BREAK_FAILURES + 1
    assert mended == 1
    after = row(engine)
    assert not after.broken and after.failures == 0 and after.failing_seconds is None


# -- one destination's share of an executor's slots ------------------------------------------------------------


async def test_a_hanging_destination_keeps_no_more_than_its_share_while_another_has_due_heads(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """Destination `a` answers nothing until released, its 20 heads due an hour before `b`'s 10: of 8 slots
    (a share of 2), `a` keeps to its share, since none of its attempts has come back, so every `b` head ends
    meanwhile (without the share, the first claim took 8 of `a`'s heads and `b` waited for them); once `a`'s
    attempts end, it alone takes every free slot."""
    insert_due(engine, 20, prefix="a", destination="a", due_hours_ago=1.0)
    insert_due(engine, 10, prefix="b", destination="b")
    released = asyncio.Event()
    hanging: list[int] = []
    beside_b: list[int] = []  # a's attempts hanging when each of b's ran
    in_flight: list[int] = []  # a's attempts in flight when each of a's ran, once released

    async def behaviour(attempt: ActionAttempt) -> Result:
        if attempt.action.destination == "a":
            hanging.append(attempt.action.id)
            await released.wait()
            in_flight.append(executor._by_destination["a"])
        else:
            beside_b.append(len(hanging))
        return await fence_and_confirm(attempt)

    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], ExecutorConfig(concurrency=8), listen=False)
    running = asyncio.create_task(executor.run(until_idle=True))
    try:
        await until_async(lambda: done(aengine, "b", 10), 30, "every head of b DONE while a hangs")
        hanging_after_b = len(hanging)
    finally:
        released.set()
        await running
    assert max(beside_b) <= 2 and hanging_after_b == 2, (beside_b, hanging_after_b)
    assert await done(aengine, "a", 20)
    assert max(in_flight) == 8, in_flight  # answered, and alone: every slot


async def test_a_destination_whose_attempts_end_unanswered_keeps_to_its_share_however_many_ended(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """`a`'s attempts end at once without an answer (as a timeout does: Retry), `b`'s wait until released: of 8
    slots (a share of 2), `a` never has more than 2 attempts in flight while `b` has due heads, however many of
    its attempts have ended. An ended attempt is not an answer: when any end counted as one, the claim after
    `a`'s first timeout let it pass its share and gave it every free slot (up to 6 in flight here)."""
    in_flight = await unanswered_beside_waiting(engine, aengine, ExecutorConfig(concurrency=8), 20, 10, fence=False)
    assert max(in_flight) <= 2, in_flight
    assert await done(aengine, "b", 10)


async def test_a_destination_that_has_not_answered_takes_no_more_heads_than_its_slow_start_sends(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """At the defaults (64 slots, a share of 16), `a`'s attempts end without an answer and `b`'s wait: `a` never
    has more than INITIAL_WINDOW attempts in flight, the most its slow start lets send at once (the rest of a
    share would only wait at the gate, each holding a slot that `b` could use), from the first claim on."""
    config = ExecutorConfig()
    in_flight = await unanswered_beside_waiting(engine, aengine, config, 40, 100, fence=True)
    assert max(in_flight) <= INITIAL_WINDOW < config.destination_share, in_flight
    assert await done(aengine, "b", 100)


async def unanswered_beside_waiting(
    engine: Engine, aengine: AsyncEngine, config: ExecutorConfig, a_heads: int, b_heads: int, *, fence: bool
) -> list[int]:
    """`a_heads` of `a` (due an hour ago), whose attempts end at once without an answer (Retry, as a timeout;
    past the gate and the fence first when `fence`), beside `b_heads` of `b`, whose attempts wait until every
    head of `a` has been tried: `a`'s attempts in flight as each of them ran. Returns once the executor is idle."""
    insert_due(engine, a_heads, prefix="a", destination="a", due_hours_ago=1.0)
    insert_due(engine, b_heads, prefix="b", destination="b")
    released = asyncio.Event()
    in_flight: list[int] = []

    async def behaviour(attempt: ActionAttempt) -> Result:
        if attempt.action.destination == "a":
            if fence:
                await attempt.fence().begin_write()  # past the gate, as a request that then times out
            in_flight.append(executor._by_destination["a"])
            return Retry("no answer within 15 s", after=3600.0)
        await released.wait()
        return await fence_and_confirm(attempt)

    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], config, listen=False)
    running = asyncio.create_task(executor.run(until_idle=True))
    try:
        await until_async(lambda: _true(len(in_flight) == a_heads), 30, "every head of a tried while b waits")
    finally:
        released.set()
        await running
    return in_flight


async def _true(value: bool) -> bool:
    return value


async def done(aengine: AsyncEngine, destination: str, count: int) -> bool:
    async with aengine.connect() as conn:
        found = await conn.execute(
            text("SELECT count(*) FROM agent_action WHERE destination = :d AND state = 'DONE'"), {"d": destination}
        )
        return found.scalar_one() == count


async def test_a_busy_executor_serving_one_destination_claims_by_shares_about_once_a_second(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """One destination's 400 heads and 8 slots (a share of 2): once its first attempts end, it is past its share
    at every claim. A claim by shares that finds no other destination's head makes the claims of the next
    ALONE_SECONDS plain (the statement by destination costs more than the plain one), so a drain claims by
    shares about once a second, not at every claim; every head still ends."""
    insert_due(engine, 400, destination="a")
    executor = Executor(
        aengine, [ScriptedAdapter(kinds.NOOP, fence_and_confirm)], ExecutorConfig(concurrency=8), listen=False
    )
    by_shares = claims_by_shares(executor)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await executor.run(until_idle=True)
    seconds = loop.time() - started
    assert await done(aengine, "a", 400)
    bound = seconds / ALONE_SECONDS + 2
    assert len(by_shares) > 3 * bound, (len(by_shares), seconds)  # claims enough for the bound to mean something
    assert sum(by_shares) <= bound, (sum(by_shares), len(by_shares), seconds)


async def test_an_idle_executors_pickup_takes_the_plain_claim(engine: Engine, aengine: AsyncEngine) -> None:
    """An idle executor's 64 free slots could let one destination pass its share, but the plain claim of a
    share's worth comes first and finds the one due head: nothing more is due, so no claim by shares runs (it
    costs a pickup more than the plain one)."""
    insert_due(engine, 1, destination="a")
    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, fence_and_confirm)], ExecutorConfig(), listen=False)
    by_shares = claims_by_shares(executor)
    await executor.run(until_idle=True)
    assert await done(aengine, "a", 1)
    assert by_shares and not any(by_shares), by_shares


def claims_by_shares(executor: Executor) -> list[bool]:
    """Whether each claim of the open destinations `executor` makes from now on is a claim by shares."""
    by_shares: list[bool] = []
    claim = executor._store.claim

    def counted(*args: Any, **kwargs: Any) -> Any:
        by_shares.append(kwargs.get("shares") is not None)
        return claim(*args, **kwargs)

    executor._store.claim = counted  # type: ignore[method-assign]
    return by_shares
