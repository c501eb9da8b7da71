"""Destinations in the database: the name each action gets, the pace two executors hold together, a slow-down's
pause and pace, the breaker's probes, and the plain claim that never waits for a held destination.

    enqueue / raw INSERT ─▶ agent_action.destination (the kind's, or the payload check's)
    two ExecutorStores ─claim_destination, concurrently─▶ claim times (lease_expires_at - lease) per 1 s window
    two executors' Destinations ─gate, bunched attempts─▶ the times their turns came, per 1 s window
    slow_down / note_failure / mend_destination ─▶ agent_destination ─▶ what claim and claim_destination take

The executors' own behaviour against real relays and receivers is in tests/test_throttled_relay.py,
tests/test_postfix_relay.py and tests/test_webhook.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import ActionRequest, enqueue
from outbox._internal.config.rates import BURST_SECONDS, MAX_PER_SECOND, Rate, parse_rate
from outbox._internal.connections.engines import conninfo
from outbox.destinations import destinations
from outbox.executor import ActionAttempt, Done, Executor, Result, SlowDown
from outbox.executor.attempt import DestinationWaits
from outbox.executor.claimed import ClaimedAction
from outbox.executor.config import ExecutorConfig
from outbox.executor.destinations import Destinations
from outbox.executor.outcomes import Outcomes
from outbox.executor.pacing import (
    DECREASE,
    GATE_WAIT_SECONDS,
    IDLE_SECONDS,
    LEVELLED,
    MEASURE_FLOOR_SECONDS,
    MIN_ACCEPTED,
    PACE,
    PAUSE_BASE_SECONDS,
    RECENT_SHARE,
    RECENT_SPAN_SECONDS,
    RETURN_SECONDS,
    SETTLE_SECONDS,
    SLOW_DOWN,
)
from outbox.executor.store import ExecutorStore, Turn
from outbox.store import executor as store_executor
from outbox.store.destinations import _PACE_NOW as PACE_NOW
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.support import until

LEASE = 300.0
KINDS = [kinds.NOOP.name, kinds.READBACK.name]


def insert_due(
    engine: Engine, n: int, kind: str = kinds.NOOP.name, prefix: str = "a", *, destination: str | None = None,
    due_hours_ago: float = 0.0,
) -> None:  # fmt: skip
    """`n` due actions of `kind`, each alone in its lane (so each is its lane's head); of the kind's destination
    unless `destination` names another, due now or `due_hours_ago`."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, max_attempts, state,"
                " destination, due_at)"
                " SELECT :kind, CASE WHEN :kind = 'TEST_NOOP' THEN 1 END, :p || '-lane-' || g, :p || '-' || g, 5,"
                " 'ADMITTED', :destination, now() - make_interval(secs => :ago * 3600)"
                " FROM generate_series(1, :n) AS g"
            ),
            {"kind": kind, "n": n, "p": prefix, "destination": destination, "ago": due_hours_ago},
        )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def with_store(engine: Engine, work: Any) -> Any:
    store = ExecutorStore(conninfo(engine))
    try:
        return await work(store)
    finally:
        await store.close()


# -- names ---------------------------------------------------------------------------------------------


def test_an_action_gets_its_kind_s_destination_and_a_raw_insert_too(engine: Engine) -> None:
    with engine.begin() as conn:
        request = ActionRequest(kind=kinds.NOOP, lane_key="l", idempotency_key="k", workspace_id=1, payload={})
        action = enqueue(conn, request)
    insert_due(engine, 1, kinds.READBACK.name)
    with engine.connect() as conn:
        found = dict(conn.execute(text("SELECT kind, destination FROM agent_action ORDER BY id")).all())
    assert found == {"TEST_NOOP": "test_noop", "TEST_READBACK": "test_readback"}
    assert action.id is not None


def test_a_live_action_always_has_a_destination_of_at_most_80_characters(engine: Engine) -> None:
    with engine.begin() as conn:
        for bad in ("x" * 81, "é" * 81):
            with pytest.raises(Exception, match="ck_agent_action_destination"), conn.begin_nested():
                conn.execute(
                    text(
                        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, max_attempts,"
                        " state, destination) VALUES ('TEST_NOOP', 1, 'l', :key, 5, 'ADMITTED', :bad)"
                    ),
                    {"bad": bad, "key": f"k-{bad}"},
                )
    insert_due(engine, 1)
    with engine.begin() as conn, pytest.raises(Exception, match="ck_agent_action_destination"):
        conn.execute(text("UPDATE agent_action SET destination = NULL"))


# -- rates -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "per_second"), [("14/s", 14.0), ("600/min", 10.0), ("3600/h", 1.0), (" 2.5 / sec ", 2.5)]
)
def test_a_rate_is_attempts_a_unit_of_time(value: str, per_second: float) -> None:
    assert parse_rate(value, "OUTBOX_SMTP_RATE") == Rate(per_second)


@given(st.one_of(st.text(max_size=60), st.integers(), st.none(), st.floats()))
def test_any_other_value_is_refused_naming_the_setting(value: Any) -> None:
    try:
        rate = parse_rate(value, "OUTBOX_SMTP_RATE")
    except ValueError as error:
        assert str(error).startswith("OUTBOX_SMTP_RATE: ")
        assert "\n" not in str(error)
    else:
        assert 0 < rate.per_second <= MAX_PER_SECOND and rate.burst >= 1


# -- the pace, held by two executors together -------------------------------------------------------------

RATE = 20.0
BURST = Rate(RATE).burst  # a quarter of a second's worth: 5


