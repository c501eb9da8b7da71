"""A drain run's live view: it reads the backlog from one snapshot (a change committed between two of its
statements never shows as a negative count of the actions waiting behind their lane heads), and its line
shows lane keys as they are in the worker's console."""

from __future__ import annotations

import io
import logging
from typing import Any

from prefect.logging.handlers import PrefectConsoleHandler
from sqlalchemy import Engine, event, text

from flows.live import lane_keys_printed_as_they_are, read_view
from outbox.executor.outcomes import Outcomes
from outbox.store.metrics import DUE_ADMITTED_BY_KIND
from tests.test_executor_results import enqueue


def test_a_head_moved_between_the_counts_never_makes_the_waiting_negative(engine: Engine) -> None:
    head = enqueue(engine, lane="one")  # a lane head, due: one claimable, none behind it
    moved: list[int] = []

    def move_the_head_before_the_due_count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        """Once the lane heads are counted, another transaction puts the head's due time an hour ahead."""
        if statement.strip() == DUE_ADMITTED_BY_KIND.text.strip() and not moved:
            with engine.begin() as other:
                other.execute(
                    text("UPDATE agent_action SET due_at = now() + interval '1 hour' WHERE id = :id"), {"id": head}
                )
            moved.append(head)

    with engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", move_the_head_before_the_due_count)
        view = read_view(conn, Outcomes())
    assert moved == [head]  # the change was committed between the two counts
    assert (view.backlog.due, view.backlog.waiting_for_lane) == (1, 0), view.backlog
    with engine.connect() as conn:  # read afresh, the head is no longer due
        again = read_view(conn, Outcomes()).backlog
    assert (again.due, again.waiting_for_lane) == (0, 0), again


def test_a_lane_key_with_an_emoji_code_in_it_prints_as_it_is() -> None:
    """The worker's console shows a live line's lane keys as they are: `:100:` is no emoji there."""
    printed = io.StringIO()
    handler = PrefectConsoleHandler(stream=printed)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        lane_keys_printed_as_they_are()
        logging.getLogger("outbox.test").warning("deepest lanes: workspace:100:webhook 4 (head 7)")
    finally:
        root.removeHandler(handler)
    assert "deepest lanes: workspace:100:webhook 4 (head 7)" in printed.getvalue(), printed.getvalue()
