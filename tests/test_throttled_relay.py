"""A backlog through a relay that throttles (tests/throttling_relay.py): two executors, no rate configured, must
find the relay's rate from its slow-downs and keep to it.

EMAILS verify-address emails over LANES lanes go through two `Executor`s (one process, an engine each, the
defaults: 64 attempts in flight each) to a relay whose token bucket takes RATE messages a second. Asserted: none
FAILED, every email DONE and accepted once (by Message-ID), and:

- no rate configured: the relay's refusals after the opening (its first OPENING_SECONDS) at most
  REFUSED_AFTER_OPENING of what it accepted, and the drain (from the executors' start to the last message
  accepted) within DRAIN_BOUND times the ideal EMAILS / RATE. The opening is reported, not bounded: before the
  first slow-down comes back every executor has its whole concurrency in flight (128 attempts against a relay of
  10 a second), and what the relay refuses of it (each a Defer, which costs no attempt) is the same whatever
  the pace does next. Both bounds hold on a busy machine, where the relay and both executors share one process
  here: after the opening 2.0 % and 2.8 % alone, 7.7 % in a run beside the rest of the suite; a pace that
  stalled or overran the relay (up to 30 % of refusals after the opening at 5 a second, drains of 1.34x to 3x)
  fails them. The targets of 5 % refused and a drain of 1.15x the ideal are bench.throttle's, with the
  executors as processes of their own (bench/RESULTS.md);
- the relay's rate configured (`SmtpSettings.rate`): the relay refuses nothing and no second holds more than
  the rate and twice its burst: the turns are taken at the rate and its burst (tests/test_destinations.py checks
  that exactly), and the relay, in this process with both executors, sees each MAIL FROM a connection and an
  EHLO later (one second held 13 and 14 at 10/s and burst 2.5 in three runs; when the rate was held at the
  claim alone, 16 to 19);
- a greylisting relay defers its messages alone: all DONE and no destination paused.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox._internal.config.rates import Rate
from outbox.db import async_engine
from outbox.email import EmailAdapter, SmtpSettings, message_id
from outbox.executor import Executor
from tests.support import enqueue_verify_emails
from tests.throttling_relay import Refusal, ThrottlingRelay

SENDER = "outbox@example.com"
EMAILS, LANES, RATE = 1000, 500, 10.0
IDEAL_SECONDS = EMAILS / RATE
DRAIN_BOUND = 1.5
REFUSED_AFTER_OPENING = 0.15
DRAIN_SECONDS = 2 * DRAIN_BOUND * IDEAL_SECONDS
LIVE = {"PROPOSED", "ADMITTED", "EXECUTING"}


def within_targets(drained: Drained, relay: ThrottlingRelay, rate: Rate | None = None) -> None:
    """The targets: with `rate` given, no refusal and no second at the relay above the rate and twice its
    burst; without, the refusals after the opening within REFUSED_AFTER_OPENING of the accepted; the drain
    within DRAIN_BOUND times the ideal."""
    missed = []
    if rate is not None and relay.refused > 0:
        missed.append("a refusal with the relay's rate given")
    if rate is not None and relay.busiest_second() > rate.per_second + 2 * rate.burst:
        missed.append("a second above the rate and twice its burst at the relay")
    if relay.refused_after_opening() > REFUSED_AFTER_OPENING * len(relay.accepted):
        missed.append(f"refusals after the opening above {REFUSED_AFTER_OPENING:.0%} of the accepted")
    if drained.seconds > DRAIN_BOUND * IDEAL_SECONDS:
        missed.append(f"a drain above {DRAIN_BOUND}x the ideal")
    assert not missed, f"{' and '.join(missed)}: {shown(drained, relay)}"


@dataclass(frozen=True)
class Drained:
    seconds: float
    states: dict[str, int]
    pauses: int


async def drain(database_url: str, relay: ThrottlingRelay, rate: Rate | None = None, executors: int = 2) -> Drained:
    """Run `executors` executors on the backlog until no action is live; the drain's seconds (to the last
    message the relay accepted), the actions' states and the pauses the executors made."""
    engines = [async_engine(database_url) for _ in range(executors + 1)]
    watcher = engines.pop()
    smtp = SmtpSettings(host="127.0.0.1", port=relay.port, sender=SENDER, timeout_seconds=5, rate=rate)
    runners = [Executor(engine, [EmailAdapter(engine, smtp)]) for engine in engines]
    started = time.time()
    tasks = [asyncio.create_task(runner.run()) for runner in runners]
    try:
        deadline = time.monotonic() + DRAIN_SECONDS
        while (states := await count_states(watcher)).keys() & LIVE:
            assert time.monotonic() < deadline, f"the backlog did not drain in {DRAIN_SECONDS:.0f} s: {states}"
            assert not any(task.done() for task in tasks), "an executor stopped"
            await asyncio.sleep(0.05)
    finally:
        for runner in runners:
            runner.stop()
        await asyncio.gather(*tasks)
        for engine in [*engines, watcher]:
            await engine.dispose()
    pauses = sum(runner.outcomes.destinations[("smtp", "paused")] for runner in runners)
    last = max(received.received_at for received in relay.accepted)
    return Drained(last - started, states, pauses)


