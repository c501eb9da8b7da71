"""Small helpers the tests share: waiting for a condition the database can observe, and ended actions of the past."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, text

_calls = itertools.count()


def until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `condition` every 20 ms until it holds; fail after `timeout` seconds. Polling, never a fixed
    sleep: the pause only keeps a condition that asks a server from hammering it."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


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


@contextmanager
def waiting_on_a_lock(engine: Engine, work: Callable[[], None], what: str) -> Iterator[None]:
    """`work` in a thread of its own, until it waits on a lock in `engine`'s database; the block releases it,
    and `work` must then end without an error within 10 s."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # reported to the test's thread below
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    until(lambda: sessions_waiting_on_a_lock(engine) == 1, what=what)
    yield
    thread.join(10)
    assert not errors and not thread.is_alive(), errors


def insert_ended(
    engine: Engine,
    *,
    ended_ago: timedelta,
    count: int = 1,
    key_prefix: str | None = None,
    state: str = "DONE",
    stop_reason: str = "CONFIRMED",
    subject_account_id: int | None = None,
) -> list[int]:
    """Ended actions as they look `ended_ago` after they ended (created a minute before they ended).

    Their idempotency keys are `key_prefix-1`, `key_prefix-2`, ... (by default a prefix for each call).
    The guard stamps ended_at with the present, so they are inserted with the triggers off; ended rows
    hold no lane (`lane_head` false), so every lane's holder stays exact.
    """
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        rows = conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id,
                                      max_attempts, state, attempt, epoch, stop_reason, write_started_at,
                                      created_at, ended_at)
            SELECT 'TEST_NOOP', 1, 'ended', :prefix || '-' || g, NULL, :subject, 5, :state, 1, 1, :reason,
                   now() - :ago, now() - :ago - interval '1 minute', now() - :ago
              FROM generate_series(1, :count) AS g
            RETURNING id
            """),
            {
                "prefix": key_prefix or f"ended{next(_calls)}",
                "subject": subject_account_id,
                "state": state,
                "reason": stop_reason,
                "ago": ended_ago,
                "count": count,
            },
        )
        return list(rows.scalars())


def prefect_post(prefect_url: str, path: str, body: dict[str, Any]) -> Any:
    """POST `body` to a Prefect server's REST API (`path` under /api) and return its JSON answer (None for an
    empty one), through Prefect's client (a busy server is asked again)."""
    from prefect.client.orchestration import SyncPrefectClient

    with SyncPrefectClient(f"{prefect_url}/api") as client:
        response = client.request("POST", path, json=body)  # type: ignore[arg-type]  # a route with its ids
    return response.json() if response.content else None


def enqueue_verify_emails(engine: Engine, emails: int, lanes: int) -> list[str]:
    """The example application's tables, `lanes` accounts (user<n>@example.com, one lane each) and `emails`
    verify-address emails dealt over them in turn, enqueued in one statement; their idempotency keys."""
    from examples.accounts import notices, schema
    from outbox.intake import enqueue_many

    requests = [
        notices.VERIFY_ADDRESS.request({"account_id": n % lanes + 1, "request": n // lanes + 1}) for n in range(emails)
    ]
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(
            text(
                "INSERT INTO app_account SELECT g, 'Account ' || g, 'user' || g || '@example.com', false"
                " FROM generate_series(1, :lanes) AS g"
            ),
            {"lanes": lanes},
        )
        return [action.idempotency_key for action in enqueue_many(conn, requests)]
