"""A webhook endpoint is a destination: what its receiver's slow-downs and outages do to every executor.

Two executors (outbox.executor.Executor, an adapter each, one event loop) send to real HTTP receivers
(demo/receiver.py: every request kept with the time it arrived) on the real database:

    429 with Retry-After: 2 ──▶ the endpoint paused 2 s for both executors; the refused webhook's attempt uncounted
    429 without Retry-After ──▶ paused 0.5 s, 1 s, 2 s (in a row, doubling); no attempt spent
    refused or 500 for a while ──▶ broken once the endpoint's run of failures lasted `break_seconds`: then one
                                   probe every `probe_seconds` for both executors; the first success mends it
    503 without Retry-After, for a while ──▶ slow-downs only: broken all the same, and mended by a probe
    two endpoints, one answering 429 ──▶ the other's webhooks all DONE meanwhile: the paused one's heads are not
                                         claimed, so they hold no executor's slots

Every webhook ends DONE with one effect at its receiver.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.receiver import Receiver, Seen
from outbox._internal.config.credentials import Sources
from outbox.executor import Executor, ExecutorConfig
from outbox.webhook import WebhookAdapter, enqueue_webhook_async, register_endpoint
from outbox.webhook import endpoints as endpoint_registry
from outbox.webhook import events as event_registry
from outbox.webhook.events import register_webhook_event
from tests.test_nats import until_async
from tests.webhook_events import NumberedHook

SECRET = "whsec_" + base64.b64encode(b"d" * 32).decode()
# an executor's few slots: the executors must share the work, and a paused endpoint's heads would fill them
FEW_SLOTS = ExecutorConfig(concurrency=4, poll_seconds=0.2)


class AlphaPing(NumberedHook):
    name = "alpha.ping"
    endpoint = "alpha"


class BetaPing(NumberedHook):
    name = "beta.ping"
    endpoint = "beta"


ALPHA, BETA = AlphaPing(), BetaPing()


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers its own endpoints and events."""
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(endpoint_registry, "_SOURCES", Sources("secret"))
    monkeypatch.setattr(event_registry, "_EVENTS", {})


@pytest.fixture
def alpha() -> Iterator[Receiver]:
    """The `alpha` endpoint's receiver, and its event."""
    receiver = Receiver(SECRET).start()
    register_endpoint("alpha", receiver.url, secret=SECRET)
    register_webhook_event(ALPHA)
    yield receiver
    receiver.stop()


@pytest.fixture
def beta() -> Iterator[Receiver]:
    receiver = Receiver(SECRET).start()
    register_endpoint("beta", receiver.url, secret=SECRET)
    register_webhook_event(BETA)
    yield receiver
    receiver.stop()


@asynccontextmanager
async def two_executors(aengine: AsyncEngine, config: ExecutorConfig) -> AsyncIterator[list[Executor]]:
    """Two executors running on this event loop, an adapter each; stopped (and their adapters closed) after."""
    adapters = [WebhookAdapter(aengine) for _ in range(2)]
    executors = [Executor(aengine, [adapter], config, listen=False) for adapter in adapters]
    tasks = [asyncio.create_task(executor.run()) for executor in executors]
    try:
        yield executors
    finally:
        for executor in executors:
            executor.stop()
        await asyncio.gather(*tasks)
        for adapter in adapters:
            await adapter.aclose()


async def enqueue(aengine: AsyncEngine, definition: NumberedHook, numbers: range) -> None:
    async with aengine.begin() as conn:
        for n in numbers:
            await enqueue_webhook_async(conn, definition, {"n": n})


async def scalar(aengine: AsyncEngine, sql: str) -> Any:
    async with aengine.connect() as conn:
        return (await conn.execute(text(sql))).scalar()


async def states(aengine: AsyncEngine, destination: str) -> dict[str, int]:
    async with aengine.connect() as conn:
        rows = await conn.execute(
            text("SELECT state, count(*) FROM agent_action WHERE destination = :d GROUP BY state"), {"d": destination}
        )
        return {state: int(n) for state, n in rows.all()}


def all_done(aengine: AsyncEngine, destination: str, count: int) -> Callable[[], Coroutine[Any, Any, bool]]:
    async def done() -> bool:
        return await states(aengine, destination) == {"DONE": count}

    return done


def attempts(executors: list[Executor], result: str) -> int:
    """The recorded attempts of `result` both executors made."""
    return sum(executor.outcomes.attempts[("WEBHOOK", result, True)] for executor in executors)


