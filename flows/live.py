"""A drain run's live view: what its executor did so far and the outbox's backlog, shown while it runs.

    executor claims ─▶ at once, then every LIVE_SECONDS until the run ends:
        the executor's Outcomes so far (attempts by kind, result, recorded)
        + outbox.ops.status (due now, waiting behind lane heads, oldest due) + outbox.ops.lanes (deepest)
        ─▶ LiveView ─┬─▶ one markdown artifact (key outbox-drain-live): created at the first refresh
                     │   with something to show (an attempt, or anything unended in the outbox), then
                     │   updated in place (the same row: no new version)
                     └─▶ one INFO log line (`live: ...`), at the first refresh and then when the figures
                         moved, at most once every LOG_SECONDS

What it costs the Prefect server's database, per run: one artifact row and one event (its key's newest
version changed; the hand-over table, when the run attempted something, is a second of each), none when
the outbox was empty throughout; one live log line at the first claim, then at most one a minute while the
figures move. A day of 288 runs writes at most 288 live artifacts, and at most 1,440 live lines per
executor that is busy all day. The backlog is read on the outbox database with the statements of
`outbox status` and `outbox lanes`, once per refresh.

The Prefect API or the database being unreachable never stops the executor: the refresh is skipped, one
warning says why, and the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect.artifacts import acreate_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.logging.handlers import PrefectConsoleHandler
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import Executor
from outbox.executor.outcomes import Outcomes
from outbox.ops import Lane, Status, lanes, status
from outbox.store.metrics import READ_ONLY_SNAPSHOT

# how often the live artifact is refreshed in place (the first refresh comes when the executor claims)
LIVE_SECONDS = 30.0
# the fewest seconds between two live log lines
LOG_SECONDS = 60.0
# the key of the live artifact: the Artifacts page shows the newest run's
LIVE_KEY = "outbox-drain-live"
# how many of the deepest lanes the view shows
DEEPEST = 5


@dataclass(frozen=True)
class LiveView:
    at: datetime
    # (kind, result, recorded) -> attempts of this run's executor so far
    attempts: dict[tuple[str, str, bool], int]
    backlog: Status
    deepest: tuple[Lane, ...]
    # the cell the run drains (None: the one database)
    cell: str | None = None

    @property
    def empty(self) -> bool:
        """No attempt so far and nothing unended in the outbox: nothing to show beyond the log line."""
        return not self.attempts and not self.backlog.unended

    def moved_since(self, other: LiveView | None) -> bool:
        """Whether the counts differ from `other`'s (ages grow by themselves: they do not count)."""
        return other is None or self._counts() != other._counts()

    def _counts(self) -> tuple[Any, ...]:
        backlog = (self.backlog.due, self.backlog.waiting_for_lane, self.backlog.executing)
        lanes = tuple((lane.lane_key, lane.depth, lane.head_id) for lane in self.deepest)
        return (tuple(sorted(self.attempts.items())), backlog, lanes)

    def line(self) -> str:
        """The view on one line, for the run's logs."""
        attempts = sum(self.attempts.values())
        by_result: dict[str, int] = {}
        for (kind, result, _), count in self.attempts.items():
            by_result[f"{kind} {result}"] = by_result.get(f"{kind} {result}", 0) + count
        shown = ", ".join(f"{name} {count}" for name, count in sorted(by_result.items()))
        lanes = ", ".join(f"{lane.lane_key} {lane.depth} (head {lane.head_id})" for lane in self.deepest)
        return (
            (f"live, cell {self.cell}: " if self.cell else "live: ")
            + f"{attempts} attempts"
            + (f" ({shown})" if shown else "")
            + f"; backlog: due now {self.backlog.due},"
            f" waiting behind lane heads {self.backlog.waiting_for_lane}, oldest due {_age(self.backlog)};"
            f" deepest lanes: {lanes or 'none'}"
        )

    def markdown(self) -> str:
        """The view as the artifact shows it."""
        rows = [
            f"| {kind} | {result} | {'yes' if recorded else 'no'} | {count} |"
            for (kind, result, recorded), count in sorted(self.attempts.items())
        ]
        lanes = [
            f"| `{lane.lane_key}` | {lane.depth} | {lane.head_id} | {lane.head_state} | {lane.head_age_seconds:.1f} s |"
            for lane in self.deepest
        ]
        return "\n".join(
            [
                f"### Live{f', cell {self.cell}' if self.cell else ''}, {self.at:%Y-%m-%d %H:%M:%S}Z"
                f" (refreshed every {LIVE_SECONDS:.0f} s while the run works)",
                "",
                f"**Attempts so far: {sum(self.attempts.values())}** (this run's executor)",
                "",
                "| kind | result | recorded | attempts |",
                "| --- | --- | --- | --- |",
                *(rows or ["| - | - | - | 0 |"]),
                "",
                f"**Backlog** (the whole outbox{f' of cell {self.cell}' if self.cell else ''})",
                "",
                "| due now | waiting behind lane heads | oldest due | lanes with backlog | executing |",
                "| --- | --- | --- | --- | --- |",
                f"| {self.backlog.due} | {self.backlog.waiting_for_lane} | {_age(self.backlog)}"
                f" | {self.backlog.lanes_with_backlog} | {self.backlog.executing} |",
                "",
                f"**Deepest lanes** (top {DEEPEST})",
                "",
                "| lane | actions not started | head | head state | head age |",
                "| --- | --- | --- | --- | --- |",
                *(lanes or ["| - | 0 | - | - | - |"]),
            ]
        )


