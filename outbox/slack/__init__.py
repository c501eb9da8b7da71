"""Slack: the SLACK_MESSAGE kind, a message posted to a channel or as a reply in a thread.

An application registers its workspaces (`register_workspace`) and enqueues with `enqueue_slack_message`;
executors run `slack_adapters(engine)` (`outbox run --adapters outbox.slack:slack_adapters`, from a module
that registers them first).

    import outbox ──▶ outbox.slack.kind (SLACK_MESSAGE's declaration; nothing else of this package)
    outbox.slack.<name> ──first use──▶ its module: the workspaces (outbox.slack.workspaces), the message and
                                       its check (outbox.slack.messages), the read-back (outbox.slack.readback),
                                       the adapter and slack_sdk (outbox.slack.adapter)

Each name loads its module on first use, so registering SLACK_MESSAGE at `import outbox` loads no Slack client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox.slack.adapter import SlackAdapter, classify, slack_adapters
    from outbox.slack.messages import (
        TEXT_LIMIT,
        check_payload,
        enqueue_slack_message,
        enqueue_slack_message_async,
        slack_message,
    )
    from outbox.slack.readback import message_marker
    from outbox.slack.workspaces import (
        SlackTokenError,
        SlackWorkspace,
        UnknownWorkspace,
        add_token_source,
        register_workspace,
        workspace_named,
    )

# no name here may be a module of this package too (the module would replace the name once imported)
_HOMES = {
    "SlackAdapter": "outbox.slack.adapter",
    "SlackTokenError": "outbox.slack.workspaces",
    "SlackWorkspace": "outbox.slack.workspaces",
    "TEXT_LIMIT": "outbox.slack.messages",
    "UnknownWorkspace": "outbox.slack.workspaces",
    "add_token_source": "outbox.slack.workspaces",
    "check_payload": "outbox.slack.messages",
    "classify": "outbox.slack.adapter",
    "enqueue_slack_message": "outbox.slack.messages",
    "enqueue_slack_message_async": "outbox.slack.messages",
    "message_marker": "outbox.slack.readback",
    "register_workspace": "outbox.slack.workspaces",
    "slack_adapters": "outbox.slack.adapter",
    "slack_message": "outbox.slack.messages",
    "workspace_named": "outbox.slack.workspaces",
}

__all__ = [
    "TEXT_LIMIT",
    "SlackAdapter",
    "SlackTokenError",
    "SlackWorkspace",
    "UnknownWorkspace",
    "add_token_source",
    "check_payload",
    "classify",
    "enqueue_slack_message",
    "enqueue_slack_message_async",
    "message_marker",
    "register_workspace",
    "slack_adapters",
    "slack_message",
    "workspace_named",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
