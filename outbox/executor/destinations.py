"""Destinations, the executor's layer: the claims held destinations allow, and what its attempts tell of them.

    start ──adapters' `rates`──▶ ExecutorStore.set_rates                  (agent_destination.rate, burst)
    sweep ──▶ refresh: the held destinations (paused, broken, paced, rated) of this executor's kinds
    NOTIFY ──▶ heard_paused: another executor's slow-down paused one of them: held at once
    claim ──▶ the plain claim skips every held destination (in its own statement); while one is held, it
              finds the heads destination by destination, so the held one's backlog costs it nothing
          ──▶ claim(): for each held destination whose time has come, CLAIM_DESTINATION_HEADS ─▶ the
              seconds until it may allow more (its pause's end, its probe, its next token): `wake_at`
    fence ──▶ gate(): an attempt of an open destination not yet proven waits for room in its window
              (outbox.executor.slow_start); one of a destination whose slow-down this executor is writing
              waits for the write; an attempt of a held destination takes its turn (outbox.executor.turns: the
              turns of its attempts waiting at once in one statement, TAKE_SEND_TOKENS) and waits for it;
              paused, it waits the pause and asks again; a turn a provider's pause voided while it waited
              (SLOWED_AT): it takes another; a wait over GATE_WAIT_SECONDS: DestinationWaits
    result ──SlowDown──▶ held here at once; slow_down: pause and lower the pace for every executor; the
                         action waits the pause
           ──Retry, a SlowDown that paused──▶ NOTE_FAILURE: one more in the destination's run, kept on its row
                        for every executor; at least BREAK_FAILURES over `break_seconds` and none accepted
                        since the run began: broken (one probe every `probe_seconds`)
           ──CredentialsRefused──▶ REFUSE_CREDENTIALS: broken at once for every executor, the reason kept,
                        one probe every CREDENTIALS_PROBE_SECONDS; the action waits as long
           ──Done, Failed──▶ the slow start's window grows by one
           ──Done─────▶ nothing written for an open destination (the next judgement finds the acceptance
                        in the actions' record and starts the run again from it); a broken one is mended

The numbers are outbox.executor.pacing's. An adapter names its destinations and their configured rates in an
optional `rates` property (name: Rate or None); the executor writes them when it starts, so the replicas
share the rate of the one that started last. Each change this executor makes (paused, broken, refused, mended, and
resumed when a pause it made ends) goes to `Outcomes.destination` (a log line, and the drain's Prefect events).

Destinations are one concept in three layers: the operator's (outbox.destinations), the executor's
(outbox.executor.destinations, pacing and turns) and the store's (outbox.store.destinations and destination_rows).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping

from outbox._internal.config.rates import Rate
from outbox.executor.adapter import ActionAdapter
from outbox.executor.attempt import DestinationWaits
from outbox.executor.claimed import ClaimedAction
from outbox.executor.config import ExecutorConfig
from outbox.executor.outcomes import DestinationChange, Outcomes
from outbox.executor.pacing import (
    BREAK_FAILURES,
    CREDENTIALS_PROBE_SECONDS,
    GATE_WAIT_SECONDS,
    PACE,
    PAUSE_CAP_SECONDS,
    SLOW_DOWN,
)
from outbox.executor.results import CredentialsRefused, Done, Failed, Result, Retry, SlowDown
from outbox.executor.slow_start import SlowStart
from outbox.executor.store import ExecutorStore
from outbox.executor.turns import Turns

log = logging.getLogger("outbox.executor")


def adapter_rates(adapters: Iterable[ActionAdapter]) -> dict[str, tuple[str, float | None, float]]:
    """Each destination the adapters name: its kind, configured rate (attempts a second) and burst."""
    found: dict[str, tuple[str, float | None, float]] = {}
    for adapter in adapters:
        rates: Mapping[str, Rate | None] = getattr(adapter, "rates", {})
        for name, rate in rates.items():
            found[name] = (adapter.kind.name, rate.per_second if rate else None, rate.burst if rate else 1.0)
    return found


class Destinations:
    def __init__(
        self, store: ExecutorStore, adapters: Iterable[ActionAdapter], config: ExecutorConfig, outcomes: Outcomes
    ) -> None:
        """`store`: the executor's own. Every call is a statement of its own in autocommit, so what an attempt
        writes (a slow-down, a breaker, a mend) and the loop's claims share its connection."""
        self._store = store
        self._rates = adapter_rates(adapters)
        self._config = config
        self._claim_params = PACE | {"probe_seconds": config.probe_seconds}
        self._turns = Turns(store, PACE | {"gate_wait": GATE_WAIT_SECONDS})
        self._breaker = {
            "window": config.break_seconds,
            "min_failures": BREAK_FAILURES,
            "probe_seconds": config.probe_seconds,
        }
        self._outcomes = outcomes
        # the held destinations of this executor's kinds, as the last refresh found them: name -> broken
        self._held: dict[str, bool] = {}
        # when (loop time) each held destination may allow more
        self._not_before: dict[str, float] = {}
        # the held destinations whose last claim found no ready head and waited for nothing (no token, no
        # pause): claimed for again when one of their attempts here ends, else within the poll interval
        self._no_heads: set[str] = set()
        # the pauses this executor made that have not ended: name -> kind
        self._paused: dict[str, str] = {}
        # the earliest loop time a held destination may allow more: the loop wakes then
        self.wake_at = math.inf
        self._slow_start = SlowStart(config.concurrency)
        # the slow-downs this executor is writing, by destination: its attempts wait for the pause to be
        # written before they take a turn (the row does not say paused yet, and would give one)
        self._slowing: dict[str, asyncio.Event] = {}

    async def start(self) -> bool:
        """Write the adapters' configured rates; True once written."""
        await self._store.set_rates(self._rates)
        for name, (kind, rate, burst) in sorted(self._rates.items()):
            if rate is not None:
                log.info("destination %s (%s): %g a second, burst %g, for all executors", name, kind, rate, burst)
        return True

    async def refresh(self, kinds: Iterable[str]) -> None:
        """Read which destinations are held now."""
        served = set(kinds)
        rows = await self._store.held_destinations()
        self._held = {}
        for name, kind, broken in rows:
            if kind in served:
                self._hold(name, broken)
        for name in [name for name in self._paused if name not in self._held]:
            self._change(name, self._paused.pop(name), "resumed", "its pause ended")

    def heard_paused(self, payload: str, kinds: Iterable[str]) -> None:
        """Another executor's slow-down paused a destination (outbox.store.destinations.PAUSED_CHANNEL's
        payload, "KIND name"): held here at once when its kind is one of `kinds`."""
        kind, _, name = payload.partition(" ")
        if name and kind in kinds:
            self._hold(name)

    @property
    def some_held(self) -> bool:
        """Whether the last refresh, or an attempt since, found a destination of this executor's kinds held."""
        return bool(self._held)

    def window(self, name: str) -> int | None:
        """How many attempts of `name` its slow start lets send at once; more of its heads claimed would wait at
        the gate (None: proven, or held, when its pace and probes bound it instead)."""
        return None if name in self._held else self._slow_start.window(name)

    def starting(self) -> list[str]:
        """The open destinations met here and not yet proven."""
        return [name for name in self._slow_start.starting() if name not in self._held]

    async def claim(self, limit: int, lease_seconds: float, kinds: list[str]) -> list[ClaimedAction]:
        """Up to `limit` heads of the held destinations whose time has come, one statement each."""
        loop = asyncio.get_running_loop()
        claimed: list[ClaimedAction] = []
        self.wake_at = math.inf
        for name in list(self._held):  # attempts may add to it meanwhile
            now = loop.time()
            if limit - len(claimed) <= 0:
                break
            if self._not_before.get(name, 0.0) > now:
                self.wake_at = min(self.wake_at, self._not_before[name])
                continue
            found, next_seconds = await self._store.claim_destination(
                name, limit - len(claimed), lease_seconds, kinds, self._claim_params
            )
            claimed += found
            self._no_heads.discard(name)
            if next_seconds is not None:
                self._not_before[name] = now + min(next_seconds, self._config.poll_seconds)
            elif not found:
                self._not_before[name] = now + self._config.poll_seconds
                self._no_heads.add(name)
            else:
                self._not_before.pop(name, None)
            if name in self._not_before:
                self.wake_at = min(self.wake_at, self._not_before[name])
        return claimed

    async def gate(self, action: ClaimedAction) -> None:
        """Before the fence of an attempt: nothing for an open destination; for a held one, wait for the
        attempt's turn (outbox.executor.pacing's turns); for an open one not yet proven, wait for room in its
        slow start's window. Raises DestinationWaits when the turn, or the destination's pause, is more than
        GATE_WAIT_SECONDS away."""
        name = action.destination
        if name not in self._held and not self._slow_start.proven(name):
            await self._slow_start.enter(action, self._held)
        while name in self._slowing:
            await self._slowing[name].wait()
        while name in self._held:
            turn = await self._turns.take(name)
            wait = turn.wait_seconds
            if wait > GATE_WAIT_SECONDS:  # an operator's pause without end is Infinity: the longest wait then
                why = "paused" if turn.paused else "its turn is"
                wait = min(wait, PAUSE_CAP_SECONDS)
                raise DestinationWaits(action.id, wait, f"destination {name}: {why} {wait:.1f} s away")
            if wait > 0:
                await asyncio.sleep(wait)
            if turn.paused:
                continue
            # a turn the provider's pause voided while the attempt waited for it: take another
            if wait == 0 or await self._store.slowed_at(name) == turn.slowed_at:
                return

    async def saw(self, action: ClaimedAction, result: Result) -> Result:
        """What `result` tells of the action's destination, written for every executor; the result to record
        (a SlowDown waits the destination's pause)."""
        name = action.destination
        if isinstance(result, CredentialsRefused):
            return await self._refused(action, result)
        if isinstance(result, SlowDown):
            named = result.after if result.named else None
            # held from now: this executor's next attempts ask for their turns, which wait for the pause
            self._hold(name)
            writing = self._slowing.setdefault(name, asyncio.Event())
            try:
                slowed = await self._store.slow_down(name, action.kind.name, named, result.reason, SLOW_DOWN)
            finally:
                if self._slowing.get(name) is writing:
                    del self._slowing[name]
                    writing.set()
            # claimed for again at its pause's end, or within the poll interval (an operator may resume it)
            wait = min(max(0.0, slowed.pause_seconds), self._config.poll_seconds)
            self._not_before[name] = asyncio.get_running_loop().time() + wait
            if slowed.newly_paused:
                self._paused[name] = action.kind.name
                pace = f"; pace {slowed.pace:.3g}/s" if slowed.pace is not None else ""
                self._change(name, action.kind.name, "paused", f"{result.reason}{pace}", slowed.pause_seconds)
            # a provider that only slows down, for as long as the breaker's window, is broken as well: each
            # pause counts once (the slow-downs answered during it are the same refusal)
            if slowed.newly_paused:
                await self._failed(name, action.kind.name)
            # the action waits the pause; an operator's pause until resumed, the longest a slow-down waits
            return dataclasses.replace(result, after=min(max(0.0, slowed.pause_seconds), PAUSE_CAP_SECONDS))
        if isinstance(result, (Done, Failed)):
            self._slow_start.accepted(name)
        if isinstance(result, Retry):
            await self._failed(name, action.kind.name)
        elif isinstance(result, Done) and self._held.get(name) and await self._store.mend_destination(name):
            self._held[name] = False
            self._change(name, action.kind.name, "mended", "an attempt succeeded")
        return result

    async def _refused(self, action: ClaimedAction, result: CredentialsRefused) -> Result:
        """Credentials refused: the destination broken for every executor, probed once every
        CREDENTIALS_PROBE_SECONDS (held here at once); the action waits for the probe."""
        name, kind = action.destination, action.kind.name
        self._hold(name, broken=True)
        self._not_before[name] = asyncio.get_running_loop().time() + CREDENTIALS_PROBE_SECONDS
        if await self._store.refuse_credentials(name, kind, result.reason, CREDENTIALS_PROBE_SECONDS):
            why = f"credentials refused: {result.reason}"
            self._change(name, kind, "refused", why, CREDENTIALS_PROBE_SECONDS)
        return dataclasses.replace(result, after=max(result.after, CREDENTIALS_PROBE_SECONDS))

    async def _failed(self, name: str, kind: str) -> None:
        """One more failure in `name`'s run, judged from its row (outbox.store.destinations.NOTE_FAILURE); a
        destination known broken here is not written to: its probes' failures change nothing."""
        if self._held.get(name):
            return
        run = await self._store.note_failure(name, kind, self._breaker)
        if not run.broken:
            return
        if run.newly_broken:
            reason = f"{run.failures} attempts in {run.seconds:.0f} s failed or were asked to slow down, none accepted"
            self._change(name, kind, "broken", reason)
        self._hold(name, broken=True)
        self._not_before[name] = asyncio.get_running_loop().time() + self._config.probe_seconds

    def _hold(self, name: str, broken: bool = False) -> None:
        """Held here from now (broken, or as broken as it was); its attempts waiting in the slow start's
        window go on to take their turns."""
        self._held[name] = broken or self._held.get(name, False)
        self._slow_start.wake(name)

    def ended(self, action: ClaimedAction) -> None:
        """`action`'s attempt ended: its place in its destination's slow start is free, and a held destination
        whose last claim found no ready head is claimed for again at once (the lane's next head may be ready)."""
        self._slow_start.ended(action)
        if action.destination in self._no_heads:
            self._no_heads.discard(action.destination)
            self._not_before.pop(action.destination, None)

    def _change(self, name: str, kind: str, change: str, reason: str, seconds: float | None = None) -> None:
        self._outcomes.destination(DestinationChange(name, kind, change, reason, seconds))
