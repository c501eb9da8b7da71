"""A rate-limited backlog: 1,000 GitHub comments over 100 pull requests, two executors, a local GitHub API whose
secondary limit takes 40 content-creating requests a second (a burst of 10). None ends FAILED, every comment
is made once and in its pull request's order, and the refused requests (403 with retry-after) are at most 5 %
of the accepted ones.

    enqueue_many ─▶ 1,000 actions, one lane per pull request ─▶ two executors, the account paced at 40/s
        ─▶ POST .../issues/{n}/comments ─▶ the server's bucket ─▶ 403 retry-after (the account pauses) or stored
"""

from __future__ import annotations

import asyncio
import os

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.github_api import GithubApi
from outbox._internal.config.credentials import Sources
from outbox.executor import Executor
from outbox.github import GithubAdapter, comment_request, marker, register_account
from outbox.github import accounts as account_registry
from outbox.intake import enqueue_many
from tests.test_nats import until_async

TOKEN = "ghp_" + "a1" * 18
REPO = "acme/web"
PULLS = range(1, 101)
PER_PULL = 10
RATE = 40.0


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(account_registry, "_ACCOUNTS", {})
    monkeypatch.setattr(account_registry, "_SOURCES", Sources("secret"))
    for name in [name for name in os.environ if name.startswith("OUTBOX_GITHUB_")]:
        monkeypatch.delenv(name)


def ended(engine: Engine) -> bool:
    with engine.connect() as conn:
        return not conn.execute(
            text("SELECT count(*) FROM agent_action WHERE state IN ('ADMITTED', 'EXECUTING')")
        ).scalar_one()


async def test_a_rate_limited_backlog_of_1000_over_100_pull_requests_drains_with_few_refusals(
    engine: Engine, aengine: AsyncEngine
) -> None:
    github = GithubApi(tokens=[TOKEN], content_rate=RATE, content_burst=10).start()
    adapters: list[GithubAdapter] = []
    try:
        github.add_repo(REPO, pulls=PULLS)
        register_account("acme", url=github.url, token=TOKEN, rate=f"{RATE:g}/s")
        requests = [
            comment_request("acme", REPO, pull, f"note {n} on #{pull}", idempotency_key=f"{pull}-{n}")
            for n in range(PER_PULL)
            for pull in PULLS
        ]
        with engine.begin() as conn:
            enqueue_many(conn, requests)
        adapters = [GithubAdapter(aengine), GithubAdapter(aengine)]
        executors = [Executor(aengine, [adapter], listen=False) for adapter in adapters]
        running = [asyncio.create_task(executor.run()) for executor in executors]
        try:
            await until_async(lambda: asyncio.to_thread(ended, engine), 150, "every comment ended")
        finally:
            for executor in executors:
                executor.stop()
            await asyncio.gather(*running)
        with engine.connect() as conn:
            states = dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all())
        posted = github.posts_of("comment")
    finally:
        for adapter in adapters:
            await adapter.aclose()
        github.stop()
    assert states == {"DONE": len(PULLS) * PER_PULL}
    assert len(posted) == len(PULLS) * PER_PULL
    assert len({post.body for post in posted}) == len(posted)  # one each
    for pull in PULLS:  # one lane per pull request: in the order enqueued
        bodies = [post.body for post in posted if post.number == pull]
        assert bodies == [f"note {n} on #{pull}\n\n{marker(f'{pull}-{n}')}" for n in range(PER_PULL)]
    print(f"refused {github.limited} of {github.accepted} accepted ({github.limited / github.accepted:.1%})")
    assert github.limited <= 0.05 * github.accepted, github.limited