def _age(backlog: Status) -> str:
    seconds = backlog.oldest_due_seconds
    return "-" if seconds is None else f"{seconds:.1f} s"


def read_view(conn: Connection, outcomes: Outcomes, cell: str | None = None) -> LiveView:
    """The view now: the executor's attempts so far, and the backlog as `outbox status` counts it, every
    figure from one snapshot (read separately, the due actions and their lane heads could come from two
    moments, and what waits behind the heads read negative)."""
    conn.execute(READ_ONLY_SNAPSHOT)
    attempts = dict(outcomes.attempts)
    return LiveView(datetime.now(UTC), attempts, status(conn), lanes(conn, DEEPEST).deepest, cell)


def lane_keys_printed_as_they_are() -> None:
    """Prefect's console handler prints through rich, which reads `:name:` as an emoji code: the lane
    `workspace:100:webhook` would print as `workspace💯webhook` in the worker's output. Its console in this
    process stops reading emoji codes; what it highlights and how is unchanged."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            handler.console._emoji = False  # rich keeps Console(emoji=...) there; it has no setter


async def show_live(executor: Executor, engine: AsyncEngine, logger: Any, cell: str | None = None) -> None:
    """Refresh the run's live view from the executor's first claim until cancelled (the run ends); a cell's
    run shows its cell, under the key `outbox-drain-live-<cell>`."""
    lane_keys_printed_as_they_are()
    await executor.claiming.wait()
    loop = asyncio.get_running_loop()
    artifact: UUID | None = None
    logged: LiveView | None = None
    logged_at = -LOG_SECONDS
    failing = False
    while True:
        try:
            async with engine.connect() as conn:
                view = await conn.run_sync(read_view, executor.outcomes, cell)
            if view.moved_since(logged) and loop.time() - logged_at >= LOG_SECONDS:
                logger.info("%s", view.line())
                logged, logged_at = view, loop.time()
            if artifact is not None or not view.empty:
                artifact = await publish(view, artifact, cell)
            failing = False
        except Exception as error:  # the API or the database is down or slow: the executor drains on
            if not failing:
                logger.warning("cannot refresh the live view (%s); trying again", type(error).__name__)
            failing = True
        await asyncio.sleep(LIVE_SECONDS)


async def publish(view: LiveView, artifact: UUID | None, cell: str | None = None) -> UUID:
    """Create the live artifact (its key per cell for a cell's run), or update it in place; its id."""
    description = "This run's attempts so far, the backlog and the deepest lanes, refreshed while it works."
    if artifact is None:
        key = f"{LIVE_KEY}-{cell}" if cell else LIVE_KEY
        return await acreate_markdown_artifact(markdown=view.markdown(), key=key, description=description)
    async with get_client() as client:
        await client.update_artifact(artifact, ArtifactUpdate(data=view.markdown()))
    return artifact