def gaps(seen: list[Seen]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(seen)]


async def test_a_retry_after_pauses_the_endpoint_for_every_executor_and_spends_no_attempt(
    aengine: AsyncEngine, alpha: Receiver
) -> None:
    alpha.script.append("429 2")
    async with two_executors(aengine, FEW_SLOTS) as executors:
        await enqueue(aengine, ALPHA, range(1))
        await until_async(lambda: _answered(alpha, 1), 20, "the 429")
        await enqueue(aengine, ALPHA, range(1, 21))  # due at once, while the endpoint is paused
        await until_async(all_done(aengine, "webhook:alpha", 21), 30, "every webhook DONE")
    refused, *after = alpha.seen
    assert refused.step == "429 2" and len(after) == 21
    # nothing was sent to the endpoint for the 2 s it asked, by either executor; then the work resumed at once
    assert 2.0 <= after[0].at - refused.at < 4.5, after[0].at - refused.at
    assert all(executor.outcomes.attempts[("WEBHOOK", "DONE", True)] > 0 for executor in executors)
    assert sum(executor.outcomes.destinations[("webhook:alpha", "paused")] for executor in executors) == 1
    # the 429 counted as a DEFER, not as an attempt: every webhook DONE at its first counted attempt
    assert (attempts(executors, "DEFER"), attempts(executors, "RETRY")) == (1, 0)
    assert await scalar(aengine, "SELECT sum(attempt) FROM agent_action") == 21
    assert set(alpha.deliveries().values()) == {1} and len(alpha.effects) == 21


async def test_429s_without_retry_after_pause_the_endpoint_longer_each_time_and_spend_no_attempt(
    aengine: AsyncEngine, alpha: Receiver
) -> None:
    alpha.script.extend(["429", "429", "429"])
    async with two_executors(aengine, FEW_SLOTS) as executors:
        await enqueue(aengine, ALPHA, range(1))
        await until_async(all_done(aengine, "webhook:alpha", 1), 30, "the webhook DONE")
    assert [seen.step for seen in alpha.seen] == ["429", "429", "429", "ok"]
    waited = gaps(alpha.seen)
    # the endpoint's pause: 0.5 s, doubling with each slow-down in a row
    assert all(wait >= pause for wait, pause in zip(waited, [0.5, 1.0, 2.0], strict=True)), waited
    assert (attempts(executors, "DEFER"), attempts(executors, "DONE")) == (3, 1)
    assert await scalar(aengine, "SELECT attempt FROM agent_action") == 1


BREAK = ExecutorConfig(concurrency=4, poll_seconds=0.2, break_seconds=2.0, probe_seconds=1.0)
# webhooks enqueued a second during the outage: each executor soon has 5 failures over 2 s
ENQUEUED_A_SECOND = 4
# probes seen after the break before the endpoint comes back
PROBES = 5


