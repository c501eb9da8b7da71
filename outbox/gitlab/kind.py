"""The GITLAB_POST kind: its declaration, registered when `outbox` is imported (this module imports nothing
more than the kinds' registry, so it loads no GitLab client).

    import outbox ──▶ outbox.gitlab.kind ──ActionKind.register("GITLAB_POST", ...)──▶ ActionKind.GITLAB_POST

A GITLAB_POST is one post on GitLab: a note on a merge request or an issue, a review (diff discussions on a
merge request), or a new issue. It is not at most once: GitLab takes no idempotency key, so every post carries
the action's key in a hidden marker, and an attempt after one whose answer was lost lists the target's notes,
discussions or issues for it before it posts again. It may run at instance level or in a workspace.
Migration 0023 writes the same declaration as GITLAB_POST's row of `agent_action_kind`. An action's
destination is its GitLab host, `gitlab:<host>`.
"""

from __future__ import annotations

from outbox.kinds import ActionKind

GITLAB_POST = ActionKind.register(
    "GITLAB_POST",
    at_most_once=False,
    instance_level=True,
    payload_check="outbox.gitlab.posts:check_payload",
    destination="gitlab",
)
ActionKind.GITLAB_POST = GITLAB_POST