def test_two_executors_together_never_exceed_the_rate_plus_the_burst(engine: Engine) -> None:
    insert_due(engine, 400)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, rate, burst, tokens)"
                " VALUES ('test_noop', 'TEST_NOOP', :rate, :burst, :burst)"
            ),
            {"rate": RATE, "burst": BURST},
        )

    async def claimer(stop: asyncio.Event) -> int:
        async def loop(store: ExecutorStore) -> int:
            taken = 0
            while not stop.is_set():
                claimed, wait = await store.claim_destination("test_noop", 5, LEASE, KINDS, PACE | {"probe_seconds": 1})
                taken += len(claimed)
                await asyncio.sleep(min(wait or 0.01, 0.05))  # an executor wakes when the next token is due
            return taken

        result: int = await with_store(engine, loop)
        return result

    async def both() -> list[int]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(claimer(stop)) for _ in range(2)]
        await asyncio.sleep(3.0)  # the span measured, not a synchronisation
        stop.set()
        return list(await asyncio.gather(*tasks))

    taken = run(both())
    with engine.connect() as conn:
        times = [
            float(t)
            for t in conn.execute(
                text(
                    "SELECT extract(epoch FROM lease_expires_at - make_interval(secs => :lease)) FROM agent_action"
                    " WHERE state = 'EXECUTING' ORDER BY 1"
                ),
                {"lease": LEASE},
            ).scalars()
        ]
    assert sum(taken) == len(times) and all(taken), taken  # both executors claimed
    worst = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert worst <= RATE + BURST, worst
    span = times[-1] - times[0]
    assert len(times) >= RATE * span * 0.8, (len(times), span)  # and the rate is used, not starved


def gated_action(n: int) -> ClaimedAction:
    """An attempt of destination test_noop as a claim hands it over (the gate reads its destination only)."""
    return ClaimedAction(
        n, kinds.NOOP, f"lane-{n}", f"k-{n}", 1, None, None, 1, 5, 1, None, datetime.now(UTC), LEASE,
        destination="test_noop",
    )  # fmt: skip


def paced_with_an_empty_bucket(engine: Engine, pace: float) -> None:
    """Destination test_noop paced at `pace` a second from now on, its send bucket empty."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, pace, pace_at, send_tokens, send_tokens_at)"
                " VALUES ('test_noop', 'TEST_NOOP', :pace, now(), 0, now())"
            ),
            {"pace": pace},
        )


def watch_turns(store: ExecutorStore, seen: Callable[[list[Turn], float, float], None]) -> None:
    """From now on, each statement of turns `store` makes goes to `seen`: its turns, and the event loop's time
    when it was asked and when it was answered."""
    take_send_tokens = store.take_send_tokens
    loop = asyncio.get_running_loop()

    async def taking(name: str, count: int, pacing: Any) -> list[Turn]:
        asked = loop.time()
        given = await take_send_tokens(name, count, pacing)
        seen(given, asked, loop.time())
        return given

    store.take_send_tokens = taking  # type: ignore[method-assign]


def test_attempts_that_reach_their_fences_bunched_take_turns_at_the_rate_plus_the_burst(engine: Engine) -> None:
    """Two executors' attempts arrive at the gate in bunches of twice the rate (as claims made over a second
    that a busy machine brings to their fences at once): the turns the database gives them are at most the
    rate and the burst in any second, and they pass the gate at the rate over the run. (The turns, not the
    moments each attempt woke: on a loaded machine the event loop may wake two sleepers a little late
    together.)"""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO agent_destination (name, kind, rate, burst) VALUES ('test_noop', 'TEST_NOOP', :r, :b)"),
            {"r": RATE, "b": BURST},
        )
    bunch, bunches = int(2 * RATE), 3

    async def executor(first: int) -> tuple[list[tuple[float, float]], list[float]]:
        async def attempts(store: ExecutorStore) -> tuple[list[tuple[float, float]], list[float]]:
            destinations = Destinations(store, [], ExecutorConfig(), Outcomes())
            await destinations.refresh([kinds.NOOP.name])
            loop = asyncio.get_running_loop()
            # when the database's answer said each attempt's turn comes: between the question's time and the
            # answer's, plus the wait (the database's clock read the time somewhere in that round trip)
            turns: list[tuple[float, float]] = []
            passed: list[float] = []

            def seen(given: list[Turn], asked: float, answered: float) -> None:
                turns.extend((asked + t.wait_seconds, answered + t.wait_seconds) for t in given if not t.paused)

            watch_turns(store, seen)

            async def attempt(n: int) -> None:
                await destinations.gate(gated_action(n))
                passed.append(loop.time())

            for b in range(bunches):
                await asyncio.gather(*(attempt(first + b * bunch + i) for i in range(bunch // 2)))
            return turns, passed

        found: tuple[list[tuple[float, float]], list[float]] = await with_store(engine, attempts)
        return found

    async def both() -> tuple[list[tuple[float, float]], list[float]]:
        first, second = await asyncio.gather(executor(0), executor(10_000))
        return sorted(first[0] + second[0]), sorted(first[1] + second[1])

    turns, times = run(both())
    assert len(turns) == len(times) == bunch * bunches
    # the most turns certainly within one second (on a loaded machine a round trip can take long enough to
    # put a turn's client-side time in the next second's window)
    worst = max(sum(1 for early, late in turns if t <= early and late < t + 1.0) for t, _ in turns)
    assert worst <= RATE + BURST, worst
    span = times[-1] - times[0]
    assert (len(times) - BURST) / span == pytest.approx(RATE, rel=0.1), span


def test_an_attempt_of_a_paused_destination_waits_the_pause_or_defers_a_long_one(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, paused_until, paused_by)"
                " VALUES ('test_noop', 'TEST_NOOP', now() + interval '0.5 s', 'provider')"
            )
        )

    async def gate(store: ExecutorStore) -> float:
        destinations = Destinations(store, [], ExecutorConfig(), Outcomes())
        await destinations.refresh([kinds.NOOP.name])
        loop = asyncio.get_running_loop()
        started = loop.time()
        await destinations.gate(gated_action(1))
        waited = loop.time() - started
        await store.slow_down("test_noop", "TEST_NOOP", 60.0, "429; Retry-After 60", SLOW_DOWN)
        with pytest.raises(DestinationWaits) as waits:
            await destinations.gate(gated_action(2))
        assert 59 < waits.value.seconds <= 60 and "paused" in str(waits.value)
        return waited

    waited = run(with_store(engine, gate))
    assert 0.3 < waited < 5, waited  # the rest of the pause, then its turn at once (an open bucket)


def test_a_turn_that_a_pause_voided_while_the_attempt_waited_is_taken_again(engine: Engine) -> None:
    """An attempt waits for its turn half a second away (a pace of 2 a second, its bucket empty); meanwhile
    the provider refuses another attempt. The pause voids every turn given before it: the waiting attempt
    does not go at its old turn (the provider would refuse it too, and each such turn once meant a refusal),
    it takes a turn again under the pause and the lowered pace, and passes after both."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, pace, pace_at, send_tokens, send_tokens_at)"
                " VALUES ('test_noop', 'TEST_NOOP', 2, now() - make_interval(secs => :back), 0, now())"
            ),
            {"back": RETURN_SECONDS / 2},  # lowered a while ago: the slow-down below may lower it again
        )

    async def gate(store: ExecutorStore) -> tuple[list[Turn], bool]:
        destinations = Destinations(store, [], ExecutorConfig(), Outcomes())
        await destinations.refresh([kinds.NOOP.name])
        turns: list[Turn] = []
        first_given = asyncio.Event()

        def seen(given: list[Turn], asked: float, answered: float) -> None:
            turns.extend(given)
            first_given.set()

        watch_turns(store, seen)
        waiting = asyncio.create_task(destinations.gate(gated_action(1)))
        await first_given.wait()
        slowed = await store.slow_down("test_noop", "TEST_NOOP", None, "mail: 454; slow down", SLOW_DOWN)
        await waiting
        return turns, slowed.newly_paused

    turns, newly_paused = run(with_store(engine, gate))
    assert newly_paused
    first, *again = turns
    assert not first.paused and 0.3 < first.wait_seconds <= 0.5, first
    assert again and all(turn.slowed_at is not None and turn.slowed_at != first.slowed_at for turn in again), turns


