"""The demo application's posts to Slack, GitHub and GitLab, made through the local APIs the demo starts.

    Stack.start ─▶ the local Slack, GitHub and GitLab APIs (demo.slack_api, demo.github_api, demo.gitlab_api)
                   ─ their URLs (DEMO_*_URL) and the demo's own tokens, made afresh for each run and never
                   printed (OUTBOX_SLACK_TOKEN_ACME, ...), in the environment of every process it starts
    register(urls) ─▶ the Slack workspace `acme`, the GitHub account `acme`, the GitLab host `main`: in the demo's
                   process to enqueue, and in each drain run (adapters, the URLs from its environment)
    raise_alert ── one application transaction: an alert's row, and what it tells ──▶ a Slack message in the
                   alerts channel, a summary comment on the pull request acme/web#42, a product-feedback issue
                   in acme/feedback, a note on the merge request acme/shop!12
    resolve_alert ─ once the message is DONE, its ts read from its action (as `outbox show` reads it) ─▶ a second
                   transaction: the alert's row resolved, and a reply in the message's thread (thread_ts)

A reply needs the ts Slack gave its thread's first message, which exists only once that message is posted: so
an application replies from a later transaction, as this one does when its alert is resolved.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.action import Action
from outbox.executor import ActionAdapter
from outbox.github import enqueue_comment, enqueue_issue, github_adapters, register_account
from outbox.gitlab import enqueue_note, gitlab_adapters, register_host
from outbox.slack import enqueue_slack_message, register_workspace, slack_adapters
from outbox.states import ActionState

# the names the application registers, and where its posts go
WORKSPACE = "acme"
CHANNEL = "C0ALERTS01"
ACCOUNT = "acme"
PULL_REPO, PULL = "acme/web", 42
FEEDBACK_REPO = "acme/feedback"
HOST = "main"
PROJECT, MERGE_REQUEST = "acme/shop", 12
# the drain runs' adapters (OUTBOX_ADAPTERS)
ADAPTERS = "demo.posts:adapters"
# the environment variables that carry the local APIs' URLs to the drain runs
URL_VARIABLES = ("DEMO_SLACK_API_URL", "DEMO_GITHUB_API_URL", "DEMO_GITLAB_URL")
_SLACK_REF = re.compile(r"channel=(?P<channel>\S+) ts=(?P<ts>\d+\.\d+)")


@dataclass(frozen=True)
class Urls:
    slack: str
    github: str
    gitlab: str

    def environment(self) -> dict[str, str]:
        return dict(zip(URL_VARIABLES, (self.slack, self.github, self.gitlab), strict=True))

    @classmethod
    def of(cls, environment: Mapping[str, str]) -> Urls:
        return cls(*(environment[name] for name in URL_VARIABLES))


@dataclass(frozen=True)
class Posts:
    """The actions of one alert's posts (their ids), the reply's once it is enqueued."""

    alert: int
    message: int
    comment: int
    issue: int
    note: int
    reply: int | None = None


def register(urls: Urls) -> None:
    """The workspace, the account and the host, at the local APIs; each token from its environment variable."""
    register_workspace(WORKSPACE, base_url=urls.slack)
    register_account(ACCOUNT, url=urls.github)
    register_host(HOST, urls.gitlab)


def adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`examples.accounts:all_adapters` and the SLACK_MESSAGE, GITHUB_POST and GITLAB_POST adapters, the
    workspace, account and host registered at the URLs of this process's environment."""
    from examples.accounts import all_adapters

    register(Urls.of(os.environ))
    return [*all_adapters(engine), *slack_adapters(engine), *github_adapters(engine), *gitlab_adapters(engine)]


def raise_alert(engine: Engine, workspace: int, title: str, details: str) -> Posts:
    """The alert's row and its four posts, in one transaction."""
    with engine.begin() as conn:
        alert = int(
            conn.execute(
                text(
                    "INSERT INTO app_alert SELECT coalesce(max(id), 0) + 1, :workspace, :title, :details FROM app_alert"
                    " RETURNING id"
                ),
                {"workspace": workspace, "title": title, "details": details},
            ).scalar_one()
        )
        key = f"alert:{alert}"
        message = enqueue_slack_message(
            conn, WORKSPACE, CHANNEL, f"Alert {alert}: {title}", idempotency_key=f"{key}:slack", workspace_id=workspace
        )
        comment = enqueue_comment(
            conn,
            ACCOUNT,
            PULL_REPO,
            PULL,
            f"**Alert {alert}** after this change: {details}",
            idempotency_key=f"{key}:pr",
        )
        issue = enqueue_issue(
            conn, ACCOUNT, FEEDBACK_REPO, title, details, labels=["feedback"], idempotency_key=f"{key}:feedback"
        )
        note = enqueue_note(
            conn,
            HOST,
            PROJECT,
            f"**Alert {alert}**: {details}",
            merge_request=MERGE_REQUEST,
            idempotency_key=f"{key}:mr",
        )
    return Posts(alert, message.id, comment.id, issue.id, note.id)


def resolve_alert(engine: Engine, posts: Posts, thread: str, resolution: str) -> Posts:
    """The alert resolved, and in the same transaction a reply in the thread of its message (`thread`: the
    message's ts, slack_ts)."""
    with engine.begin() as conn:
        workspace = conn.execute(
            text("UPDATE app_alert SET body = body || ' Resolved.' WHERE id = :id RETURNING workspace_id"),
            {"id": posts.alert},
        ).scalar_one()
        reply = enqueue_slack_message(
            conn,
            WORKSPACE,
            CHANNEL,
            resolution,
            thread_ts=thread,
            idempotency_key=f"alert:{posts.alert}:slack:resolved",
            workspace_id=workspace,
        )
    return replace(posts, reply=reply.id)


def slack_ts(message: Action) -> str | None:
    """The ts Slack gave a DONE message, from its readback reference (`channel=C... ts=...`, as `outbox show`
    prints it); None for a message not posted."""
    found = _SLACK_REF.match(message.readback_ref or "") if message.state is ActionState.DONE else None
    return found["ts"] if found else None
