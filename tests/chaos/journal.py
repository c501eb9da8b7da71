"""Reading the executors' journals (tests.chaos.adapters.Journal): what a process held, where it froze; and
their logs: when a process first found the database unreachable."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any


def read(path: Path | None) -> list[dict[str, Any]]:
    """Every entry of a journal, in order (none when it does not exist)."""
    if path is None or not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut by SIGKILL
            entries.append(json.loads(line))
    return entries


def held(path: Path | None) -> list[tuple[int, int]]:
    """The attempts a process had started and not ended: (action id, epoch)."""
    open_attempts: dict[tuple[int, int], bool] = {}
    for entry in read(path):
        key = (entry["id"], entry["epoch"])
        if entry["e"] == "start":
            open_attempts[key] = True
        elif entry["e"] == "end":
            open_attempts.pop(key, None)
    return sorted(open_attempts)


def brink_of(path: Path | None) -> tuple[int | None, int | None, str]:
    """The last action (its epoch, its kind) a process froze itself at the brink for."""
    brinks = [e for e in read(path) if e["e"] == "brink"]
    return (brinks[-1]["id"], brinks[-1]["epoch"], brinks[-1]["kind"]) if brinks else (None, None, "")


# what an executor logs when a statement of its finds the database unavailable (the loop, the group commit)
UNREACHABLE = ("database unavailable", "could not reach the database")


def first_unreachable(log: Path, offset: int, skew: float, before: float) -> float | None:
    """When (epoch seconds, this machine's clock) the executor log first says the database is unreachable,
    after `offset` and before `before`; its lines carry the process's wall clock, `skew` seconds off."""
    if not log.exists():
        return None
    with log.open("rb") as file:
        file.seek(offset)
        text = file.read().decode(errors="replace")
    for line in text.splitlines():
        if any(words in line for words in UNREACHABLE):
            with contextlib.suppress(ValueError):  # "2026-12-01 13:06:17,123 WARNING ..." (local time)
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() - skew
                return at if at < before else None
    return None