def test_attempts_whose_turns_are_too_far_off_defer_without_taking_a_turn(engine: Engine) -> None:
    """A pace of 2 a second and 40 attempts asking for their turns in one statement (as when the pace is lowered
    under the attempts already claimed): the first take turns up to GATE_WAIT_SECONDS away, the rest are told a
    turn further off and take none, so the next one's turn is no further off than theirs, and an executor's
    attempt then defers at once. (Had each taken its turn, every later one would be further off, until no
    attempt's turn came within GATE_WAIT_SECONDS and the destination sent nothing while its backlog waited.)"""
    pace = 2.0
    paced_with_an_empty_bucket(engine, pace)

    async def gate(store: ExecutorStore) -> tuple[list[float], str]:
        destinations = Destinations(store, [], ExecutorConfig(), Outcomes())
        await destinations.refresh([kinds.NOOP.name])
        turns = await store.take_send_tokens("test_noop", 40, PACE | {"gate_wait": GATE_WAIT_SECONDS})
        waits = [turn.wait_seconds for turn in turns]
        with pytest.raises(DestinationWaits) as deferred:
            await destinations.gate(gated_action(1))
        return waits, str(deferred.value)

    waits, deferred = run(with_store(engine, gate))
    taken = [wait for wait in waits if wait <= GATE_WAIT_SECONDS]
    assert taken == waits[: len(taken)] == sorted(taken) and len(taken) >= GATE_WAIT_SECONDS * pace - 1, waits
    told = waits[len(taken) :]
    assert told and all(GATE_WAIT_SECONDS < wait < GATE_WAIT_SECONDS + 1 for wait in told), told  # no further off
    assert "its turn is" in deferred, deferred


def test_the_attempts_at_one_gate_together_take_their_turns_in_one_statement(engine: Engine) -> None:
    """20 attempts of a destination paced at 10 a second, its bucket empty, reach one executor's gate at once:
    their turns are taken in one statement (not 20, each locking the destination's row), one token apart in
    the order asked; every attempt passes the gate after its turn, and the row holds the 20 tokens taken."""
    pace, count = 10.0, 20
    paced_with_an_empty_bucket(engine, pace)

    async def gate(store: ExecutorStore) -> tuple[list[list[Turn]], list[float]]:
        destinations = Destinations(store, [], ExecutorConfig(), Outcomes())
        await destinations.refresh([kinds.NOOP.name])
        loop = asyncio.get_running_loop()
        statements: list[list[Turn]] = []
        watch_turns(store, lambda given, asked, answered: statements.append(given))
        started = loop.time()

        async def attempt(n: int) -> float:
            await destinations.gate(gated_action(n))
            return loop.time() - started

        passed = await asyncio.gather(*(attempt(n) for n in range(count)))
        return statements, list(passed)

    statements, passed = run(with_store(engine, gate))
    assert [len(given) for given in statements] == [count], statements
    waits = [turn.wait_seconds for turn in statements[0]]
    assert 0 < waits[0] <= 1 / pace, waits
    assert all(b - a == pytest.approx(1 / pace, rel=0.01) for a, b in pairwise(waits)), waits
    assert all(after >= wait for after, wait in zip(passed, waits, strict=True)), (passed, waits)  # each its own
    with engine.connect() as conn:
        tokens = conn.execute(text("SELECT send_tokens FROM agent_destination")).scalar_one()
    assert -count < tokens < -count + 1, tokens  # 20 taken from what the bucket had refilled (under one)


