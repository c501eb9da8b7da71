"""A destination's configured rate: attempts a unit of time, written `14/s`, `600/min` or `3600/h`.

    OUTBOX_SMTP_RATE=14/s, register_endpoint(..., rate="10/s") ──parse_rate──▶ Rate(per_second, burst)
        ──the executor's start──▶ agent_destination.rate, .burst (held by all executors together)

The burst is the attempts that may start at once above the rate: a quarter of a second's worth (BURST_SECONDS),
at least one. In any window of T seconds all executors together start at most `per_second * T + burst`
attempts. A smaller burst would ask every executor to claim again within a few milliseconds of each token,
which a busy machine does not: the tokens it missed would be lost, and the rate not reached.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+)\s*")
# the highest rate a destination may be given, a second
MAX_PER_SECOND = 1_000_000.0
# a rate's burst, in seconds of the rate (and a learned pace's: outbox.executor.pacing)
BURST_SECONDS = 0.25


@dataclass(frozen=True)
class Rate:
    per_second: float

    @property
    def burst(self) -> float:
        return max(1.0, self.per_second * BURST_SECONDS)

    def __str__(self) -> str:
        return f"{self.per_second:g}/s"


def parse_rate(value: object, where: str) -> Rate:
    """`value` (`14/s`, `600/min`, `3600/h`) as a Rate; ValueError naming `where` and the forms it takes."""
    found = _RATE.fullmatch(value) if isinstance(value, str) else None
    unit = _UNITS.get(found.group(2)) if found else None
    if found is None or unit is None:
        shown = repr(value) if isinstance(value, str) and len(value) <= 40 else f"a {type(value).__name__}"
        raise ValueError(f"{where}: a rate is a number of attempts per s, min or h, such as 14/s, not {shown}")
    per_second = float(found.group(1)) / unit
    if not (math.isfinite(per_second) and 0 < per_second <= MAX_PER_SECOND):
        raise ValueError(f"{where}: a rate must be above 0 and at most {MAX_PER_SECOND:g}/s, not {value}")
    return Rate(per_second)
