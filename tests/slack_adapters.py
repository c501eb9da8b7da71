"""The adapters `outbox run --adapters tests.slack_adapters:acme_adapters` loads in an executor process of a
test: the workspace `acme` at the local Slack Web API in OUTBOX_TEST_SLACK_URL, its token from the
environment (OUTBOX_SLACK_TOKEN_ACME), as an application's module registers its workspaces."""

from __future__ import annotations

import os

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import ActionAdapter
from outbox.slack import register_workspace, slack_adapters


def acme_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    register_workspace("acme", base_url=os.environ["OUTBOX_TEST_SLACK_URL"], channel_rate="1000/s")
    return slack_adapters(engine)