async def test_an_attempt_whose_destination_paused_after_its_claim_defers_uncounted(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """Two heads claimed together; the first attempt's provider names a wait of a minute; the second reaches
    its fence after that: it is not sent, and neither attempt counts."""
    insert_due(engine, 2)

    def paused() -> bool:
        with engine.connect() as conn:
            return bool(conn.execute(text("SELECT paused_until > now() FROM agent_destination")).scalar())

    async def behaviour(attempt: ActionAttempt) -> Result:
        if attempt.action.id == first:
            return SlowDown(60.0, "429; Retry-After 60", named=True)
        await asyncio.to_thread(until, paused, 30, "the other attempt's slow-down")
        await attempt.fence().begin_write()
        raise AssertionError("the fence of a paused destination's attempt was granted")

    with engine.connect() as conn:
        first = conn.execute(text("SELECT min(id) FROM agent_action")).scalar_one()
    await Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], listen=False).run(until_idle=True)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT state, attempt, epoch, write_started_at, last_error,"
                " extract(epoch FROM due_at - now()) AS wait FROM agent_action ORDER BY id"
            )
        ).all()
    assert [(r.state, r.attempt, r.epoch, r.write_started_at) for r in rows] == [("ADMITTED", 0, 1, None)] * 2
    assert all(55 < r.wait <= 60 for r in rows), rows
    assert "paused" in rows[1].last_error, rows[1].last_error


async def test_an_executor_holds_a_destination_that_another_paused_as_soon_as_it_hears_of_it(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """Two executors, one attempt in flight each; the provider refuses one of them with a wait of a minute.
    The other executor's next sweep is a minute away, but it hears of the pause (the slow-down's NOTIFY) and
    holds the destination at once: its attempt, which reaches its fence after that, is not sent, and neither
    attempt counts. (Without it, every executor's whole concurrency reached a provider that had started to
    refuse, until each saw a refusal of its own or swept.)"""
    insert_due(engine, 2)
    with engine.connect() as conn:
        first = conn.execute(text("SELECT min(id) FROM agent_action")).scalar_one()
    config = ExecutorConfig(concurrency=1, sweep_seconds=60.0)
    executors: list[Executor] = []

    def both_claimed() -> bool:  # else the later claim would skip the paused destination, and prove nothing
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM agent_action WHERE state = 'EXECUTING'")).scalar() == 2

    def adapter(n: int) -> ScriptedAdapter:
        async def behaviour(attempt: ActionAttempt) -> Result:
            if attempt.action.id == first:
                await asyncio.to_thread(until, both_claimed, 30, "both actions claimed, one by each executor")
                return SlowDown(60.0, "429; Retry-After 60", named=True)
            held = executors[n]._destinations  # this attempt's own executor
            await asyncio.to_thread(until, lambda: held.some_held, 30, "the other executor's pause, heard")
            await attempt.fence().begin_write()
            raise AssertionError("the fence of a paused destination's attempt was granted")

        return ScriptedAdapter(kinds.NOOP, behaviour)

    executors += [Executor(aengine, [adapter(n)], config) for n in range(2)]
    await asyncio.gather(*(executor.run(until_idle=True) for executor in executors))
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state, attempt, write_started_at, last_error FROM agent_action ORDER BY id")
        ).all()
    assert [(r.state, r.attempt, r.write_started_at) for r in rows] == [("ADMITTED", 0, None)] * 2, rows
    assert "paused" in rows[1].last_error, rows[1].last_error


async def test_a_held_destination_is_claimed_for_again_when_its_attempt_ends(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """A destination with a rate (held: claimed for in a statement of its own), a lane of three actions and a
    lane of one. The lone action's attempt ends while the other lane's head is executing, and the claim that
    follows finds no ready head; the executor polls only every minute. When the head's attempt ends, its lane's
    next head is claimed at once (an executor that waited for its poll left the lane's backlog for a second per
    action, and `until_idle` here would stop with it undone)."""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO agent_destination (name, kind, rate, burst) VALUES ('test_noop', 'TEST_NOOP', 1000, 100)")
        )
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, max_attempts, state,"
                " destination) SELECT 'TEST_NOOP', 1, CASE WHEN g = 0 THEN 'alone' ELSE 'three' END, 'k-' || g, 5,"
                " 'ADMITTED', 'test_noop' FROM generate_series(0, 3) AS g"
            )
        )
        head = conn.execute(text("SELECT min(id) FROM agent_action WHERE lane_key = 'three'")).scalar_one()
    config = ExecutorConfig(poll_seconds=60.0, sweep_seconds=60.0)
    executor: Executor

    async def behaviour(attempt: ActionAttempt) -> Result:
        if attempt.action.id == head:
            # a claim found no ready head: it is not claimed for again before the poll (the loop's clock)
            polls_later = lambda: executor._destinations._not_before.get("test_noop", 0.0) > time.monotonic() + 30  # noqa: E731
            await asyncio.to_thread(until, polls_later, 30, "a claim that found no ready head")
        await attempt.fence().begin_write()
        return Done(f"ref-{attempt.action.id}")

    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], config, listen=False)
    await asyncio.wait_for(executor.run(until_idle=True), 30)
    with engine.connect() as conn:
        states = conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all()
    assert [tuple(row) for row in states] == [("DONE", 4)], states


# -- a slow-down -------------------------------------------------------------------------------------------


