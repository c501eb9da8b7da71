"""The example application's two notices: a workspace alert to the workspace's admins, and "verify your
address" to one account. Each finds its recipients anew before every attempt."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from outbox.email import Draft, EmailNotice, Recipient, register
from outbox.errors import InvalidRequest


def positive_id(event: dict[str, Any], name: str) -> int:
    value = event.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidRequest("event", f"needs a positive integer {name}, not {value!r}")
    return value


class WorkspaceAlert(EmailNotice):
    """An alert of a workspace, to its admins with a verified address who did not unsubscribe."""

    name = "workspace_alert"
    workspace_scoped = True
    recipients_query = text("""
        SELECT a.email AS address, a.display_name
          FROM app_alert AS alert
          JOIN app_membership AS m ON m.workspace_id = alert.workspace_id AND m.role = 'admin'
          JOIN app_account AS a ON a.id = m.account_id
         WHERE alert.id = :alert_id AND a.email IS NOT NULL AND a.email_verified
           AND NOT EXISTS (SELECT 1 FROM app_unsubscription AS u
                            WHERE u.account_id = a.id AND u.notice = 'workspace_alert')
         ORDER BY a.id
    """)

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        positive_id(event, "workspace_id")
        return {"alert_id": positive_id(event, "alert_id")}

    def compose(self, event: dict[str, Any], recipients: tuple[Recipient, ...]) -> Draft:
        return Draft(
            subject=f"Workspace alert {event['alert_id']}",
            text=f"An alert was raised in workspace {event['workspace_id']}. Open the workspace to read it.\n",
        )

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"workspace_alert:{event['alert_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"workspace:{event['workspace_id']}:email"


class VerifyAddress(EmailNotice):
    """Ask one account to verify its address; nobody once it is verified or gone."""

    name = "verify_address"
    workspace_scoped = False
    recipients_query = text("""
        SELECT email AS address, display_name FROM app_account
         WHERE id = :account_id AND email IS NOT NULL AND NOT email_verified
    """)

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"account_id": positive_id(event, "account_id")}

    def compose(self, event: dict[str, Any], recipients: tuple[Recipient, ...]) -> Draft:
        return Draft(
            subject="Verify your address",
            text="Open the link in your account settings to verify this address.\n",
        )

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"verify_address:{event['account_id']}:{event.get('request', 1)}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"account:{event['account_id']}:email"

    def subject_account_id(self, event: dict[str, Any]) -> int | None:
        return positive_id(event, "account_id")


WORKSPACE_ALERT = register(WorkspaceAlert())
VERIFY_ADDRESS = register(VerifyAddress())
