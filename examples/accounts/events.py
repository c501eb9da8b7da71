"""The example application's domain event: each workspace alert, published to NATS JetStream.

    enqueue_event(conn, ALERT_EVENT, {"workspace_id": w, "alert_id": a})
        ─▶ before every attempt: the alert's row as it is now (a deleted alert publishes nothing)
        ─▶ subject accounts.alerts.<event id>, header Nats-Msg-Id <event id>
        ─▶ {"type": "workspace.alert.raised", "id": ..., "time": ..., "data": {"alert_id", "workspace_id", "title"}}

The stream is the application's: `outbox nats ensure-stream --stream ACCOUNTS --subject 'accounts.>'`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import text

from examples.accounts.notices import positive_id
from outbox.nats import NatsEvent, register_nats_event

# the stream that holds the application's events, and the subjects it takes
STREAM = "ACCOUNTS"
STREAM_SUBJECTS = ("accounts.>",)


class AlertEvent(NatsEvent):
    """A workspace alert, as the application's other services consume it."""

    name = "workspace.alert.raised"
    workspace_scoped = True
    query = text("SELECT id, workspace_id, title FROM app_alert WHERE id = :alert_id")

    def subject(self, event: dict[str, Any]) -> str:
        return "accounts.alerts"

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        positive_id(event, "workspace_id")
        return {"alert_id": positive_id(event, "alert_id")}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        if not rows:
            return None
        alert = rows[0]
        return {"alert_id": alert["id"], "workspace_id": alert["workspace_id"], "title": alert["title"]}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"alert_event:{event['alert_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"workspace:{event['workspace_id']}:event"


ALERT_EVENT = register_nats_event(AlertEvent())