def destination(engine: Engine, name: str = "test_noop") -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT (extract(epoch FROM paused_until) - extract(epoch FROM now()))::float8 AS paused_for,"
                " paused_by, pause_reason, pace, slow_downs, broken_since IS NOT NULL AS broken"
                " FROM agent_destination WHERE name = :name"
            ),
            {"name": name},
        ).one()


def test_a_slow_down_pauses_doubles_in_a_row_and_ignores_the_attempts_already_in_flight(engine: Engine) -> None:
    async def slow(store: ExecutorStore, after: float | None = None) -> Any:
        return await store.slow_down("test_noop", "TEST_NOOP", after, "mail: 454; slow down", SLOW_DOWN)

    first = run(with_store(engine, slow))
    assert first.newly_paused and 0 < first.pause_seconds <= PAUSE_BASE_SECONDS
    assert first.pace is None  # nothing was accepted lately: the pause alone
    again = run(with_store(engine, slow))  # an attempt claimed before the pause, refused during it
    assert not again.newly_paused and again.pause_seconds <= first.pause_seconds
    with engine.begin() as conn:
        conn.execute(text("UPDATE agent_destination SET paused_until = now()"))  # the pause is over
    second = run(with_store(engine, slow))
    assert second.newly_paused and PAUSE_BASE_SECONDS < second.pause_seconds <= 2 * PAUSE_BASE_SECONDS
    named = run(with_store(engine, lambda store: slow(store, 30.0)))  # the provider names a longer wait
    assert 29 < named.pause_seconds <= 30
    found = destination(engine)
    assert (found.paused_by, found.slow_downs, found.pause_reason) == ("provider", 2, "mail: 454; slow down")


def accepted_just_now(engine: Engine, n: int, sent_seconds_ago: float | list[float] = 0.0) -> None:
    """`n` actions of test_noop that its provider accepted just now (DONE, through the guard's moves), sent
    (their fences) `sent_seconds_ago`: for all, or for each in turn."""
    insert_due(engine, n)
    agos = sent_seconds_ago if isinstance(sent_seconds_ago, list) else [sent_seconds_ago] * n
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
                " lease_expires_at = now() + interval '5 min'"
            )
        )
        conn.execute(
            text(
                "UPDATE agent_action AS a SET write_started_at = now() - make_interval(secs => s.ago)"
                " FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM agent_action) AS r,"
                " unnest(CAST(:agos AS float8[])) WITH ORDINALITY AS s (ago, n)"
                " WHERE a.id = r.id AND r.n = s.n"
            ),
            {"agos": agos},
        )
        conn.execute(text("UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED'"))


def slow_down(engine: Engine) -> Any:
    """A 421 slow-down of test_noop, no wait named."""
    return run(with_store(engine, lambda s: s.slow_down("test_noop", "TEST_NOOP", None, "421", SLOW_DOWN)))


@pytest.mark.parametrize(
    ("accepted", "pace"), [(40, DECREASE * 40 / MEASURE_FLOOR_SECONDS), (MIN_ACCEPTED - 1, DECREASE * 100 * LEVELLED)]
)
def test_a_slow_down_lowers_the_pace_to_what_the_provider_accepted(engine: Engine, accepted: int, pace: float) -> None:
    """A pace of 100 a second, at its level; the provider accepted `accepted` at once, just now: a rate measured
    over the shortest span (0.5 s), and the pace comes down to 90 % of that; fewer than MIN_ACCEPTED measure
    nothing, and it comes down to 90 % of itself."""
    paced(engine, 100.0, RETURN_SECONDS)
    accepted_just_now(engine, accepted)
    assert slow_down(engine).pace == pytest.approx(pace, rel=0.02)


def test_a_first_pace_with_too_few_sent_since_the_refusal_measures_the_last_seconds(engine: Engine) -> None:
    """A slow-down in a row, 1.4 s after the refusal that paused the destination: one email sent since was
    accepted (the executors waited the pause, and the provider's refill went to the attempts already in
    flight), twenty sent before it. One over 1.4 s would be a pace of 0.64 a second against a provider that
    takes twenty, and the backlog would crawl for a minute while it climbed: too few to measure from the
    refusal, so the first pace is what was sent in the last seconds and accepted."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, paused_until, paused_by, slow_downs, slowed_at)"
                " VALUES ('test_noop', 'TEST_NOOP', now(), 'provider', 1, now() - interval '1.4 s')"
            )
        )
    accepted_just_now(engine, 21, [1.5] * 20 + [0.2])
    with engine.begin() as conn:  # they ended before the pause did: the slow-down is in a row
        conn.execute(text("UPDATE agent_destination SET paused_until = now()"))
    slowed = slow_down(engine)
    assert destination(engine).slow_downs == 2
    assert slowed.pace == pytest.approx(DECREASE * 21 / 1.5, rel=0.15)


def test_a_slow_down_in_a_row_takes_a_pace_from_as_few_as_one_accepted(engine: Engine) -> None:
    """Nothing accepted: the first slow-down pauses alone. The provider then accepts two of the attempts sent
    after it, and the next slow-down in a row (nothing accepted since the pause ended) takes its pace from
    those two (too few to measure from the refusal: what was sent in the last seconds, from as few as one),
    so that the executors do not send their whole concurrency again after every pause while it doubles."""
    assert slow_down(engine).pace is None
    accepted = 2
    accepted_just_now(engine, accepted)
    with engine.begin() as conn:  # the pause is over; it began MEASURE_FLOOR_SECONDS before the two were sent
        conn.execute(
            text(
                "UPDATE agent_destination SET paused_until = now(), slowed_at = now() - make_interval(secs => :floor)"
            ),
            {"floor": MEASURE_FLOOR_SECONDS},
        )
    again = slow_down(engine)
    assert 0 < again.pace <= 0.9 * accepted / MEASURE_FLOOR_SECONDS
    assert destination(engine).slow_downs == 2


def test_a_first_pace_in_a_row_is_not_far_below_what_the_provider_accepted_in_the_last_seconds(
    engine: Engine,
) -> None:
    """A third slow-down in a row at a cold start, no pace yet: the refusal that paused the destination came 4.4 s
    ago (its pause had doubled to 2 s), and of the twenty emails the provider accepted in the last second only five
    were sent since it (the executors waited the pause; the others were in flight before it). Those five over the
    4.4 s since the refusal measure 1.1 a second against a provider that takes twenty: the first pace is not
    below RECENT_SHARE of what it accepted over the last seconds (here RECENT_SPAN_SECONDS: they ended together)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, paused_until, paused_by, slow_downs, slowed_at)"
                " VALUES ('test_noop', 'TEST_NOOP', now(), 'provider', 2, now() - interval '4.4 s')"
            )
        )
    accepted_just_now(engine, 20, [4.6] * 15 + [0.3] * 5)
    with engine.begin() as conn:  # they ended before the pause did: the slow-down is in a row
        conn.execute(text("UPDATE agent_destination SET paused_until = now()"))
    slowed = slow_down(engine)
    assert destination(engine).slow_downs == 3
    floor = RECENT_SHARE * 20 / RECENT_SPAN_SECONDS
    assert floor * 0.98 <= slowed.pace <= 20


