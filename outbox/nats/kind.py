"""The NATS_EVENT kind: its declaration, registered when `outbox` is imported (this module imports nothing
more than the kinds' registry, so it loads no NATS client).

    import outbox ──▶ outbox.nats.kind ──ActionKind.register("NATS_EVENT", ...)──▶ ActionKind.NATS_EVENT

NATS_EVENT is not at most once: JetStream drops a second publish of one `Nats-Msg-Id` inside the stream's
duplicate window, and past it the adapter finds an earlier publish in the stream by the event's own
subject before it publishes again. It may run at instance level or in a workspace: each event decides.
Its retries wait the executor's exponential backoff. Migration 0011 writes the same declaration as
NATS_EVENT's row of `agent_action_kind`.
"""

from __future__ import annotations

from outbox.kinds import ActionKind

NATS_EVENT = ActionKind.register(
    "NATS_EVENT",
    at_most_once=False,
    instance_level=True,
    payload_check="outbox.nats.events:check_payload",
    destination="nats",
)
ActionKind.NATS_EVENT = NATS_EVENT
