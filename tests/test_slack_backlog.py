"""A rate-limited backlog: 1,000 Slack messages over 100 channels, two executors, a local Slack Web API that
allows one message a second per channel (a burst of 3) and a workspace-wide limit. None ends FAILED, every
message is posted once, and the refused calls (429) are at most 5 % of the accepted ones.

    enqueue_many ─▶ 1,000 actions, one lane per channel ─▶ two executors (each spaces a channel's messages)
        ─▶ chat.postMessage ─▶ the server's buckets: the channel's, then the workspace's ─▶ 429 or stored
"""

from __future__ import annotations

import asyncio
import os

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.slack_api import SlackApi
from outbox.executor import Executor
from outbox.intake import enqueue_many
from outbox.slack import SlackAdapter, register_workspace, slack_message
from outbox.slack import workspaces as workspace_registry
from tests.test_nats import until_async

TOKEN = "xoxb-1111-2222-localtesttoken"
CHANNELS = [f"C{n:010d}" for n in range(100)]
PER_CHANNEL = 10
# the workspace's limit: more than the channels' one a second each leaves room for, so both limits bite
WORKSPACE_RATE = 60.0


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_registry, "_WORKSPACES", {})
    for name in [name for name in os.environ if name.startswith("OUTBOX_SLACK_TOKEN_")]:
        monkeypatch.delenv(name)


async def test_a_rate_limited_backlog_of_1000_over_100_channels_drains_with_few_refusals(
    engine: Engine, aengine: AsyncEngine
) -> None:
    slack = SlackApi(
        tokens=[TOKEN], channels=CHANNELS, channel_rate=1.0, channel_burst=3.0, workspace_rate=WORKSPACE_RATE
    ).start()
    adapters: list[SlackAdapter] = []
    try:
        register_workspace("acme", token=TOKEN, base_url=slack.url)
        requests = [
            slack_message("acme", channel, f"message {n} to {channel}", idempotency_key=f"{channel}-{n}")
            for n in range(PER_CHANNEL)
            for channel in CHANNELS
        ]
        with engine.begin() as conn:
            enqueue_many(conn, requests)
        adapters = [SlackAdapter(aengine), SlackAdapter(aengine)]
        executors = [Executor(aengine, [adapter], listen=False) for adapter in adapters]
        running = [asyncio.create_task(executor.run()) for executor in executors]
        try:
            await until_async(lambda: ended(engine), 120, "every message ended")
        finally:
            for executor in executors:
                executor.stop()
            await asyncio.gather(*running)
        with engine.connect() as conn:
            states = dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all())
        posted = slack.posted()
    finally:
        for adapter in adapters:
            await adapter.aclose()
        slack.stop()
    assert states == {"DONE": len(CHANNELS) * PER_CHANNEL}
    assert len(posted) == len(CHANNELS) * PER_CHANNEL
    assert len({m["metadata"]["event_payload"]["key"] for m in posted}) == len(posted)  # one each
    for channel in CHANNELS:  # one lane per channel: in the order enqueued
        texts = [m["text"] for m in posted if m["channel"] == channel]
        assert texts == [f"message {n} to {channel}" for n in range(PER_CHANNEL)]
    print(f"refused {slack.refused} of {len(posted)} accepted ({slack.refused / len(posted):.1%})")
    assert slack.refused <= 0.05 * len(posted), slack.refused


async def ended(engine: Engine) -> bool:
    def count() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM agent_action WHERE state NOT IN ('DONE', 'FAILED', 'UNCERTAIN')")
                ).scalar_one()
            )

    return await asyncio.to_thread(count) == 0