async def count_states(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state"))
        return {str(state): int(n) for state, n in rows.all()}


def delivered_once(relay: ThrottlingRelay, keys: list[str]) -> bool:
    return relay.duplicates() == 0 and {r.message_id for r in relay.accepted} == {
        message_id(key, "example.com") for key in keys
    }


def shown(drained: Drained, relay: ThrottlingRelay) -> str:
    return (
        f"{EMAILS} emails over {LANES} lanes at {relay.per_second:g}/s ({relay.refusal}): drained in"
        f" {drained.seconds:.1f} s ({drained.seconds / IDEAL_SECONDS:.2f}x ideal), accepted {len(relay.accepted)},"
        f" refused {relay.refused} ({relay.refused_after_opening()} after the opening), pauses {drained.pauses},"
        f" busiest second {relay.busiest_second()}"
    )


@pytest.mark.parametrize("refusal", ["454", "421"])
async def test_two_executors_find_a_throttling_relays_rate(engine: Engine, database_url: str, refusal: Refusal) -> None:
    keys = enqueue_verify_emails(engine, EMAILS, LANES)
    relay = ThrottlingRelay(RATE, refusal=refusal).start()
    try:
        drained = await drain(database_url, relay)
    finally:
        relay.stop()
    print("\n" + shown(drained, relay))
    assert drained.states == {"DONE": EMAILS}, drained.states
    assert delivered_once(relay, keys)
    assert relay.refused > 0, "the relay never throttled: the case proves nothing"
    within_targets(drained, relay)


async def test_the_relays_rate_configured_is_kept_without_a_refusal(engine: Engine, database_url: str) -> None:
    keys = enqueue_verify_emails(engine, EMAILS, LANES)
    relay = ThrottlingRelay(RATE).start()
    rate = Rate(RATE)
    try:
        drained = await drain(database_url, relay, rate)
    finally:
        relay.stop()
    print("\n" + shown(drained, relay))
    assert drained.states == {"DONE": EMAILS}, drained.states
    assert delivered_once(relay, keys)
    within_targets(drained, relay, rate)


async def test_greylisted_emails_wait_alone(engine: Engine, database_url: str) -> None:
    """A relay that does not throttle but greylists 30 % of its recipients: one email each, all DONE, the
    greylisted ones at their second delivery, and the relay's destination never paused."""
    keys = enqueue_verify_emails(engine, 300, 300)
    relay = ThrottlingRelay(10_000, greylist=0.3).start()
    try:
        drained = await drain(database_url, relay)
    finally:
        relay.stop()
    assert drained.states == {"DONE": 300}, drained.states
    assert delivered_once(relay, keys)
    assert 50 <= relay.greylisted <= 130 and relay.refused == 0 and drained.pauses == 0
    with engine.connect() as conn:
        paused = conn.execute(text("SELECT count(*) FROM agent_destination WHERE paused_until IS NOT NULL"))
        assert paused.scalar_one() == 0
