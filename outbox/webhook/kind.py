"""The WEBHOOK kind: its declaration, registered when `outbox` is imported (this module imports nothing more
than the kinds' registry, so it loads no HTTP client).

    import outbox ──▶ outbox.webhook.kind ──ActionKind.register("WEBHOOK", ...)──▶ ActionKind.WEBHOOK

WEBHOOK is not at most once: every attempt of an action sends the same `webhook-id`, and a receiver that
deduplicates by it, as the Standard Webhooks specification asks, keeps one effect however often it is
sent. It may run at instance level or in a workspace: each webhook event decides. Its retries wait the
schedule webhook senders use: immediately, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h (eight
attempts in about 28 hours). Migration 0011 writes the same declaration as WEBHOOK's row of
`agent_action_kind`. An action's destination is its event's endpoint, `webhook:<endpoint>` (the payload
check returns it); `webhook` alone holds the actions enqueued before destinations existed.
"""

from __future__ import annotations

from outbox.kinds import ActionKind

# the waits after the first, second, ... attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h
RETRY_SCHEDULE = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)

WEBHOOK = ActionKind.register(
    "WEBHOOK",
    at_most_once=False,
    instance_level=True,
    payload_check="outbox.webhook.events:check_payload",
    retry_schedule=RETRY_SCHEDULE,
    destination="webhook",
)
ActionKind.WEBHOOK = WEBHOOK
