"""A rate-limited backlog: 1,000 GitLab notes over 100 merge requests, two executors, a local GitLab whose rate
limit refuses a token's posts past 45 in a one-second window (GitLab's own is a window of a minute: scaled down
so the test runs in seconds). The host is registered at 40 a second: with its burst of 10 a window may ask
for 50, so the limit bites and its 429s pause the host for every executor. None ends FAILED, every note is posted once
and in its merge request's order, and the refused calls (429) are at most 5 % of the accepted ones.

    enqueue_many ─▶ 1,000 actions, one lane per merge request ─▶ two executors, the host's rate shared
        ─▶ POST …/merge_requests/:iid/notes ─▶ the token's window: 429 (Retry-After, RateLimit-Reset) or stored
"""

from __future__ import annotations

import asyncio
import os

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.gitlab_api import GitlabApi
from outbox.executor import Executor
from outbox.gitlab import GitlabAdapter, note_request, register_host
from outbox.gitlab import hosts as host_registry
from outbox.intake import enqueue_many
from tests.test_nats import until_async

TOKEN = "glpat-" + "b" * 20
PROJECT = "acme/shop"
MERGE_REQUESTS = range(1, 101)
PER_MERGE_REQUEST = 10


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_registry, "_HOSTS", {})
    for name in [name for name in os.environ if name.startswith("OUTBOX_GITLAB_TOKEN_")]:
        monkeypatch.delenv(name)


async def test_a_rate_limited_backlog_of_1000_over_100_merge_requests_drains_with_few_refusals(
    engine: Engine, aengine: AsyncEngine
) -> None:
    api = GitlabApi([TOKEN], budget=45, window_seconds=1.0)
    api.add_project(PROJECT, merge_requests=MERGE_REQUESTS, issues=())
    api.start()
    adapters: list[GitlabAdapter] = []
    try:
        register_host("main", api.url, token=TOKEN, rate="40/s")
        requests = [
            note_request("main", PROJECT, f"note {n} on !{iid}", merge_request=iid, idempotency_key=f"!{iid}-{n}")
            for n in range(PER_MERGE_REQUEST)
            for iid in MERGE_REQUESTS
        ]
        with engine.begin() as conn:
            enqueue_many(conn, requests)
        adapters = [GitlabAdapter(aengine), GitlabAdapter(aengine)]
        executors = [Executor(aengine, [adapter], listen=False) for adapter in adapters]
        running = [asyncio.create_task(executor.run()) for executor in executors]
        try:
            await until_async(lambda: ended(engine), 150, "every note ended")
        finally:
            for executor in executors:
                executor.stop()
            await asyncio.gather(*running)
        with engine.connect() as conn:
            states = dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all())
    finally:
        for adapter in adapters:
            await adapter.aclose()
        api.stop()
    assert states == {"DONE": len(requests)}
    assert sorted(api.markers()) == sorted(set(api.markers())) and len(api.markers()) == len(requests)
    for iid in MERGE_REQUESTS:  # one lane per merge request: in the order enqueued
        bodies = [note["body"].split("\n")[0] for note in api.notes(PROJECT, "merge_request", iid)]
        assert bodies == [f"note {n} on !{iid}" for n in range(PER_MERGE_REQUEST)]
    print(f"refused {api.refused} of {api.accepted} accepted ({api.refused / api.accepted:.1%})")
    assert api.refused <= 0.05 * api.accepted, api.refused


async def ended(engine: Engine) -> bool:
    def count() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM agent_action WHERE state NOT IN ('DONE', 'FAILED', 'UNCERTAIN')")
                ).scalar_one()
            )

    return await asyncio.to_thread(count) == 0
