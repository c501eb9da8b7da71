"""The demo's local Slack, GitHub and GitLab APIs: the providers the demo application's posts (demo.posts) reach.

    LocalApis.start(folder) ─▶ a token for each, made afresh (never printed)
                            ─▶ SlackApi: the channel demo.posts.CHANNEL, the bot a member
                            ─▶ GithubApi: the pull request acme/web#42, the repository acme/feedback
                            ─▶ GitlabApi: the project acme/shop and its merge request !12
                            each a thread of this process on a free 127.0.0.1 port, answering as the provider's
                            API documents, and keeping a journal in `folder` (slack.json: every message by
                            channel; github.jsonl and gitlab.jsonl: a line per post stored)
    environment() ─▶ their URLs (demo.posts.URL_VARIABLES) and tokens (OUTBOX_SLACK_TOKEN_ACME, ...) for the
                     processes the stack starts

The stores themselves (`slack.posted()`, `github.posts_of(...)`, `gitlab.notes(...)`) are what the summary reads.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path

from demo import posts
from demo.github_api import GithubApi
from demo.gitlab_api import GitlabApi
from demo.slack_api import SlackApi
from outbox.github.accounts import GithubAccount
from outbox.gitlab.hosts import token_variable as gitlab_token_variable
from outbox.slack.workspaces import token_variable as slack_token_variable

JOURNALS = {"slack": "slack.json", "github": "github.jsonl", "gitlab": "gitlab.jsonl"}


def _random(length: int) -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(length))


@dataclass
class LocalApis:
    slack_token: str = field(default_factory=lambda: "xoxb-" + _random(40), repr=False)
    github_token: str = field(default_factory=lambda: "ghp_" + _random(36), repr=False)
    gitlab_token: str = field(default_factory=lambda: "glpat-" + _random(20), repr=False)
    slack: SlackApi | None = None
    github: GithubApi | None = None
    gitlab: GitlabApi | None = None

    def start(self, folder: Path) -> None:
        for name in JOURNALS.values():  # each run's journals start empty, as its servers do
            (folder / name).unlink(missing_ok=True)
        self.slack = SlackApi(
            tokens=[self.slack_token], channels=[posts.CHANNEL], journal=folder / JOURNALS["slack"]
        ).start()
        self.github = GithubApi(tokens=[self.github_token], journal=folder / JOURNALS["github"])
        self.github.add_repo(posts.PULL_REPO, pulls=[posts.PULL])
        self.github.add_repo(posts.FEEDBACK_REPO)
        self.github.start()
        self.gitlab = GitlabApi([self.gitlab_token], journal=folder / JOURNALS["gitlab"])
        self.gitlab.add_project(posts.PROJECT, merge_requests=[posts.MERGE_REQUEST], issues=[])
        self.gitlab.start()

    def urls(self) -> posts.Urls:
        assert self.slack is not None and self.github is not None and self.gitlab is not None
        return posts.Urls(self.slack.url, self.github.url, self.gitlab.url)

    def environment(self) -> dict[str, str]:
        return {
            **self.urls().environment(),
            slack_token_variable(posts.WORKSPACE): self.slack_token,
            GithubAccount(posts.ACCOUNT).secret_variable: self.github_token,
            gitlab_token_variable(posts.HOST): self.gitlab_token,
        }

    def stop(self) -> None:
        for server in (self.slack, self.github, self.gitlab):
            if server is not None:
                server.stop()
