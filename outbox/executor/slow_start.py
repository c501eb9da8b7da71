"""Slow start: how many attempts of an open destination one executor lets reach it at once, before the
destination has shown that it takes them.

An executor that meets a destination (at its start, or a destination it has not sent to before) does not know
how much it takes. A provider with a limit it does not number (a Slack workspace) refuses every request past
its burst, and a first claim of a backlog would send it a quarter of the slots at once, then every slot as
soon as the first answers came back, before the first refusal did: two executors once sent about a hundred
messages into a burst of ten. So the attempts of an open destination pass the fence INITIAL_WINDOW at a time
at first, and each attempt the destination accepts lets one more through (the window doubles with every round
of answers, as TCP's slow start does) until the window reaches the executor's concurrency: the destination is
then proven, and none of its attempts waits here again. An attempt refused for the pace, failed or lost lets
none more through: a destination that only fails keeps INITIAL_WINDOW attempts at it. A held destination
(paused, paced, broken) skips the window: its pace, its pauses and its probes bound what reaches it.

An attempt that waits here holds its slot and its lease, as one in flight would, and waits only for the
attempts sent before it to end (each within its own timeouts), or for its destination to be held. A proven
destination costs its attempts one set lookup. The window is this executor's own: replicas each start at
INITIAL_WINDOW, so a provider meets at most INITIAL_WINDOW times the replicas, then what it accepted.

    gate ─▶ held, or proven? pass ─▶ fewer than the window sending? pass (sending) : wait for an end, or a hold
    accepted (Done, or Failed by the provider) ─▶ window + 1; at the concurrency: proven
    ended ─▶ one fewer sending; the waiters look again
"""

from __future__ import annotations

import asyncio
from collections.abc import Container

from outbox.executor.claimed import ClaimedAction

# the attempts of a destination this executor sends at once before any of them has been accepted
INITIAL_WINDOW = 4


class SlowStart:
    def __init__(self, full: int) -> None:
        """`full`: the executor's concurrency, the window at which a destination is proven."""
        self._full = full
        # destinations still starting: the window, and the actions past the gate and not ended
        self._windows: dict[str, int] = {}
        self._sending: dict[str, set[int]] = {}
        self._proven: set[str] = set()
        # set when a destination's sending or window changes, or it is held: its waiters look again
        self._changed: dict[str, asyncio.Event] = {}

    def proven(self, name: str) -> bool:
        return name in self._proven

    def window(self, name: str) -> int | None:
        """How many attempts of `name` may send at once (None: proven, as many as there are)."""
        return None if name in self._proven else self._windows.get(name, min(INITIAL_WINDOW, self._full))

    def starting(self) -> list[str]:
        """The destinations met and not yet proven."""
        return list(self._windows)

    async def enter(self, action: ClaimedAction, held: Container[str]) -> None:
        """Wait until `action`'s destination has room in its window, is proven, or is in `held`."""
        name = action.destination
        sending = self._sending.setdefault(name, set())
        while name not in self._proven and name not in held:
            if len(sending) < self._windows.setdefault(name, min(INITIAL_WINDOW, self._full)):
                sending.add(action.id)
                return
            await self._changed.setdefault(name, asyncio.Event()).wait()

    def accepted(self, name: str) -> None:
        """The destination took an attempt: one more may be sent at once."""
        if name in self._proven:
            return
        window = self._windows.get(name, INITIAL_WINDOW) + 1
        if window >= self._full:
            self._proven.add(name)
            self._windows.pop(name, None)
            self._sending.pop(name, None)
        else:
            self._windows[name] = window
        self.wake(name)

    def ended(self, action: ClaimedAction) -> None:
        """`action`'s attempt ended (whether or not it passed the gate)."""
        sending = self._sending.get(action.destination)
        if sending and action.id in sending:
            sending.discard(action.id)
            self.wake(action.destination)

    def wake(self, name: str) -> None:
        """`name`'s waiters look again (its window changed, or it may be held)."""
        changed = self._changed.pop(name, None)
        if changed is not None:
            changed.set()