def test_a_first_pace_measures_what_the_provider_accepted_since_it_last_refused(engine: Engine) -> None:
    """No pace yet; the provider refused a second ago (its bucket empty then) and the pause is over. It accepted
    forty sent before that refusal (its saved-up bucket, not its rate) and ten sent since: the first pace is
    90 % of those ten over the second since the refusal, not of all fifty over the time since the first was
    sent (30 a second)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, paused_until, paused_by, slow_downs, slowed_at)"
                " VALUES ('test_noop', 'TEST_NOOP', now() - interval '0.5 s', 'provider', 1, now() - interval '1 s')"
            )
        )
    accepted_just_now(engine, 50, [1.5] * 40 + [0.5] * 10)
    slowed = slow_down(engine)
    assert slowed.pace == pytest.approx(DECREASE * 10 / 1.0, rel=0.15)


def paced(engine: Engine, pace: float, lowered_seconds_ago: float) -> None:
    """test_noop paced at `pace` since it was lowered `lowered_seconds_ago`, its pause over."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, pace, pace_at, paused_until, paused_by, slow_downs)"
                " VALUES ('test_noop', 'TEST_NOOP', :pace, now() - make_interval(secs => :ago),"
                " now() - make_interval(secs => :ago), 'provider', 1)"
            ),
            {"pace": pace, "ago": lowered_seconds_ago},
        )


@pytest.mark.parametrize(("lowered_seconds_ago", "lowers"), [(0.2, False), (SETTLE_SECONDS + 0.5, True)])
def test_a_slow_down_soon_after_the_pace_was_lowered_pauses_without_lowering_it_again(
    engine: Engine, lowered_seconds_ago: float, lowers: bool
) -> None:
    """The refusals of attempts sent at the pace before it was lowered come within SETTLE_SECONDS: each pauses
    the destination, none lowers the pace again (a tenth each, a run of them would take it far below the
    provider's limit); one after that lowers it."""
    paced(engine, 10.0, lowered_seconds_ago)
    slowed = slow_down(engine)
    assert slowed.newly_paused
    if lowers:
        x = (lowered_seconds_ago - RETURN_SECONDS) / RETURN_SECONDS
        pace_then = 10 * (LEVELLED + (LEVELLED - 1) * x**3)  # the pace had risen a little since
        assert slowed.pace == pytest.approx(DECREASE * pace_then, rel=0.02)
    else:
        assert slowed.pace == 10.0


def test_a_slow_down_lowers_a_pace_far_above_what_the_provider_accepted_to_that(engine: Engine) -> None:
    """A pace of 40 a second, but the provider accepted 10 at once (20 a second over the shortest span): it
    refuses because its limit is what it accepts, so the pace comes down to 0.9 of that in one slow-down."""
    paced(engine, 40.0, 60.0)
    accepted_just_now(engine, 10)
    slowed = slow_down(engine)
    assert slowed.pace == pytest.approx(DECREASE * 10 / MEASURE_FLOOR_SECONDS, rel=0.05)


@pytest.mark.parametrize("lowered", [0.9, 9.0, 90.0])
def test_a_lowered_pace_climbs_back_in_return_seconds_levels_then_rises_to_its_ceiling(
    engine: Engine, lowered: float
) -> None:
    """The pace `t` seconds after it was lowered to `lowered` (from `lowered / DECREASE`), every half second
    over a minute, its attempts taking their turns all along (the last just now), as the claim reads it: the
    same curve at 1, 10 and 100 a second, so a cycle of slow-downs lasts about as long whatever the provider's
    limit."""
    with engine.connect() as conn:
        curve = dict(
            conn.execute(
                text(
                    "SELECT s.t::float8, " + PACE_NOW.format(t="d") + " FROM generate_series(0, 60, 0.5) AS s (t)"
                    " CROSS JOIN LATERAL (SELECT CAST(:lowered AS float8) AS pace,"
                    " now() - make_interval(secs => s.t) AS pace_at, now() AS send_tokens_at) AS d"
                ),
                PACE | {"lowered": lowered},
            ).all()
        )
    level = lowered * LEVELLED
    paces = list(curve.values())
    assert all(a <= b for a, b in pairwise(paces)), paces  # never falls
    assert curve[0.0] == pytest.approx(lowered) and curve[RETURN_SECONDS] == pytest.approx(level)
    assert all(abs(curve[t] - level) <= 0.01 * level for t in (3.0, 4.0, 6.0, 7.0))  # level below where it was
    assert curve[2 * RETURN_SECONDS] == pytest.approx(2 * level - lowered)  # above it, as fast as it came back
    assert curve[60.0] == pytest.approx(2 * lowered + 1)  # the ceiling


