"""Slow start (outbox.executor.slow_start): a fresh executor lets INITIAL_WINDOW attempts of a destination
reach the provider at once, then one more for each the provider accepted, until the window is its
concurrency; a destination that only fails keeps INITIAL_WINDOW. The adapter here is the provider: it counts
the attempts between their fence and their answer.

    insert_due ─▶ one executor (concurrency 16) ─▶ fence ─▶ the provider's count ─▶ Done or Retry
"""

from __future__ import annotations

import asyncio

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import ActionAttempt, Done, Executor, Result, Retry
from outbox.executor.config import ExecutorConfig
from outbox.executor.slow_start import INITIAL_WINDOW
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.test_destinations import insert_due
from tests.test_nats import until_async

CONCURRENCY = 16


class Provider:
    """Counts the attempts at it (past their fence, not answered) and the answers it gave, and notes at each
    arrival how many were at it and how many it had accepted before."""

    def __init__(self, accept: bool) -> None:
        self.accept = accept
        self.at_it = 0
        self.accepted = 0
        self.arrivals: list[tuple[int, int]] = []

    async def behaviour(self, attempt: ActionAttempt) -> Result:
        window = await attempt.fence().begin_write()
        window.check()
        self.at_it += 1
        self.arrivals.append((self.at_it, self.accepted))
        await asyncio.sleep(0.005)  # the provider's work
        self.at_it -= 1
        if not self.accept:
            return Retry("503 Service Unavailable")
        self.accepted += 1
        return Done(f"ref-{attempt.action.id}")


async def test_a_destination_gets_one_more_attempt_at_once_for_each_it_accepted(
    engine: Engine, aengine: AsyncEngine
) -> None:
    insert_due(engine, 200)
    provider = Provider(accept=True)
    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, provider.behaviour)], ExecutorConfig(CONCURRENCY))
    await executor.run(until_idle=True)
    assert provider.accepted == 200
    assert all(at_it <= INITIAL_WINDOW + accepted for at_it, accepted in provider.arrivals), provider.arrivals[:40]
    assert provider.arrivals[0] == (1, 0)
    # proven once the window reached the concurrency: the slots, not the window, bound it from then on
    assert max(at_it for at_it, _ in provider.arrivals) > INITIAL_WINDOW


async def test_a_destination_that_only_fails_never_has_more_than_the_first_window_at_it(
    engine: Engine, aengine: AsyncEngine
) -> None:
    insert_due(engine, 3 * CONCURRENCY)
    provider = Provider(accept=False)
    adapter = ScriptedAdapter(kinds.NOOP, provider.behaviour)
    executor = Executor(aengine, [adapter], ExecutorConfig(CONCURRENCY))
    running = asyncio.create_task(executor.run())
    try:

        async def every_lane_tried() -> bool:
            return len({action.id for action in adapter.calls}) == 3 * CONCURRENCY

        await until_async(every_lane_tried, 60, "a first attempt of every lane")
    finally:
        executor.stop()
        await running
    assert provider.accepted == 0
    assert max(at_it for at_it, _ in provider.arrivals) == INITIAL_WINDOW, provider.arrivals
