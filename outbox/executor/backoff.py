"""The waits before an action is claimed again: after a retry, and after a fault of outbox's own database.

Retry: the n-th retry waits a delay drawn uniformly from [d/2, d], where d = min(CAP, BASE * 2**(n-1)):
5 s, 10 s, 20 s, ... up to 1 hour. Half of the delay is jitter, so actions that failed together (a relay
outage) do not all come back in the same second.

A kind with a retry schedule of its own (`ActionKind.retry_schedule`, such as WEBHOOK's) waits its n-th
wait instead (the last one repeats), up to 10 % longer at random.

Own fault (outbox's database or pool failed before the fence; the attempt does not count): the same
shape, from 1 s doubling to 60 s, by the claims of the action that did not count so far (`epoch -
attempt` at the claim: own faults, deferrals and hand-backs on stop). The database comes back within
seconds after a restart or a failover, so the first waits are short; the cap keeps a long outage to one
try a minute per action, and the jitter spreads the actions that failed together.

Slow-down (the provider asked to slow down before anything was written, such as an SMTP 421 or a 429 with no
Retry-After; the attempt does not count): the destination pauses (outbox.executor.pacing), and the action
waits the pause; when the pause cannot be written, and for an action that alone must wait (a greylisted
message), the same shape again, from 1 s doubling to 5 minutes, by the same count of uncounted claims.
The provider names no time, so the first waits are short (a rate limit's window is often a second or a
minute); doubling keeps an action that meets the limit again and again from asking over and over, and the cap
bounds the wait after a long throttle to one try every 2.5 to 5 minutes per action, so the backlog drains soon
after the provider accepts again.
"""

from __future__ import annotations

import random

from outbox.executor.results import Defer, Retry, SlowDown

BASE_SECONDS = 5.0
CAP_SECONDS = 3600.0

OWN_FAULT_BASE_SECONDS = 1.0
OWN_FAULT_CAP_SECONDS = 60.0

SLOW_DOWN_BASE_SECONDS = 1.0
SLOW_DOWN_CAP_SECONDS = 300.0
# the deferrals an action may have before a slow-down counts as an attempt: waits of 1 s doubling to the cap
# add up to about half an hour to an hour
SLOW_DOWN_DEFERRALS = 20


# a scheduled wait is drawn from [d, d * (1 + SCHEDULE_JITTER)]
SCHEDULE_JITTER = 0.1


def retry_delay(attempt: int, schedule: tuple[float, ...] | None = None, rng: random.Random | None = None) -> float:
    """The wait after the retry of attempt number `attempt` (1 for the first): the kind's `schedule` when it
    has one, else the exponential backoff."""
    if schedule:
        wait = schedule[min(max(attempt, 1), len(schedule)) - 1]
        return (rng or random).uniform(wait, wait * (1 + SCHEDULE_JITTER))
    ceiling = min(CAP_SECONDS, BASE_SECONDS * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)


def own_fault_delay(uncounted: int, rng: random.Random | None = None) -> float:
    """The wait after an own fault, when `uncounted` earlier claims of the action did not count."""
    return _doubling(OWN_FAULT_BASE_SECONDS, OWN_FAULT_CAP_SECONDS, uncounted, rng)


def slow_down(uncounted: int, reason: str, after: float | None = None) -> SlowDown | Retry:
    """A provider's slow-down: a SlowDown (a Defer that pauses the destination) for `after` (the provider's own
    time), or else the slow-down backoff, while the action has had fewer than SLOW_DOWN_DEFERRALS uncounted
    claims. Past them a slow-down counts as an attempt (a Retry): a provider that answers "slow down" for
    ever, such as a policy refusal sent as a 4xx or a receiver that always answers 429, still lets the action
    end."""
    if uncounted >= SLOW_DOWN_DEFERRALS:
        return Retry(f"{reason} (after {uncounted} deferrals, counted as an attempt)")
    if after is None:
        return SlowDown(slow_down_delay(uncounted), reason)
    return SlowDown(after, reason, named=True)


def not_yet(uncounted: int, reason: str) -> Defer | Retry:
    """This action, not its destination, must wait (a greylisting relay wants this message again later): a
    Defer after the slow-down backoff, or past SLOW_DOWN_DEFERRALS uncounted claims a Retry."""
    if uncounted >= SLOW_DOWN_DEFERRALS:
        return Retry(f"{reason} (after {uncounted} deferrals, counted as an attempt)")
    return Defer(slow_down_delay(uncounted), reason)


def slow_down_delay(uncounted: int, rng: random.Random | None = None) -> float:
    """The wait after a provider's slow-down that named no time, when `uncounted` earlier claims of the
    action did not count."""
    return _doubling(SLOW_DOWN_BASE_SECONDS, SLOW_DOWN_CAP_SECONDS, uncounted, rng)


def _doubling(base: float, cap: float, uncounted: int, rng: random.Random | None) -> float:
    ceiling = min(cap, base * 2 ** min(max(0, uncounted), 16))
    return (rng or random).uniform(ceiling / 2, ceiling)
