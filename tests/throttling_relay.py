"""ThrottlingRelay: the SMTP sink (demo/sink.py) behind a token bucket, as a relay that limits its sending rate.

    MAIL FROM ──▶ the bucket (`per_second` tokens a second, at most `capacity`) has a token? ── yes ─▶ 250
                                                                                    ── no ──▶ the refusal
    RCPT TO   ──▶ greylisting (optional): a share of the recipients seen for the first time refused 451 4.7.1,
                  every later delivery to them accepted (one sender, one client: the recipient alone tells
                  a greylist's triplets apart)
    DATA      ──▶ the sink keeps the message (`accepted`, with the wall-clock time of its MAIL FROM)

The refusal is Amazon SES's `454 4.7.0 Throttling failure: Maximum sending rate exceeded` or a relay's
`421 4.7.0 Try again later, closing connection` (the sink closes the connection after a 421). A token is spent
by every MAIL FROM the bucket lets through, also when its message is then greylisted. The bucket starts full.
"""

from __future__ import annotations

import threading
import time
from typing import Literal

from aiosmtpd.smtp import Session

from demo.sink import Received, SmtpSink

Refusal = Literal["454", "421"]
REFUSALS: dict[Refusal, str] = {
    "454": "454 4.7.0 Throttling failure: Maximum sending rate exceeded",
    "421": "421 4.7.0 Try again later, closing connection",
}
GREYLISTED = "451 4.7.1 Greylisted, please come back later"
# The opening of a drain: before the first slow-down comes back every executor has its whole concurrency in
# flight, and what the relay refuses of it is the same whatever the pace does next
OPENING_SECONDS = 10.0


class ThrottlingRelay:
    """Start with `start()`, stop with `stop()`; `accepted`, `refused` (with `refused_at`) and `greylisted` tell
    what it did."""

    def __init__(
        self,
        per_second: float,
        *,
        capacity: float | None = None,
        refusal: Refusal = "454",
        greylist: float = 0.0,
        seed: int = 0,
    ) -> None:
        """`capacity`: the tokens the bucket holds at most (None: one second's worth); `greylist`: the share of
        recipients refused as greylisted the first time they are seen."""
        self.per_second = per_second
        self.capacity = capacity if capacity is not None else per_second
        self.refusal = refusal
        self.greylist = greylist
        self.sink = SmtpSink(seed=seed)
        self.sink.on_mail = self._on_mail
        self.sink.on_rcpt = self._on_rcpt
        # the wall-clock times of the MAIL FROMs refused by the bucket; the RCPT TOs refused as greylisted
        self.refused_at: list[float] = []
        self.greylisted = 0
        self._lock = threading.Lock()
        self._tokens = self.capacity
        self._filled_at = time.monotonic()
        self._seen: set[str] = set()

    @property
    def port(self) -> int:
        return self.sink.port

    def start(self) -> ThrottlingRelay:
        self.sink.start()
        return self

    def stop(self) -> None:
        self.sink.stop()

    @property
    def refused(self) -> int:
        return len(self.refused_at)

    def refused_after_opening(self) -> int:
        """The refusals after the first OPENING_SECONDS from the first MAIL FROM the relay saw."""
        first = min([r.mail_at for r in self.accepted] + self.refused_at, default=0.0)
        return sum(at >= first + OPENING_SECONDS for at in self.refused_at)

    @property
    def accepted(self) -> list[Received]:
        return list(self.sink.received)

    def duplicates(self) -> int:
        """Messages accepted more than once (by Message-ID): the copies beyond the first."""
        return sum(n - 1 for n in self.sink.count_by_message_id().values())

    def busiest_second(self) -> int:
        """The most messages accepted whose MAIL FROM fell within one second of each other."""
        times = sorted(r.mail_at for r in self.accepted)
        most, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= 1.0:
                first += 1
            most = max(most, last - first + 1)
        return most

    def _on_mail(self, session: Session) -> str | None:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.capacity, self._tokens + (now - self._filled_at) * self.per_second)
            self._filled_at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return None
            self.refused_at.append(time.time())
        return REFUSALS[self.refusal]

    def _on_rcpt(self, session: Session, address: str) -> str | None:
        if not self.greylist:
            return None
        with self._lock:
            first = address not in self._seen
            self._seen.add(address)
            if first and self.sink.rng.random() < self.greylist:
                self.greylisted += 1
                return GREYLISTED
        return None