@pytest.mark.parametrize("outage", ["refused", "500"])
async def test_a_broken_endpoint_gets_one_probe_a_second_until_it_is_back(aengine: AsyncEngine, outage: str) -> None:
    # refused: nothing listens on the endpoint's port until its receiver starts there
    port = _free_port()
    receiver = Receiver(SECRET, port=port).start() if outage == "500" else None
    if receiver is not None:
        receiver.refusing = "500"
    register_endpoint("alpha", f"http://127.0.0.1:{port}/hooks", secret=SECRET)
    register_webhook_event(ALPHA)
    enqueued = 0
    try:
        async with two_executors(aengine, BREAK) as executors:

            async def enqueue_until(condition: Callable[[], Coroutine[Any, Any, bool]]) -> None:
                nonlocal enqueued
                while not await condition():
                    await enqueue(aengine, ALPHA, range(enqueued, enqueued + 1))
                    enqueued += 1
                    await asyncio.sleep(1 / ENQUEUED_A_SECOND)  # the application's pace, not a wait for anything

            async def broken() -> bool:
                return not await _mended(aengine)

            await asyncio.wait_for(enqueue_until(broken), 30)
            broke_at, spent_before = asyncio.get_running_loop().time(), attempts(executors, "RETRY")

            async def probed() -> bool:
                return attempts(executors, "RETRY") >= spent_before + PROBES

            await asyncio.wait_for(enqueue_until(probed), 30)
            outage_seconds = asyncio.get_running_loop().time() - broke_at
            spent_while_broken = attempts(executors, "RETRY") - spent_before
            waiting = await scalar(aengine, "SELECT count(*) FROM agent_action WHERE state = 'ADMITTED' AND epoch = 0")

            # the endpoint is back: the next probe mends it, then every webhook goes, the retried ones made due
            if receiver is not None:
                receiver.refusing = None
            else:
                receiver = Receiver(SECRET, port=port).start()
            await until_async(lambda: _mended(aengine), 20, "the endpoint mended")
            async with aengine.begin() as conn:
                await conn.execute(text("UPDATE agent_action SET due_at = now() WHERE state = 'ADMITTED'"))
            await until_async(all_done(aengine, "webhook:alpha", enqueued), 30, "every webhook DONE")
    finally:
        if receiver is not None:
            receiver.stop()
    # broken: one probe a second for both executors, the attempts already on their way besides
    assert spent_while_broken <= outage_seconds / BREAK.probe_seconds + 2, (spent_while_broken, outage_seconds)
    assert waiting >= 10, waiting  # webhooks enqueued while it was broken waited without an attempt
    changes = sum((executor.outcomes.destinations for executor in executors), start=Counter[tuple[str, str]]())
    assert changes[("webhook:alpha", "broken")] == 1 and changes[("webhook:alpha", "mended")] == 1
    if outage == "500":
        assert len([seen for seen in receiver.seen if seen.step == "500"]) == attempts(executors, "RETRY")
    assert set(receiver.deliveries().values()) == {1} and len(receiver.effects) == enqueued
    assert attempts(executors, "FAILED") == 0


async def test_an_endpoint_that_answers_only_503_without_retry_after_is_broken_then_mended(
    aengine: AsyncEngine, alpha: Receiver
) -> None:
    """Every webhook refused with a 503 and no Retry-After: slow-downs only, none an attempt. For the
    breaker's window nothing was accepted: broken, whatever the pauses did to the attempts' timing."""
    alpha.refusing = "503"
    config = ExecutorConfig(concurrency=4, poll_seconds=0.2, break_seconds=1.0, probe_seconds=0.5)
    async with two_executors(aengine, config) as executors:
        await enqueue(aengine, ALPHA, range(20))

        async def broken() -> bool:
            return not await _mended(aengine)

        await until_async(broken, 30, "the endpoint broken")
        alpha.refusing = None
        await until_async(lambda: _mended(aengine), 60, "the endpoint mended by a probe")
        await until_async(all_done(aengine, "webhook:alpha", 20), 60, "every webhook DONE")
    changes = sum((executor.outcomes.destinations for executor in executors), start=Counter[tuple[str, str]]())
    assert changes[("webhook:alpha", "broken")] == 1 and changes[("webhook:alpha", "mended")] == 1
    assert attempts(executors, "RETRY") == 0  # every refusal a deferral: no attempt spent
    assert set(alpha.deliveries().values()) == {1} and len(alpha.effects) == 20


async def test_a_paused_endpoint_holds_no_slot_the_other_endpoints_webhooks_need(
    aengine: AsyncEngine, alpha: Receiver, beta: Receiver
) -> None:
    alpha.refusing = "429 1"
    async with two_executors(aengine, FEW_SLOTS) as executors:
        await enqueue(aengine, ALPHA, range(40))  # due first
        await enqueue(aengine, BETA, range(40))
        await until_async(all_done(aengine, "webhook:beta", 40), 30, "beta's webhooks DONE")
        # meanwhile alpha refused everything: its webhooks wait, none spent an attempt
        assert "DONE" not in await states(aengine, "webhook:alpha")
        spent = "SELECT string_agg(last_error, '; ') FROM agent_action WHERE attempt > 0 AND destination = '{}'"
        assert await scalar(aengine, spent.format("webhook:alpha")) is None
        alpha.refusing = None
        await until_async(all_done(aengine, "webhook:alpha", 40), 30, "alpha's webhooks DONE")
    assert len(beta.seen) == len(beta.effects) == 40  # each sent once
    assert len(alpha.effects) == 40 and attempts(executors, "RETRY") == 0


async def _answered(receiver: Receiver, count: int) -> bool:
    return len(receiver.seen) >= count


async def _mended(aengine: AsyncEngine) -> bool:
    return not await scalar(aengine, "SELECT count(*) FROM agent_destination WHERE broken_since IS NOT NULL")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
