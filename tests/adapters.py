"""Adapters for the test kinds: scripted by the test, recording what the provider saw.

`ScriptedAdapter` runs a coroutine the test gives it (or fences and confirms). `recording_adapters` is
the factory `outbox run --adapters tests.adapters:recording_adapters` loads in executor processes: it
appends each attempt's start and end (wall clock, one machine) to the file in OUTBOX_TEST_RECORD_FILE.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import ActionAdapter, ActionAttempt, Done, Result, Uncertain
from outbox.executor.claimed import ClaimedAction
from outbox.kinds import ActionKind
from tests import kinds

Behaviour = Callable[[ActionAttempt], Awaitable[Result]]


async def fence_and_confirm(attempt: ActionAttempt) -> Result:
    window = await attempt.fence().begin_write()
    window.check()
    return Done(f"ref-{attempt.action.id}")


class ScriptedAdapter:
    def __init__(self, kind: ActionKind, behaviour: Behaviour = fence_and_confirm) -> None:
        self._kind = kind
        self.behaviour = behaviour
        self.calls: list[ClaimedAction] = []

    @property
    def kind(self) -> ActionKind:
        return self._kind

    async def execute(self, attempt: ActionAttempt) -> Result:
        self.calls.append(attempt.action)
        return await self.behaviour(attempt)


class RecordingAdapter:
    """Fences, works for a random 0-3 ms (or `work_seconds`), confirms, and records [id, lane, start_ns, end_ns]."""

    def __init__(self, kind: ActionKind, record: list[list[object]], work_seconds: float | None = None) -> None:
        self._kind = kind
        self._record = record
        self._work_seconds = work_seconds

    @property
    def kind(self) -> ActionKind:
        return self._kind

    async def execute(self, attempt: ActionAttempt) -> Result:
        start = time.time_ns()
        window = await attempt.fence().begin_write()
        window.check()
        await asyncio.sleep(
            random.random() * 0.003 if self._work_seconds is None else self._work_seconds
        )  # the provider's work
        self._record.append([attempt.action.id, attempt.action.lane_key, start, time.time_ns()])
        return Done(f"ref-{attempt.action.id}")


class _FileRecord(list[list[object]]):
    def __init__(self, path: str) -> None:
        super().__init__()
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def append(self, entry: list[object]) -> None:
        self._file.write(json.dumps(entry) + "\n")


def recording_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The adapters of an executor process in the lanes test. OUTBOX_TEST_CLOCK_SKEW_SECONDS moves this
    process's wall clock, to show that leases and due times never read it; OUTBOX_TEST_WORK_SECONDS sets how
    long the provider works on each attempt (a random 0-3 ms without it)."""
    skew = float(os.environ.get("OUTBOX_TEST_CLOCK_SKEW_SECONDS", "0"))
    if skew:
        real_time = time.time
        time.time = lambda: real_time() + skew
    record = _FileRecord(os.environ["OUTBOX_TEST_RECORD_FILE"])
    work = os.environ.get("OUTBOX_TEST_WORK_SECONDS")
    return [RecordingAdapter(kinds.NOOP, record, float(work) if work else None)]


class UncertainAdapter:
    """Fences, then reports that the provider may hold the write."""

    def __init__(self, kind: ActionKind) -> None:
        self._kind = kind

    @property
    def kind(self) -> ActionKind:
        return self._kind

    async def execute(self, attempt: ActionAttempt) -> Result:
        (await attempt.fence().begin_write()).check()
        return Uncertain("the provider timed out after the write")


def uncertain_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    return [UncertainAdapter(kinds.NOOP)]
