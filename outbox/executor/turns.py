"""Destinations, the executor's layer: a held destination's turns, taken for all its waiting attempts at once.

    gate(attempt) ──take(name)──▶ the destination's queue ──▶ one task per destination while it has a queue:
        every attempt queued meanwhile ──▶ ExecutorStore.take_send_tokens(name, count) (TAKE_SEND_TOKENS,
        one statement, the destination's row locked once) ──▶ each attempt's future: its Turn, in the order asked

The first attempt to ask starts the destination's task; every attempt that asks before the task sends its
statement goes in it, and those that ask while it runs go together in the next. So a destination whose attempts
reach their fences one by one pays a statement a turn, and one with many attempts ready together (a claim's
batch, a pace's burst) one statement for them all. A
turn taken for an attempt cancelled meanwhile (the executor stopping) is a token unused, as it was when each
attempt took its own. A failed statement fails every attempt of its batch, as it would have failed each.

Destinations are one concept in three layers: the operator's (outbox.destinations), the executor's
(outbox.executor.destinations, pacing and turns) and the store's (outbox.store.destinations and destination_rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from outbox.executor.store import ExecutorStore, Turn


class Turns:
    def __init__(self, store: ExecutorStore, pacing: Mapping[str, float]) -> None:
        self._store = store
        self._pacing = pacing
        # the attempts waiting for a turn, by destination, that no statement has asked for yet
        self._waiting: dict[str, list[asyncio.Future[Turn]]] = {}
        # the task taking a destination's turns, while it has attempts waiting
        self._taking: dict[str, asyncio.Task[None]] = {}

    async def take(self, name: str) -> Turn:
        """The next turn of the held destination `name` for one attempt."""
        future: asyncio.Future[Turn] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(name, []).append(future)
        if name not in self._taking:
            self._taking[name] = asyncio.create_task(self._take_all(name), name=f"outbox-turns-{name}")
        return await future

    async def _take_all(self, name: str) -> None:
        waiting: list[asyncio.Future[Turn]] = []
        try:
            while waiting := self._waiting.pop(name, []):
                try:
                    turns = await self._store.take_send_tokens(name, len(waiting), self._pacing)
                except Exception as error:
                    for future in waiting:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for future, turn in zip(waiting, turns, strict=True):
                    if not future.done():
                        future.set_result(turn)
        finally:
            del self._taking[name]
            # cancelled (the event loop closing): the attempts still waiting are cancelled with it
            for future in waiting + self._waiting.pop(name, []):
                future.cancel()
