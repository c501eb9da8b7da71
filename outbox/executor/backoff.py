"""The wait before a retry: exponential in the attempt number, capped, with jitter.

The n-th retry waits a delay drawn uniformly from [d/2, d], where d = min(CAP, BASE * 2**(n-1)):
5 s, 10 s, 20 s, ... up to 1 hour. Half of the delay is jitter, so actions that failed together (a relay
outage) do not all come back in the same second.
"""

from __future__ import annotations

import random

BASE_SECONDS = 5.0
CAP_SECONDS = 3600.0


def retry_delay(attempt: int, rng: random.Random | None = None) -> float:
    ceiling = min(CAP_SECONDS, BASE_SECONDS * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)
