"""An application's GitLab set-up for executor processes the tests start: `outbox run --adapters
tests.gitlab_app:adapters` registers the host `main` at OUTBOX_TEST_GITLAB_URL (its token from
OUTBOX_GITLAB_TOKEN_MAIN, as a deployment gives it) and runs the GITLAB_POST adapter."""

from __future__ import annotations

import os

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import ActionAdapter
from outbox.gitlab import gitlab_adapters, register_host

register_host("main", os.environ["OUTBOX_TEST_GITLAB_URL"], rate=None)


def adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    return gitlab_adapters(engine)
