"""The enqueue examples of docs/slack.md and docs/github.md run as written, and what they enqueue arrives.

Each page's block marked `<!-- slack example: ... -->` or `<!-- github example: ... -->` runs against the test's
database, with its workspace or account registered at the local API (demo/slack_api.py, demo/github_api.py)
holding the channel, thread, pull request and repositories it names; the executor drains through the kind's own
adapter, and the server's store holds each post once, where the example says. (docs/gitlab.md's example runs
in tests/test_gitlab.py.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.github_api import GithubApi
from demo.slack_api import SlackApi
from outbox._internal.config.credentials import Sources
from outbox.github import GithubAdapter, marker, register_account
from outbox.github import accounts as account_registry
from outbox.slack import SlackAdapter, message_marker, register_workspace
from outbox.slack import workspaces as workspace_registry
from outbox.testing import drain

ROOT = Path(__file__).resolve().parent.parent
SLACK_TOKEN = "xoxb-" + "7" * 24
GITHUB_TOKEN = "ghp_" + "b2" * 18


def page_example(page: str, name: str) -> str:
    """The Python block under `<!-- NAME example: evaluated by tests/test_post_examples.py -->` in docs/PAGE."""
    pattern = rf"<!-- {name} example: evaluated by tests/test_post_examples.py -->\n```python\n(.*?)```"
    found = re.search(pattern, (ROOT / "docs" / page).read_text(), re.S)
    assert found is not None, f"docs/{page} has no {name} example marked for this test"
    return found.group(1)


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers its own workspace or account; their tokens come from the environment, as the
    pages' set-up says."""
    monkeypatch.setattr(workspace_registry, "_WORKSPACES", {})
    monkeypatch.setattr(workspace_registry, "_SOURCES", Sources("token"))
    monkeypatch.setattr(account_registry, "_ACCOUNTS", {})
    monkeypatch.setattr(account_registry, "_SOURCES", Sources("secret"))
    for name in [name for name in os.environ if name.startswith(("OUTBOX_SLACK_", "OUTBOX_GITHUB_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OUTBOX_SLACK_TOKEN_ACME", SLACK_TOKEN)
    monkeypatch.setenv("OUTBOX_GITHUB_TOKEN_ACME", GITHUB_TOKEN)


@pytest.fixture
def slack() -> Iterator[SlackApi]:
    # the channel the example posts to, holding the message whose thread it replies in
    parent = {"type": "message", "text": "Order 42", "ts": "1700000000.000100", "channel": "C0123ABCD"}
    server = SlackApi(tokens=[SLACK_TOKEN], channels=["C0123ABCD"], messages={"C0123ABCD": [parent]}).start()
    yield server
    server.stop()


@pytest.fixture
def github() -> Iterator[GithubApi]:
    server = GithubApi(tokens=[GITHUB_TOKEN])
    server.add_repo("acme/web", pulls=[42])
    server.add_repo("acme/feedback")
    yield server.start()
    server.stop()


async def test_the_slack_pages_example_posts_its_reply_in_the_thread(
    engine: Engine, aengine: AsyncEngine, slack: SlackApi
) -> None:
    register_workspace("acme", base_url=slack.url)
    exec(compile(page_example("slack.md", "slack"), "docs/slack.md", "exec"), {"engine": engine})
    adapter = SlackAdapter(aengine)
    try:
        await drain(aengine, [adapter])
    finally:
        await adapter.aclose()
    with engine.connect() as conn:
        state, ref = conn.execute(text("SELECT state, readback_ref FROM agent_action")).one()
    [reply] = [m for m in slack.posted() if m.get("thread_ts") == "1700000000.000100"]
    assert (state, ref) == ("DONE", f"channel=C0123ABCD ts={reply['ts']}")
    assert reply["text"] == "Order 42 shipped"
    assert reply["blocks"] == [{"type": "section", "text": {"type": "mrkdwn", "text": "*Order 42* shipped"}}]
    assert reply["metadata"]["event_payload"]["key"] == message_marker("order-shipped:42")
    assert len(slack.posted()) == 2  # the thread's message and the reply, nothing else


async def test_the_github_pages_example_comments_on_the_pull_request_and_opens_the_issue(
    engine: Engine, aengine: AsyncEngine, github: GithubApi
) -> None:
    register_account("acme", url=github.url, rate=None)  # no pace of its own: drain() keeps a configured one
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE build (id int PRIMARY KEY, state text)"))
        conn.execute(text("INSERT INTO build VALUES (881, 'running')"))
    exec(compile(page_example("github.md", "github"), "docs/github.md", "exec"), {"engine": engine})
    adapter = GithubAdapter(aengine)
    try:
        await drain(aengine, [adapter])
    finally:
        await adapter.aclose()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM build")).scalar_one() == "passed"
        done = dict(
            conn.execute(text("SELECT idempotency_key, readback_ref FROM agent_action WHERE state = 'DONE'")).all()
        )
    [comment] = github.posts_of("comment")
    [issue] = github.posts_of("issue")
    assert (comment.repo, comment.number) == ("acme/web", 42)
    assert comment.body == f"Build 881 passed: 1,204 tests, coverage 91 %.\n\n{marker('build-summary:881')}"
    assert issue.repo == "acme/feedback" and issue.body.endswith(marker("feedback:export-slow:2026-w49"))
    target = github.repos["acme/feedback"].targets[issue.number]
    assert (target.title, target.labels) == ("Export is slow", ["feedback", "performance"])
    assert done == {"build-summary:881": comment.html_url, "feedback:export-slow:2026-w49": issue.html_url}
