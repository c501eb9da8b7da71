"""What `outbox demo` shows while it works, on a terminal and sent to a file or a pipe alike.

    step(text) ─ news(text) ─▶ a terminal: a spinner and its text, with the seconds so far
                           └▶ a file or a pipe: a line now, and a line whenever the news changes
    counts() ─ count(description, total) ─ update(done, detail) ─ finish() ─▶ a terminal: one bar per count
                           └▶ a file or a pipe: a line per count every LINE_SECONDS, grown or not (with
                              `detail()`, what it waits for, when it did not grow), and its last

A pipe shows neither a spinner nor a bar (rich prints them only to a terminal), so there the demo writes
plain lines, each one flushed as it is written. A count keeps its own clock, from its creation (or the
moment it is given) to `finish()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

# a count sent to a file or a pipe writes a line this often while it grows
LINE_SECONDS = 5.0
BAR_COLUMNS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


@contextmanager
def step(console: Console, text: str) -> Iterator[Callable[[str], None]]:
    """A step of the demo: `text` shown while it runs; the function it gives replaces that text with news."""
    started = time.monotonic()
    if console.is_terminal:
        with console.status(text) as status:
            yield lambda news: status.update(f"{news}; {time.monotonic() - started:.0f} s so far")
        return
    console.print(text, soft_wrap=True)
    said = [text]

    def say(news: str) -> None:
        if news != said[-1]:
            said.append(news)
            console.print(f"{news}; {time.monotonic() - started:.0f} s so far", soft_wrap=True)

    yield say


class Count:
    """One count toward its total, with its own clock: a bar on a terminal, lines elsewhere."""

    def __init__(
        self, console: Console, bars: Progress | None, description: str, total: int, started: float | None = None
    ) -> None:
        self.console = console
        self.bars = bars
        self.description = description
        self.total = total
        self.task: TaskID | None = None if bars is None else bars.add_task(description, total=total)
        self.started = time.monotonic() if started is None else started
        self.printed = (time.monotonic(), -1)  # when the last line was written, and the count it gave

    def update(self, done: int, detail: Callable[[], str] = lambda: "") -> None:
        """`done` so far; on a file or a pipe, a line every LINE_SECONDS, with `detail()` (what the count
        waits for) when it did not grow since the last line."""
        if self.bars is not None and self.task is not None:
            self.bars.update(self.task, completed=done)
        elif done < self.total and time.monotonic() - self.printed[0] >= LINE_SECONDS:  # finish() says the last
            waiting = detail() if done == self.printed[1] else ""
            self._line(done, f"{time.monotonic() - self.started:.0f} s so far" + (f"; {waiting}" if waiting else ""))

    def finish(self) -> float:
        """The count reached its total: its seconds since it started."""
        seconds = time.monotonic() - self.started
        if self.bars is not None and self.task is not None:
            self.bars.update(self.task, completed=self.total)
        else:
            self._line(self.total, f"in {seconds:.1f} s")
        return seconds

    def _line(self, done: int, when: str) -> None:
        self.console.print(f"{self.description}: {done:,} of {self.total:,}, {when}", soft_wrap=True)
        self.printed = (time.monotonic(), done)


class Counts:
    def __init__(self, console: Console, bars: Progress | None) -> None:
        self.console = console
        self.bars = bars

    def count(self, description: str, total: int, started: float | None = None) -> Count:
        """A new count, its clock started now, or at `started` (time.monotonic())."""
        return Count(self.console, self.bars, description, total, started)


@contextmanager
def counts(console: Console) -> Iterator[Counts]:
    """The counts of one stage: bars that stay on a terminal once it ends, lines elsewhere."""
    if not console.is_terminal:
        yield Counts(console, None)
        return
    with Progress(*BAR_COLUMNS, console=console) as bars:
        yield Counts(console, bars)
