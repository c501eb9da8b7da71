"""ExecutorConfig: the executor's settings and their defaults, in one place. The command (`outbox run`) and the
drain flow take their defaults from here, and the lease's from the settings' defaults (LEASE_SECONDS, which the
drain flow's settings share); it imports nothing else, so the commands that never run an executor can."""

from __future__ import annotations

from dataclasses import dataclass

from outbox._internal.config.defaults import LEASE_SECONDS

# The provider call must end within this many seconds of the fence; a fence with less lease left refuses.
WRITE_WINDOW_SECONDS = 60.0
# The connections of an executor's engine (the adapters' queries), all kept open once opened: an attempt
# holds one for a query of milliseconds, so eight serve any concurrency, and a pool that closed what it
# opened past a smaller core would connect (a server process forked) for most attempts of a busy executor.
ENGINE_POOL_SIZE = 8


@dataclass(frozen=True)
class ExecutorConfig:
    # attempts in flight at once in this executor
    concurrency: int = 64
    # the most lane heads one claim takes (None: as many as `concurrency`); a claim takes as many as there
    # are free slots, so it is small when the executor is busy or idle and large under a burst
    claim_batch: int | None = None
    # a claim's lease; the write window (60 s) must fit inside it after the adapter's preparation
    lease_seconds: float = LEASE_SECONDS
    # the longest an idle executor waits before it looks again without a notification
    poll_seconds: float = 1.0
    # how often expired leases and expired unstarted actions are looked for
    sweep_seconds: float = 1.0
    # on stop: how long an attempt that has not reached its fence may run before it is cancelled
    handback_grace_seconds: float = 5.0
    # a destination whose attempts all failed or were slowed down this long, judged from its row in the
    # database, is broken (outbox.executor.pacing); then one probe every `probe_seconds` finds when it is back
    break_seconds: float = 120.0
    probe_seconds: float = 15.0
    # the most attempts of one destination in flight here while another destination has due heads (None: a
    # quarter of `concurrency`); a destination alone that answers still takes every free slot, and one that
    # has not answered no more than its slow start sends (outbox.executor.executor's claim)
    destination_slots: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1 or (self.claim_batch is not None and self.claim_batch < 1):
            raise ValueError("concurrency and claim_batch must be at least 1")
        if self.destination_slots is not None and self.destination_slots < 1:
            raise ValueError(f"destination_slots must be at least 1, not {self.destination_slots}")
        if self.lease_seconds <= WRITE_WINDOW_SECONDS:
            raise ValueError(
                f"lease_seconds must exceed the {WRITE_WINDOW_SECONDS:.0f} s write window, not {self.lease_seconds}"
            )
        if min(self.poll_seconds, self.sweep_seconds, self.break_seconds, self.probe_seconds) <= 0:
            raise ValueError("poll_seconds, sweep_seconds, break_seconds and probe_seconds must be positive")

    @property
    def destination_share(self) -> int:
        """The most attempts of one destination in flight here while another has due heads."""
        return self.destination_slots or max(1, self.concurrency // 4)

    @property
    def claim_size(self) -> int:
        """The most lane heads one claim takes."""
        return self.claim_batch or self.concurrency


def start_line(kinds: list[str], shown_url: str, config: ExecutorConfig) -> str:
    """What an executor says when it starts: its kinds, its database (no password), its settings, and whether its
    attempts make spans (outbox.tracing: the adapters' factory, which ran before, may have set a provider)."""
    from outbox import tracing

    batch = f"{config.claim_batch}" if config.claim_batch is not None else "up to the free slots"
    return (
        f"carrying out {', '.join(kinds)} on {shown_url}: concurrency {config.concurrency},"
        f" claim batch {batch}, lease {config.lease_seconds:g} s; {tracing.described()}"
    )


# the defaults, for the options and parameters that offer them
DEFAULTS = ExecutorConfig()
