"""The GITHUB_POST kind: its declaration, registered when `outbox` is imported (this module imports nothing
more than the kinds' registry, so it loads no GitHub client).

    import outbox ──▶ outbox.github.kind ──ActionKind.register("GITHUB_POST", ...)──▶ ActionKind.GITHUB_POST

A GITHUB_POST is one post on GitHub: a comment on a pull request or an issue, a review with inline comments,
or a new issue. It is not at most once: GitHub takes no idempotency key, so every post carries the action's
key in a hidden marker, and an attempt after one whose answer was lost lists the target's posts for it before
it posts again. It may run at instance level or in a workspace. Migration 0023 writes the same declaration as
GITHUB_POST's row of `agent_action_kind`. An action's destination is its GitHub account, `github:<account>`.
"""

from __future__ import annotations

from outbox.kinds import ActionKind

GITHUB_POST = ActionKind.register(
    "GITHUB_POST",
    at_most_once=False,
    instance_level=True,
    payload_check="outbox.github.posts:check_payload",
    destination="github",
)
ActionKind.GITHUB_POST = GITHUB_POST
