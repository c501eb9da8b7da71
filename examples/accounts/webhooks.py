"""The example application's webhook: each workspace alert, POSTed to the workspace's integration endpoint.

    enqueue_webhook(conn, ALERT_RAISED, {"workspace_id": w, "alert_id": a})
        ─▶ before every attempt: the alert's row as it is now (a deleted alert sends nothing)
        ─▶ {"type": "workspace.alert.raised", "timestamp": ..., "data": {"alert_id", "workspace_id", "title"}}
        ─▶ POST to the endpoint `alerts`, signed with OUTBOX_WEBHOOK_SECRET_ALERTS

The endpoint's URL is the application's configuration: ACCOUNTS_ALERTS_WEBHOOK_URL (the demo and the tests
point it at a local receiver).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import text

from examples.accounts.notices import positive_id
from outbox.webhook import WebhookEvent, register_endpoint, register_webhook_event

ALERTS_ENDPOINT = register_endpoint(
    "alerts", os.environ.get("ACCOUNTS_ALERTS_WEBHOOK_URL", "http://127.0.0.1:8080/outbox/alerts")
)


class AlertRaised(WebhookEvent):
    """A workspace alert, as the workspace's integration receives it."""

    name = "workspace.alert.raised"
    endpoint = "alerts"
    workspace_scoped = True
    query = text("SELECT id, workspace_id, title FROM app_alert WHERE id = :alert_id")

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        positive_id(event, "workspace_id")
        return {"alert_id": positive_id(event, "alert_id")}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        if not rows:
            return None  # the alert is gone: nothing to tell
        alert = rows[0]
        return {"alert_id": alert["id"], "workspace_id": alert["workspace_id"], "title": alert["title"]}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"alert_webhook:{event['alert_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"workspace:{event['workspace_id']}:webhook"


ALERT_RAISED = register_webhook_event(AlertRaised())
