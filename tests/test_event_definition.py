"""What the three kinds' definitions share (outbox.event_definition), against the real PostgreSQL.

    a notice, a webhook event, a NATS event ──request──▶ ActionRequest ──outbox.enqueue──▶ agent_action
    an event type without a query ──rows──▶ no rows, its params still checking the event

The kinds' own tests drive each kind end to end; these cover what the base does for all three: the request
each kind's class makes (its kind, its payload's key, its default attempts) and an event type without a query.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, text

import outbox
import outbox.email.notice as notice_registry
import outbox.nats.events as nats_registry
import outbox.webhook.endpoints as endpoint_registry
import outbox.webhook.events as webhook_registry
from outbox._internal.config.credentials import Sources
from outbox.email import Draft, EmailNotice, Recipient
from outbox.errors import InvalidRequest
from outbox.event_definition import EventDefinition
from outbox.nats import NatsEvent, enqueue_event
from outbox.webhook import WebhookEvent, register_endpoint, register_webhook_event


def account_id(event: dict[str, Any]) -> int:
    value = event.get("account_id")
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest("event", f"account_id must be an integer, not {value!r}")
    return value


class Welcome(EmailNotice):
    name = "welcome"
    workspace_scoped = True
    recipients_query = text("SELECT 'a@example.com' AS address, 'A' AS display_name WHERE :account_id > 0")

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"account_id": account_id(event)}

    def compose(self, event: dict[str, Any], recipients: tuple[Recipient, ...]) -> Draft:
        return Draft(subject="Welcome", text="Hello\n")

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"email:welcome:{event['account_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"account:{event['account_id']}"

    def subject_account_id(self, event: dict[str, Any]) -> int | None:
        return int(event["account_id"])


class AccountOpened(WebhookEvent):
    """No query: the data is the event's own."""

    name = "account.opened"
    endpoint = "crm"
    workspace_scoped = True

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"account_id": account_id(event)}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        return {"account_id": event["account_id"], "rows": len(rows)}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"webhook:account.opened:{event['account_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"account:{event['account_id']}"


class AccountNoted(NatsEvent):
    """No query, as AccountOpened; compose would fail on an event params refuses."""

    name = "account.noted"
    workspace_scoped = False

    def subject(self, event: dict[str, Any]) -> str:
        return "accounts.noted"

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"account_id": account_id(event)}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        return {"account_id": event["account_id"] + 0, "rows": len(rows)}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"nats:account.noted:{event['account_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"account:{event['account_id']}"


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[EmailNotice, WebhookEvent, NatsEvent]]:
    monkeypatch.setattr(notice_registry, "_NOTICES", {})
    monkeypatch.setattr(webhook_registry, "_EVENTS", {})
    monkeypatch.setattr(nats_registry, "_EVENTS", {})
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(endpoint_registry, "_SOURCES", Sources("secret"))
    register_endpoint("crm", "http://127.0.0.1:9/hooks", secret="whsec_" + base64.b64encode(b"k" * 32).decode())
    yield (
        notice_registry.register(Welcome()),
        register_webhook_event(AccountOpened()),
        nats_registry.register_nats_event(AccountNoted()),
    )


def test_each_kind_makes_its_own_request_from_the_shared_methods(
    engine: Engine, registered: tuple[EmailNotice, WebhookEvent, NatsEvent]
) -> None:
    welcome, opened, noted = registered
    event = {"account_id": 7, "workspace_id": 3}
    expected: list[tuple[EventDefinition, str, str, int, int | None, int | None]] = [
        (welcome, "EMAIL", "notice", 5, 3, 7),
        (opened, "WEBHOOK", "event_type", 8, 3, None),
        (noted, "NATS_EVENT", "event_type", 5, None, None),
    ]
    for definition, kind, name_key, attempts, workspace_id, account in expected:
        request = definition.request(event)
        made = (request.kind, request.payload, request.max_attempts, request.workspace_id, request.subject_account_id)
        assert made == (
            outbox.ActionKind.get(kind),
            {name_key: definition.name, "event": event},
            attempts,
            workspace_id,
            account,
        ), definition.name
        assert (request.lane_key, request.idempotency_key) == (
            definition.lane_key(event),
            definition.idempotency_key(event),
        )
        with engine.begin() as conn:  # the kind's own payload check takes what the base wrote
            action = outbox.enqueue(conn, definition.request(event, max_attempts=2))
        assert (action.kind, action.max_attempts, action.payload) == (kind, 2, request.payload)
    assert opened.request(event, 3).max_attempts == 3  # the webhook's takes max_attempts by position too


def test_an_event_type_without_a_query_reads_no_rows_and_still_checks_the_event(
    engine: Engine, registered: tuple[EmailNotice, WebhookEvent, NatsEvent]
) -> None:
    _, opened, noted = registered
    with engine.begin() as conn:
        assert opened.rows(conn, {"account_id": 1}) == [] == noted.rows(conn, {"account_id": 1})
        for definition in (opened, noted):
            with pytest.raises(InvalidRequest, match="event: account_id must be an integer, not '1'"):
                definition.rows(conn, {"account_id": "1"})
        # at enqueue, params refuses the event before compose reads it
        with pytest.raises(InvalidRequest, match="account_id must be an integer"):
            enqueue_event(conn, noted, {"account_id": "1"})
        action = enqueue_event(conn, noted, {"account_id": 1})
    with engine.connect() as conn:
        held = conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one()
    assert (action.payload, held) == ({"event_type": "account.noted", "event": {"account_id": 1}}, 1)
