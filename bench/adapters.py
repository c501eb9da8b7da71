"""Adapters of the benchmark processes: a no-op that passes its fence, and one that records pickup time."""

from __future__ import annotations

import os
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from bench import kinds
from outbox.executor import ActionAdapter, ActionAttempt, Done, Result
from outbox.kinds import ActionKind


class NoopAdapter:
    """Fences (a real write), then confirms: the executor's whole cost with a provider that takes no time."""

    def __init__(self, kind: ActionKind, pickups: list[str] | None = None) -> None:
        self._kind = kind
        self._pickups = pickups

    @property
    def kind(self) -> ActionKind:
        return self._kind

    async def execute(self, attempt: ActionAttempt) -> Result:
        if self._pickups is not None:
            self._pickups.append(f"{attempt.action.id} {time.time_ns()}\n")
        (await attempt.fence().begin_write()).check()
        return Done("noop")


def noop_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    return [NoopAdapter(kinds.NOOP)]


class _Lines(list[str]):
    def __init__(self, path: str) -> None:
        super().__init__()
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def append(self, line: str) -> None:
        self._file.write(line)


def pickup_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    return [NoopAdapter(kinds.NOOP, _Lines(os.environ["OUTBOX_BENCH_PICKUP_FILE"]))]
