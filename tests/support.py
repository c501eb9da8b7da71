"""Small helpers the tests share: waiting for a condition the database can observe."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine, text


def until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds. Polling, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def sessions_waiting_on_a_lock(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )
