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
"""

from __future__ import annotations

import random

BASE_SECONDS = 5.0
CAP_SECONDS = 3600.0

OWN_FAULT_BASE_SECONDS = 1.0
OWN_FAULT_CAP_SECONDS = 60.0


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
    ceiling = min(OWN_FAULT_CAP_SECONDS, OWN_FAULT_BASE_SECONDS * 2 ** min(max(0, uncounted), 16))
    return (rng or random).uniform(ceiling / 2, ceiling)
