"""The SLACK_MESSAGE kind: its declaration, registered when `outbox` is imported (this module imports nothing
more than the kinds' registry, so it loads no Slack client).

    import outbox ──▶ outbox.slack.kind ──ActionKind.register("SLACK_MESSAGE", ...)──▶ ActionKind.SLACK_MESSAGE

SLACK_MESSAGE is not at most once: Slack takes no idempotency key, so every message carries the action's key
in its metadata, and an attempt after one whose answer was lost reads the channel (or the thread) back for it
before it posts again. It may run at instance level or in a workspace. Migration 0023 writes the same
declaration as SLACK_MESSAGE's row of `agent_action_kind`. An action's destination is its Slack workspace,
`slack:<workspace>`.
"""

from __future__ import annotations

from outbox.kinds import ActionKind

SLACK_MESSAGE = ActionKind.register(
    "SLACK_MESSAGE",
    at_most_once=False,
    instance_level=True,
    payload_check="outbox.slack.messages:check_payload",
    destination="slack",
)
ActionKind.SLACK_MESSAGE = SLACK_MESSAGE