def test_an_idle_pace_holds_and_starts_its_curve_again_from_there_when_used(engine: Engine) -> None:
    """A pace lowered to 10 a second a minute ago, its attempts' last turn taken 8 s after (they had drained the
    backlog, and took none since): past its level it rose only while it was used, 8 - RETURN_SECONDS seconds,
    and holds there, below its ceiling of 21 that the time since the lowering alone gives. The next turn starts
    its curve again from where it held, levelled: the pace is the same, and rises again from there."""
    used = 8.0
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, pace, pace_at, send_tokens, send_tokens_at)"
                " VALUES ('test_noop', 'TEST_NOOP', 10, now() - interval '60 s', 0,"
                " now() - interval '60 s' + make_interval(secs => :used))"
            ),
            {"used": used},
        )
    x = (used + IDLE_SECONDS - RETURN_SECONDS) / RETURN_SECONDS
    held = 10 * (LEVELLED + (LEVELLED - 1) * x**3)
    with engine.connect() as conn:
        assert only_destination(conn).pace == pytest.approx(held, rel=0.01)  # as the gauge and the CLI read it
    (turn,) = run(with_store(engine, lambda store: store.take_send_tokens("test_noop", 1, PACE | {"gate_wait": 10.0})))
    assert turn.wait_seconds == 0 and not turn.paused
    with engine.connect() as conn:
        restarted = conn.execute(
            text("SELECT pace, extract(epoch FROM now() - pace_at)::float8 AS since FROM agent_destination")
        ).one()
        assert only_destination(conn).pace == pytest.approx(held, rel=0.01)
    assert restarted.pace == pytest.approx(held / LEVELLED, rel=0.01)
    assert RETURN_SECONDS <= restarted.since < RETURN_SECONDS + 5


def only_destination(conn: Any) -> Any:
    (found,) = destinations(conn)
    return found


@pytest.mark.parametrize(("due", "restarted"), [(20, True), (1, False)])
def test_a_pace_at_its_ceiling_starts_again_from_there_when_the_claim_uses_its_tokens(
    engine: Engine, due: int, restarted: bool
) -> None:
    """A pace lowered to 4 a minute ago is at its ceiling, 9 a second. A claim that takes every token it allows
    (20 heads due) starts the curve again from there (the provider still accepts what the executors keep up
    with): the pace now 9 as before, the stored one 0.9 of it; a claim that leaves tokens over (1 head due)
    changes nothing."""
    insert_due(engine, due)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, pace, pace_at, tokens, tokens_at)"
                " VALUES ('test_noop', 'TEST_NOOP', 4, now() - interval '60 s', 10, now())"
            )
        )

    async def claim(store: ExecutorStore) -> list[ClaimedAction]:
        claimed, _ = await store.claim_destination("test_noop", due, LEASE, KINDS, PACE | {"probe_seconds": 1})
        return claimed

    claimed = run(with_store(engine, claim))
    assert len(claimed) == min(due, int(9 * BURST_SECONDS))  # a full bucket: a quarter of a second of 9/s
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT d.pace, extract(epoch FROM now() - d.pace_at)::float8 AS since, "
                + PACE_NOW.format(t="d")
                + " AS pace_now FROM agent_destination AS d"
            ),
            PACE,
        ).one()
    if restarted:
        assert row.pace == pytest.approx(9 / LEVELLED) and RETURN_SECONDS <= row.since < RETURN_SECONDS + 5
    else:
        assert row.pace == 4 and row.since >= 60
    assert row.pace_now == pytest.approx(9, rel=0.01)


def pause(engine: Engine, name: str, kind: str = kinds.NOOP.name, reason: str = "test") -> None:
    """An operator's pause of `name` without end."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_destination (name, kind, paused_until, paused_by, pause_reason)"
                " VALUES (:name, :kind, 'infinity', 'operator', :reason)"
            ),
            {"name": name, "kind": kind, "reason": reason},
        )


def test_an_operator_s_pause_stays_the_operator_s(engine: Engine) -> None:
    pause(engine, "test_noop", reason="relay maintenance")
    run(with_store(engine, lambda s: s.slow_down("test_noop", "TEST_NOOP", 5.0, "429", SLOW_DOWN)))
    found = destination(engine)
    assert (found.paused_by, found.pause_reason, found.paused_for) == ("operator", "relay maintenance", float("inf"))


# -- what the claims take ----------------------------------------------------------------------------------


@pytest.mark.parametrize("some_held", [False, True], ids=["plain", "destination by destination"])
def test_the_plain_claim_skips_a_held_destination_and_takes_every_other(engine: Engine, some_held: bool) -> None:
    insert_due(engine, 30, kinds.NOOP.name, "noop")
    insert_due(engine, 30, kinds.READBACK.name, "readback")
    run(with_store(engine, lambda s: s.slow_down("test_noop", "TEST_NOOP", 60.0, "429", SLOW_DOWN)))

    async def claims(store: ExecutorStore) -> tuple[set[str], list[Any], float | None]:
        plain = await store.claim(100, LEASE, KINDS, some_held=some_held)
        held, wait = await store.claim_destination("test_noop", 100, LEASE, KINDS, PACE | {"probe_seconds": 1})
        return {a.kind.name for a in plain} | {f"n={len(plain)}"}, held, wait

    plain, held, wait = run(with_store(engine, claims))
    assert plain == {"TEST_READBACK", "n=30"}
    assert held == [] and wait is not None and 59 < wait <= 60  # paused: nothing, and when to look again


def claimed_ids(engine: Engine, limit: int, **claim: Any) -> list[int]:
    found = run(with_store(engine, lambda s: s.claim(limit, LEASE, KINDS, **claim)))
    return [a.id for a in found]


def due_ids(engine: Engine, where: str) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text(f"SELECT id FROM agent_action WHERE {where} ORDER BY due_at, id")).scalars())


def test_destination_by_destination_the_claim_takes_the_first_due_of_every_open_destination(engine: Engine) -> None:
    insert_due(engine, 10, kinds.NOOP.name, "later", destination="relay-b", due_hours_ago=1)
    insert_due(engine, 10, kinds.NOOP.name, "first", destination="relay-a", due_hours_ago=2)
    insert_due(engine, 10, kinds.READBACK.name, "between", due_hours_ago=1.5)
    insert_due(engine, 10, kinds.NOOP.name, "parked", destination="parked", due_hours_ago=3)
    pause(engine, "parked")
    first = due_ids(engine, "destination = 'relay-a'")
    between = due_ids(engine, "kind = 'TEST_READBACK'")
    later = due_ids(engine, "destination = 'relay-b'")

    taken = set(claimed_ids(engine, 15, some_held=True))  # the heads of one insert share their due time
    assert set(first) < taken and len(taken - set(first)) == 5 and taken - set(first) < set(between)
    assert sorted(claimed_ids(engine, 100, some_held=True)) == sorted(set(between + later) - taken)
    assert claimed_ids(engine, 100, some_held=True) == []  # the paused destination's heads stay


def test_destination_by_destination_the_claim_skips_what_another_replica_holds_without_waiting(
    engine: Engine,
) -> None:
    insert_due(engine, 30, kinds.NOOP.name, "open")
    pause(engine, "parked")
    heads = due_ids(engine, "true")
    with engine.begin() as conn:  # another replica's claim, not yet committed
        conn.execute(text("SELECT id FROM agent_action WHERE id = ANY (:ids) FOR NO KEY UPDATE"), {"ids": heads[:10]})
        assert sorted(claimed_ids(engine, 100, some_held=True)) == heads[10:]


def rows_read(engine: Engine, statement: Any, params: dict[str, Any]) -> tuple[int, int]:
    """The claim `statement` run under EXPLAIN ANALYZE and rolled back: the rows its scans of the ready indexes
    returned and the rows they read and left (removed by a filter)."""

    def walk(node: dict[str, Any]) -> tuple[int, int]:
        returned = removed = 0
        if str(node.get("Index Name", "")).startswith("ix_agent_action_ready"):
            loops = int(node["Actual Loops"])  # rows are a mean per loop
            returned += round(float(node["Actual Rows"]) * loops)
            removed += round(float(node.get("Rows Removed by Filter", 0)) * loops)
        for child in node.get("Plans", []):
            more = walk(child)
            returned, removed = returned + more[0], removed + more[1]
        return returned, removed

    with engine.connect() as conn:
        plan = conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement.text}"), params).scalar_one()
        conn.rollback()
    return walk(plan[0]["Plan"])


def test_a_paused_destination_s_backlog_costs_the_claim_destination_by_destination_nothing(engine: Engine) -> None:
    insert_due(engine, 2000, kinds.NOOP.name, "parked", destination="parked", due_hours_ago=24)
    insert_due(engine, 200, kinds.NOOP.name, "open")
    insert_due(engine, 200, kinds.READBACK.name, "other")
    pause(engine, "parked")
    with engine.begin() as conn:
        conn.execute(text("ANALYZE agent_action"))
    params = {"limit": 50, "lease_seconds": LEASE, "kinds": KINDS}

    # the plain claim reads the 2,000 paused heads and leaves them, at every claim
    assert rows_read(engine, store_executor.CLAIM_READY_HEADS, params)[1] >= 2000
    # destination by destination: the pairs that have heads (a descent each, and one that finds none), and
    # the 50 first due of each open pair, of which the 50 first due are claimed; no row read and left
    shares = {"cap": 50, "busy": [], "rooms": [], "answered": None}
    returned, removed = rows_read(engine, store_executor.CLAIM_OPEN_DESTINATION_HEADS, params | shares)
    assert removed == 0 and returned <= 3 + 2 * 50 + 50, (returned, removed)


def test_a_broken_destination_allows_one_probe_at_a_time_until_mended(engine: Engine) -> None:
    insert_due(engine, 10)

    async def broken(store: ExecutorStore) -> list[int]:
        at_once = {"window": 0.0, "min_failures": 1, "probe_seconds": 0.0}
        assert (await store.note_failure("test_noop", "TEST_NOOP", at_once)).newly_broken
        again = await store.note_failure("test_noop", "TEST_NOOP", at_once)
        assert again.broken and not again.newly_broken  # already broken
        taken = []
        for _ in range(3):
            claimed, _ = await store.claim_destination("test_noop", 10, LEASE, KINDS, PACE | {"probe_seconds": 60})
            taken.append(len(claimed))
        assert await store.mend_destination("test_noop")
        claimed, _ = await store.claim_destination("test_noop", 10, LEASE, KINDS, PACE | {"probe_seconds": 60})
        taken.append(len(claimed))
        return taken

    # one probe, then none until its probe time (60 s later), then, mended, all the rest
    assert run(with_store(engine, broken)) == [1, 0, 0, 9]
