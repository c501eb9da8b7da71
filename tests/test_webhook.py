"""The WEBHOOK kind against real HTTP receivers (demo/receiver.py) and the real database.

Each test registers the `billing` endpoint at a receiver of its own and the `invoice.paid` event (a fresh
registry per test), enqueues through `enqueue_webhook`, attempts once or drains, and asserts the action's
row (state, stop reason, attempts, due_at, last_error, readback_ref, trace) and exactly what the receiver
kept: one effect per webhook-id, whatever the network did in between.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks import Webhook, WebhookVerificationError

import outbox
from demo.receiver import Receiver
from outbox import InvalidRequest
from outbox._internal.config.credentials import Sources
from outbox.executor import ActionAdapter, Executor
from outbox.nats.message import message_body
from outbox.testing import drain
from outbox.webhook import (
    BODY_LIMIT,
    WebhookAdapter,
    WebhookEvent,
    WebhookSecretError,
    add_secret_source,
    enqueue_webhook,
    enqueue_webhook_async,
    event_named,
    register_endpoint,
    register_webhook_event,
    webhook_adapters,
    webhook_id,
)
from outbox.webhook import endpoints as endpoint_registry
from outbox.webhook import events as event_registry
from outbox.webhook.adapter import receiver_id, retry_after_seconds
from outbox.webhook.endpoints import check_url, endpoint_secrets
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()
THIRD_SECRET = "whsec_" + base64.b64encode(b"t" * 32).decode()
KEY = "invoice.paid:7"
MSG_ID = webhook_id(KEY)
INVOICE = {"invoice_id": 7}
TABLES = """
CREATE TABLE shop_invoice (id bigint PRIMARY KEY, amount_cents bigint NOT NULL, status text NOT NULL,
                           note text NOT NULL DEFAULT '');
INSERT INTO shop_invoice VALUES (7, 1200, 'paid');
"""


class InvoicePaid(WebhookEvent):
    name = "invoice.paid"
    endpoint = "billing"
    workspace_scoped = False
    query = text("SELECT amount_cents, status, note FROM shop_invoice WHERE id = :invoice_id")

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        invoice_id = event.get("invoice_id")
        if not isinstance(invoice_id, int) or isinstance(invoice_id, bool):
            raise InvalidRequest("invoice_id", "must be an integer")
        return {"invoice_id": invoice_id}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        if not rows or rows[0]["status"] != "paid":
            return None
        note = rows[0]["note"]
        if note == "raise":  # the test's way to make compose fail, with data in the exception's message
            raise RuntimeError("customer ann@example.com owes 1200")
        if note == "not json":
            return {"tags": {"a", "b"}}
        return {"invoice_id": event["invoice_id"], "amount_cents": rows[0]["amount_cents"], "note": note}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"invoice.paid:{event['invoice_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"invoice:{event['invoice_id']}"


INVOICE_PAID = InvoicePaid()


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers its own endpoints, events and secret sources."""
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(endpoint_registry, "_SOURCES", Sources("secret"))
    monkeypatch.setattr(event_registry, "_EVENTS", {})
    for name in [name for name in os.environ if name.startswith("OUTBOX_WEBHOOK_SECRET_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(SECRET).start()
    yield server
    server.stop()


@pytest.fixture
def billing(receiver: Receiver) -> Receiver:
    """`billing` registered at `receiver`, and the invoice.paid event."""
    register_endpoint("billing", receiver.url, secret=SECRET)
    register_webhook_event(INVOICE_PAID)
    return receiver


@pytest.fixture
def app(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text(TABLES))
    return engine


@pytest_asyncio.fixture(loop_scope="function")
async def adapters(aengine: AsyncEngine) -> AsyncIterator[Callable[..., WebhookAdapter]]:
    """`make(request_seconds=2)`: an adapter on the test's database, closed after the test."""
    made: list[WebhookAdapter] = []

    def make(request_seconds: float = 2.0) -> WebhookAdapter:
        made.append(WebhookAdapter(aengine, request_seconds=request_seconds))
        return made[-1]

    yield make
    for adapter in made:
        await adapter.aclose()


def enqueue(app: Engine, *, max_attempts: int = 8) -> int:
    with app.begin() as conn:
        return enqueue_webhook(conn, INVOICE_PAID, INVOICE, max_attempts=max_attempts).id


def row(app: Engine, action_id: int) -> dict[str, Any]:
    with app.connect() as conn:
        found = conn.execute(
            text(
                "SELECT state, stop_reason, attempt, last_error, readback_ref, trace, write_started_at,"
                " extract(epoch FROM due_at - now()) AS due_in FROM agent_action WHERE id = :id"
            ),
            {"id": action_id},
        )
        return dict(found.mappings().one())


async def attempt_once(aengine: AsyncEngine, adapter: WebhookAdapter) -> None:
    await Executor(aengine, [adapter], listen=False).run(until_idle=True)


# -- delivered


async def test_a_2xx_is_done_with_the_webhook_id_and_the_receivers_id(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    action_id = enqueue(app)
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["stop_reason"], found["attempt"]) == ("DONE", "CONFIRMED", 1)
    assert found["readback_ref"] == f"200 webhook-id={MSG_ID} receiver-id=rcv_1"
    assert found["trace"] == {"event_type": "invoice.paid", "endpoint": "billing", "webhook_id": MSG_ID}
    [seen] = billing.seen
    assert seen.path == "/hooks?token=query-secret"
    assert seen.headers["webhook-id"] == MSG_ID and MSG_ID.startswith("msg_")
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["user-agent"] == "outbox-webhook/0.1.0"
    sent = json.loads(seen.body)
    assert sent["type"] == "invoice.paid"
    assert sent["data"] == {"invoice_id": 7, "amount_cents": 1200, "note": ""}
    stamped = datetime.strptime(sent["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert abs(stamped.timestamp() - int(seen.headers["webhook-timestamp"])) < 1
    assert seen.body == json.dumps(sent, separators=(",", ":"), ensure_ascii=False).encode()  # compact
    assert billing.deliveries() == {MSG_ID: 1}


async def test_the_data_is_composed_from_the_database_at_the_attempt(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    enqueue(app)
    with app.begin() as conn:
        conn.execute(text("UPDATE shop_invoice SET amount_cents = 1500"))
    await attempt_once(aengine, adapters())
    assert json.loads(billing.effects[MSG_ID].body)["data"]["amount_cents"] == 1500


class InvoiceFigures(WebhookEvent):
    """The row values PostgreSQL gives that JSON has no form for: a numeric, a timestamptz, a date, a uuid."""

    name = "invoice.figures"
    endpoint = "billing"
    workspace_scoped = False
    query = text(
        "SELECT 19.90::numeric AS amount, 0.1::numeric(20, 10) AS rate,"
        " timestamptz '2026-12-01 09:42:14.618+00' AS paid_at, date '2026-12-31' AS due,"
        " uuid '12345678-1234-5678-1234-567812345678' AS ref"
    )

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        return dict(rows[0])

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return "webhook:invoice.figures:1"

    def lane_key(self, event: dict[str, Any]) -> str:
        return "invoice:figures"


async def test_numerics_and_timestamps_from_postgresql_arrive_as_exact_text_and_iso_8601(
    app: Engine, aengine: AsyncEngine, receiver: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    register_endpoint("billing", receiver.url, secret=SECRET)
    figures = register_webhook_event(InvoiceFigures())
    with app.begin() as conn:
        action = enqueue_webhook(conn, figures, {})
        rows = figures.rows(conn, {})
    await attempt_once(aengine, adapters())
    assert row(app, action.id)["state"] == "DONE"
    data = json.loads(receiver.effects[webhook_id("webhook:invoice.figures:1")].body)["data"]
    assert (data["amount"], data["rate"], data["due"], data["ref"]) == (
        "19.90",
        "0.1000000000",
        "2026-12-31",
        "12345678-1234-5678-1234-567812345678",
    )
    assert datetime.fromisoformat(data["paid_at"]) == datetime(2026, 12, 1, 9, 42, 14, 618000, tzinfo=UTC)
    nats_body = message_body("invoice.figures", "0" * 32, figures.compose({}, rows), datetime.now(UTC))
    assert json.loads(nats_body)["data"] == data, "a NATS event writes the same rows the same way"


async def test_the_receiver_verifies_the_signature_and_refuses_a_tampered_one(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    enqueue(app)
    await attempt_once(aengine, adapters())
    [seen] = billing.seen
    assert Webhook(SECRET).verify(seen.body, seen.headers)["data"]["invoice_id"] == 7
    tampered = seen.body.replace(b"1200", b"9999")
    with pytest.raises(Exception, match="signature"):
        Webhook(SECRET).verify(tampered, seen.headers)
    async with httpx.AsyncClient() as client:
        refused = await client.post(billing.url, content=tampered, headers=seen.headers)
        assert refused.status_code == 401
        resent = await client.post(billing.url, content=seen.body, headers=seen.headers)  # a duplicate
        assert (resent.status_code, resent.json()) == (200, {"id": "rcv_1"})
    assert billing.deliveries() == {MSG_ID: 2} and len(billing.effects) == 1


async def test_a_signature_with_another_secret_is_refused_and_retried(
    app: Engine, aengine: AsyncEngine, receiver: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    register_endpoint("billing", receiver.url, secret=OTHER_SECRET)
    register_webhook_event(INVOICE_PAID)
    action_id = enqueue(app)
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["attempt"], found["last_error"]) == (
        "ADMITTED",
        1,
        "401: the receiver did not take the webhook",
    )
    assert receiver.effects == {}


# -- every row of the table

IN_A_MINUTE = format_datetime(datetime.now(UTC) + timedelta(minutes=1), usegmt=True)
TABLE = [
    # script, (state, stop_reason, attempt), effects, last_error starts with
    ("ok", ("DONE", "CONFIRMED", 1), 1, None),
    ("410", ("FAILED", "PROVIDER_REFUSED", 1), 0, "410"),
    ("500", ("ADMITTED", None, 1), 0, "500"),
    ("404", ("ADMITTED", None, 1), 0, "404"),
    ("429 7", ("ADMITTED", None, 0), 0, "429: the receiver asked to wait 7 s"),
    ("503 7", ("ADMITTED", None, 0), 0, "503: the receiver asked to wait 7 s"),
    ("429", ("ADMITTED", None, 0), 0, "429: the receiver asks to slow down"),
    ("503 soon", ("ADMITTED", None, 0), 0, "503: the receiver asks to slow down"),
    ("302", ("ADMITTED", None, 1), 0, "302: a redirect, not followed"),
    ("307", ("ADMITTED", None, 1), 0, "307: a redirect, not followed"),
    ("reset", ("ADMITTED", None, 1), 0, "response: ReadError after the request was sent"),
    ("kept-reset", ("ADMITTED", None, 1), 1, "response: ReadError after the request was sent"),
    ("stall", ("ADMITTED", None, 1), 0, "response: "),
    ("kept-stall", ("ADMITTED", None, 1), 1, "response: "),
]


@pytest.mark.parametrize(("step", "expected", "effects", "error"), TABLE, ids=[case[0] for case in TABLE])
async def test_each_answer_of_the_receiver(
    app: Engine,
    aengine: AsyncEngine,
    receiver: Receiver,
    adapters: Callable[..., WebhookAdapter],
    step: str,
    expected: tuple[Any, ...],
    effects: int,
    error: str | None,
) -> None:
    good = Receiver(SECRET).start()  # where a redirect points: it must see nothing
    try:
        receiver.redirect_to = good.url
        receiver.script.append(step)
        register_endpoint("billing", receiver.url, secret=SECRET)
        register_webhook_event(INVOICE_PAID)
        action_id = enqueue(app)
        started = asyncio.get_running_loop().time()
        await attempt_once(aengine, adapters(request_seconds=0.5))
        elapsed = asyncio.get_running_loop().time() - started
        found = row(app, action_id)
        assert (found["state"], found["stop_reason"], found["attempt"]) == expected
        assert len(receiver.effects) == effects and len(receiver.seen) == 1
        assert good.seen == []
        if error is None:
            assert found["last_error"] is None
        else:
            assert found["last_error"].startswith(error), found["last_error"]
        if step.endswith("stall"):
            assert 0.5 <= elapsed < 5  # the request bound, not the receiver, ended the attempt
        if step.endswith(" 7"):
            assert 6 < found["due_in"] <= 7  # the receiver's Retry-After, not the schedule
        if step in ("429", "503 soon"):
            assert 0 < found["due_in"] <= 1  # the first slow-down's backoff, not the schedule
    finally:
        good.stop()


async def test_a_retry_after_date_defers_until_then(
    app: Engine, aengine: AsyncEngine, receiver: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver.script.append(f"503 {format_datetime(datetime.now(UTC) + timedelta(minutes=2), usegmt=True)}")
    register_endpoint("billing", receiver.url, secret=SECRET)
    register_webhook_event(INVOICE_PAID)
    action_id = enqueue(app)
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["attempt"]) == ("ADMITTED", 0)
    assert 100 < found["due_in"] <= 121


def test_retry_after_is_clamped_to_a_second_and_an_hour() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after_seconds("120", now) == 120
    assert retry_after_seconds("0", now) == 1
    assert retry_after_seconds("86400", now) == 3600
    assert retry_after_seconds("9" * 40, now) == 3600
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90
    assert retry_after_seconds(format_datetime(now - timedelta(days=1), usegmt=True), now) == 1
    assert retry_after_seconds(format_datetime(now + timedelta(days=3), usegmt=True), now) == 3600
    for unreadable in (None, "", "soon", "-5", "1.5", "١٢", "Mon, 99 Foo 2026 00:00:00 GMT"):
        assert retry_after_seconds(unreadable, now) is None, unreadable


def test_the_receivers_id_is_kept_only_when_short_and_printable() -> None:
    assert receiver_id(b'{"id": "rcv_1"}') == "rcv_1"
    assert receiver_id(b'{"id": 42}') == "42"
    for answer in (
        b"",
        b"ok",
        b"[]",
        b'{"id": true}',
        b'{"id": "a b"}',
        b'{"id": "' + b"x" * 101 + b'"}',
        b"[" * 99999,
    ):
        assert receiver_id(answer) is None, answer[:20]
    assert receiver_id(b'{"id": "\\u0000x"}') is None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("url", "stage"),
    [
        (f"http://127.0.0.1:{free_port()}/hooks", "connect: ConnectError; nothing was sent"),
        ("http://receiver.invalid/hooks", "connect: ConnectError; nothing was sent"),
        ("https://127.0.0.1:{port}/hooks", "tls: ConnectError; nothing was sent"),
    ],
    ids=["refused", "dns", "tls handshake"],
)
async def test_nothing_sent_is_retried_even_at_the_last_attempt(
    app: Engine,
    aengine: AsyncEngine,
    receiver: Receiver,
    adapters: Callable[..., WebhookAdapter],
    url: str,
    stage: str,
) -> None:
    register_endpoint("billing", url.format(port=receiver.port), secret=SECRET)
    register_webhook_event(INVOICE_PAID)
    action_id = enqueue(app, max_attempts=1)
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["stop_reason"], found["last_error"]) == ("FAILED", "ATTEMPTS_EXHAUSTED", stage)
    assert receiver.effects == {}


async def test_a_connect_timeout_sent_nothing(
    app: Engine, aengine: AsyncEngine, adapters: Callable[..., WebhookAdapter]
) -> None:
    with socket.socket() as full:  # a listener whose backlog is full: the handshake never completes
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        fillers: list[socket.socket] = []
        while len(fillers) < 8:  # until one more cannot connect
            try:
                fillers.append(socket.create_connection(full.getsockname(), timeout=0.2))
            except TimeoutError:
                break
        try:
            register_endpoint("billing", f"http://127.0.0.1:{full.getsockname()[1]}/hooks", secret=SECRET)
            register_webhook_event(INVOICE_PAID)
            action_id = enqueue(app, max_attempts=1)
            await attempt_once(aengine, adapters(request_seconds=0.5))
        finally:
            for filler in fillers:
                filler.close()
    found = row(app, action_id)
    assert (found["state"], found["stop_reason"]) == ("FAILED", "ATTEMPTS_EXHAUSTED")
    assert found["last_error"].startswith("connect: ") and "nothing was sent" in found["last_error"]


@pytest.mark.parametrize(("step", "expected"), [("stall", "UNCERTAIN"), ("reset", "UNCERTAIN"), ("500", "FAILED")])
async def test_an_unclear_answer_at_the_last_attempt_is_uncertain(
    app: Engine,
    aengine: AsyncEngine,
    billing: Receiver,
    adapters: Callable[..., WebhookAdapter],
    step: str,
    expected: str,
) -> None:
    billing.script.append(step)
    action_id = enqueue(app, max_attempts=1)
    await attempt_once(aengine, adapters(request_seconds=0.5))
    found = row(app, action_id)
    reason = {"UNCERTAIN": "PROVIDER_UNCERTAIN", "FAILED": "ATTEMPTS_EXHAUSTED"}[expected]
    assert (found["state"], found["stop_reason"]) == (expected, reason)


async def test_at_the_last_attempt_an_earlier_lost_answer_makes_a_refusal_uncertain_not_failed(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    """The first attempt's webhook was kept and its answer lost; the last attempt meets a 500: FAILED would
    say the receiver holds nothing, so it ends UNCERTAIN, and the trace says an answer was lost."""
    billing.script.extend(["kept-reset", "500"])
    action_id = enqueue(app, max_attempts=2)
    await drain(aengine, [adapters(request_seconds=0.5)])
    found = row(app, action_id)
    assert (found["state"], found["stop_reason"], found["attempt"]) == ("UNCERTAIN", "PROVIDER_UNCERTAIN", 2)
    assert found["trace"]["answer_lost"] is True and "an earlier attempt's answer was lost" in found["last_error"]
    assert len(billing.effects) == 1


# -- once, whatever happens


async def test_one_effect_through_500s_resets_and_a_lost_answer(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    billing.script.extend(["500", "reset", "kept-reset", "500"])
    action_id = enqueue(app)
    await drain(aengine, [adapters(request_seconds=1.0)])
    found = row(app, action_id)
    assert (found["state"], found["attempt"]) == ("DONE", 5)
    assert found["readback_ref"] == f"200 webhook-id={MSG_ID} receiver-id=rcv_1"  # the first delivery's id
    assert [seen.step for seen in billing.seen] == ["500", "reset", "kept-reset", "500", "ok"]
    assert {seen.headers["webhook-id"] for seen in billing.seen} == {MSG_ID}
    for seen in billing.seen:  # each attempt signed its own timestamp
        Webhook(SECRET).verify(seen.body, seen.headers)
    assert billing.deliveries() == {MSG_ID: 2}


async def test_a_reclaim_after_a_lost_lease_sends_the_same_webhook_id_once(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    billing.script.append("kept-stall")  # the first holder's webhook arrives; its answer never does
    action_id = enqueue(app)
    first = asyncio.create_task(attempt_once(aengine, adapters(request_seconds=30)))
    await asyncio.to_thread(until, lambda: bool(billing.effects), 10, "the first delivery")
    with app.begin() as conn:  # the first holder's lease runs out while it waits
        conn.execute(
            text("UPDATE agent_action SET lease_expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )
    await drain(aengine, [adapters()])
    found = row(app, action_id)
    assert (found["state"], found["attempt"]) == ("DONE", 2)
    assert found["readback_ref"] == f"200 webhook-id={MSG_ID} receiver-id=rcv_1"
    billing.released.set()  # the first holder's answer ends now; its result is refused (a newer claim)
    await first
    assert row(app, action_id)["state"] == "DONE"
    assert [seen.headers["webhook-id"] for seen in billing.seen] == [MSG_ID, MSG_ID]
    assert billing.deliveries() == {MSG_ID: 2} and len(billing.effects) == 1


async def test_the_retry_schedule_is_5_s_then_5_min(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    billing.script.extend(["500", "500"])
    action_id = enqueue(app)
    adapter = adapters()
    for attempt, wait in ((1, 5.0), (2, 300.0)):
        with app.begin() as conn:  # due now; the database's clock before the attempt
            conn.execute(text("UPDATE agent_action SET due_at = now() WHERE id = :id"), {"id": action_id})
        with app.connect() as conn:
            before = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        await attempt_once(aengine, adapter)
        found = row(app, action_id)
        with app.connect() as conn:
            due_at = conn.execute(
                text("SELECT due_at FROM agent_action WHERE id = :id"), {"id": action_id}
            ).scalar_one()
        # the wait, from a result written after `before`, is at least the schedule's and at most 10 % longer
        assert found["attempt"] == attempt and found["state"] == "ADMITTED"
        assert (due_at - before).total_seconds() >= wait and found["due_in"] <= wait * 1.1


# -- nothing sent


async def test_a_body_over_the_bound_fails_before_the_fence(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    action_id = enqueue(app)
    with app.begin() as conn:  # the data grows after the enqueue: the attempt composes it again
        conn.execute(text("UPDATE shop_invoice SET note = repeat('x', :n)"), {"n": BODY_LIMIT})
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["stop_reason"], found["write_started_at"]) == ("FAILED", "PROVIDER_REFUSED", None)
    assert found["last_error"].startswith("compose: the invoice.paid event's body is 26")
    assert found["last_error"].endswith(f"bytes, more than {BODY_LIMIT}")
    assert billing.seen == []


def test_a_body_over_the_bound_is_refused_at_enqueue(app: Engine, billing: Receiver) -> None:
    with app.begin() as conn:
        conn.execute(text("UPDATE shop_invoice SET note = repeat('x', :n)"), {"n": BODY_LIMIT})
    with app.begin() as conn, pytest.raises(InvalidRequest, match=f"event: .* more than {BODY_LIMIT}"):
        enqueue_webhook(conn, INVOICE_PAID, INVOICE)


async def test_a_compose_with_nothing_to_send_cancels(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    action_id = enqueue(app)
    with app.begin() as conn:
        conn.execute(text("UPDATE shop_invoice SET status = 'void'"))
        # the same event enqueued again returns the action its key holds, though nothing would be sent now
        assert enqueue_webhook(conn, INVOICE_PAID, INVOICE).id == action_id
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["stop_reason"], found["write_started_at"]) == ("CANCELLED", "NOT_WANTED", None)
    assert billing.seen == []


async def test_nothing_to_send_is_refused_at_enqueue_when_the_key_holds_nothing(
    app: Engine, aengine: AsyncEngine, billing: Receiver
) -> None:
    with app.begin() as conn:
        conn.execute(text("UPDATE shop_invoice SET status = 'void'"))
        with pytest.raises(InvalidRequest, match=r"event: the invoice\.paid event has nothing to send now"):
            enqueue_webhook(conn, INVOICE_PAID, INVOICE)
    async with aengine.begin() as conn:
        with pytest.raises(InvalidRequest, match="nothing to send now"):
            await enqueue_webhook_async(conn, INVOICE_PAID, INVOICE)


@pytest.mark.parametrize(
    ("note", "error"),
    [
        ("raise", "compose: the invoice.paid event's compose raised RuntimeError"),
        ("not json", 'compose: the invoice.paid event\'s data cannot be written as JSON: data["tags"]: a set'),
    ],
)
async def test_a_compose_that_fails_fails_before_the_fence_naming_the_event_type(
    app: Engine,
    aengine: AsyncEngine,
    billing: Receiver,
    adapters: Callable[..., WebhookAdapter],
    note: str,
    error: str,
) -> None:
    action_id = enqueue(app)
    with app.begin() as conn:
        conn.execute(text("UPDATE shop_invoice SET note = :note"), {"note": note})
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["stop_reason"], found["write_started_at"]) == ("FAILED", "PROVIDER_REFUSED", None)
    assert found["last_error"] == error
    assert billing.seen == []


# -- the payload chooses nothing


async def test_a_payload_can_never_choose_the_url(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    elsewhere = Receiver(SECRET).start()
    try:
        request = INVOICE_PAID.request(INVOICE)
        for payload in (
            {**request.payload, "url": elsewhere.url},
            {**request.payload, "endpoint": "elsewhere"},
            {"event_type": "invoice.paid", "event": INVOICE, "headers": {"host": "x"}},
        ):
            with app.begin() as conn, pytest.raises(InvalidRequest, match="payload: a WEBHOOK payload holds only"):
                outbox.enqueue(conn, outbox.ActionRequest(**{**request.__dict__, "payload": payload}))
        with app.begin() as conn, pytest.raises(InvalidRequest, match=r"payload\.event_type: no webhook event"):
            outbox.enqueue(
                conn, outbox.ActionRequest(**{**request.__dict__, "payload": {"event_type": "x", "event": {}}})
            )
        with app.begin() as conn:  # identifiers the event ignores, a URL among them, change nothing
            event = {"invoice_id": 7, "url": elsewhere.url}
            enqueue_webhook(conn, INVOICE_PAID, event)
        await drain(aengine, [adapters()])
        assert elsewhere.seen == [] and billing.deliveries() == {MSG_ID: 1}
    finally:
        elsewhere.stop()


def test_the_kinds_payload_check_is_the_events() -> None:
    assert outbox.ActionKind.WEBHOOK.payload_check == "outbox.webhook.events:check_payload"
    with pytest.raises(InvalidRequest, match="payload: a WEBHOOK payload is"):
        outbox.ActionKind.WEBHOOK.check_payload(["invoice.paid"])


async def test_an_event_of_a_type_this_process_does_not_know_is_retried(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    action_id = enqueue(app)
    event_registry._EVENTS.clear()  # a deploy without the event type
    await attempt_once(aengine, adapters())
    found = row(app, action_id)
    assert (found["state"], found["attempt"]) == ("ADMITTED", 1)
    assert found["last_error"] == "payload: no webhook event is registered as 'invoice.paid' (registered: none)"
    assert billing.seen == []


# -- what the row keeps


async def test_nothing_the_row_keeps_holds_the_body_the_secret_or_the_urls_query(
    app: Engine, aengine: AsyncEngine, billing: Receiver, adapters: Callable[..., WebhookAdapter]
) -> None:
    with app.begin() as conn:
        conn.execute(text("INSERT INTO shop_invoice VALUES (8, 2222, 'paid', ''), (9, 3333, 'paid', 'marker')"))
        ids = [enqueue_webhook(conn, INVOICE_PAID, {"invoice_id": n}).id for n in (7, 8, 9)]
        conn.execute(text("UPDATE shop_invoice SET note = 'raise' WHERE id = 8"))  # compose fails at its attempt
    billing.script.extend(["kept-reset"])  # the first webhook's answer is lost: last_error, then done
    await drain(aengine, [adapters()])
    with app.connect() as conn:
        kept = conn.execute(
            text("SELECT state, last_error, readback_ref, trace::text FROM agent_action ORDER BY id")
        ).all()
    assert [k.state for k in kept] == ["DONE", "FAILED", "DONE"] and len(ids) == 3
    shown = json.dumps([list(k) for k in kept])
    for secret in (SECRET, SECRET.removeprefix("whsec_"), "query-secret", "token", "1200", "2222", "3333", "marker"):
        assert secret not in shown, secret
    assert "ann@example.com" not in shown and "owes" not in shown


# -- endpoints and secrets


def test_a_missing_secret_refuses_to_build_the_adapter(aengine: AsyncEngine) -> None:
    register_endpoint("billing-eu", "https://hooks.example.com/outbox")
    with pytest.raises(WebhookSecretError) as refused:
        webhook_adapters(aengine)
    assert "billing-eu" in str(refused.value) and "OUTBOX_WEBHOOK_SECRET_BILLING_EU" in str(refused.value)


def unsigned_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """What `outbox run --adapters tests.test_webhook:unsigned_adapters` loads: an endpoint with no secret."""
    register_endpoint("billing-eu", "https://hooks.example.com/outbox")
    return webhook_adapters(engine)


def test_outbox_run_refuses_to_start_without_a_secret(cli: Callable[..., Any]) -> None:
    ran = cli("run", "--adapters", "tests.test_webhook:unsigned_adapters", "--max-seconds", "5")
    assert ran.code != 0
    assert ran.err == (
        "error: webhook endpoint billing-eu has no secret: neither the code (register_endpoint's secret=) nor"
        " OUTBOX_WEBHOOK_SECRET_BILLING_EU holds one; put whsec_ and the base64 of 24 to 64 random bytes in one"
        " of them\n"
    ), "one line, no traceback, and it never started claiming"


@pytest.mark.parametrize(
    "secret",
    ["", "k" * 40, "whsec_", "whsec_not base64!", "whsec_" + base64.b64encode(b"short").decode(), SECRET + "$"],
)
def test_a_malformed_secret_is_named_never_shown(
    aengine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    register_endpoint("billing", "https://hooks.example.com/outbox")
    monkeypatch.setenv("OUTBOX_WEBHOOK_SECRET_BILLING", secret)
    with pytest.raises(WebhookSecretError, match="webhook endpoint billing: OUTBOX_WEBHOOK_SECRET_BILLING") as refused:
        WebhookAdapter(aengine)
    assert secret.removeprefix("whsec_") not in str(refused.value) or not secret.removeprefix("whsec_")
    with pytest.raises(ValueError, match="the secret given to register_endpoint"):
        register_endpoint("other", "https://hooks.example.com/other", secret=secret)


def test_the_secret_comes_from_the_code_the_environment_then_the_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def first(name: str) -> str | None:
        asked.append(f"first:{name}")
        return None

    def second(name: str) -> str | None:
        asked.append(f"second:{name}")
        return OTHER_SECRET

    add_secret_source(first)
    add_secret_source(second)
    given = register_endpoint("given", "https://a.example/", secret=SECRET)
    from_env = register_endpoint("from-env", "https://b.example/")
    sourced = register_endpoint("sourced", "https://c.example/")
    monkeypatch.setenv("OUTBOX_WEBHOOK_SECRET_FROM_ENV", OTHER_SECRET)
    assert [endpoint_secrets(e) for e in (given, from_env, sourced)] == [(SECRET,), (OTHER_SECRET,), (OTHER_SECRET,)]
    assert asked == ["first:sourced", "second:sourced"]
    assert SECRET not in repr(given)


def test_a_failing_secret_source_is_named_without_its_message() -> None:
    def vault(name: str) -> str | None:
        raise RuntimeError(f"token {SECRET} rejected")

    add_secret_source(vault)
    endpoint = register_endpoint("billing", "https://a.example/")
    with pytest.raises(WebhookSecretError, match=r"the secret source .*vault failed \(RuntimeError\)") as refused:
        endpoint_secrets(endpoint)
    assert SECRET not in str(refused.value)


def test_a_missing_secret_names_every_place_asked_the_labelled_sources_among_them() -> None:
    add_secret_source(lambda name: None, label=lambda name: f"the Prefect Secret block outbox-webhook-{name}")
    endpoint = register_endpoint("billing-eu", "https://a.example/")
    with pytest.raises(WebhookSecretError) as refused:
        endpoint_secrets(endpoint)
    assert str(refused.value) == (
        "webhook endpoint billing-eu has no secret: neither the code (register_endpoint's secret=),"
        " OUTBOX_WEBHOOK_SECRET_BILLING_EU nor the Prefect Secret block outbox-webhook-billing-eu holds one; put"
        " whsec_ and the base64 of 24 to 64 random bytes in one of them"
    )


# -- a secret rotated: the new one and the previous one, both signing


def test_two_secrets_while_rotating_come_from_the_code_the_environment_or_a_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rotated = f"{OTHER_SECRET} {SECRET}"
    add_secret_source(lambda name: rotated if name == "sourced" else None)
    given = register_endpoint("given", "https://a.example/", secret=rotated)
    from_env = register_endpoint("from-env", "https://b.example/")
    sourced = register_endpoint("sourced", "https://c.example/")
    monkeypatch.setenv("OUTBOX_WEBHOOK_SECRET_FROM_ENV", f"  {OTHER_SECRET}\t{SECRET}\n")
    assert [endpoint_secrets(e) for e in (given, from_env, sourced)] == [(OTHER_SECRET, SECRET)] * 3
    assert rotated not in repr(given)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (f"{OTHER_SECRET} {SECRET} {THIRD_SECRET}", "holds 3 secrets; one, or two separated by a space"),
        (f"{OTHER_SECRET} whsec_" + base64.b64encode(b"short").decode(), r"\(secret 2 of 2\) holds 5 bytes"),
        (f"{OTHER_SECRET} {SECRET[6:]}", r"\(secret 2 of 2\) must start with whsec_"),
    ],
)
def test_a_rotation_with_more_than_two_secrets_or_a_malformed_one_is_refused_naming_which(
    monkeypatch: pytest.MonkeyPatch, value: str, error: str
) -> None:
    endpoint = register_endpoint("billing", "https://a.example/")
    monkeypatch.setenv("OUTBOX_WEBHOOK_SECRET_BILLING", value)
    with pytest.raises(WebhookSecretError, match=f"webhook endpoint billing: OUTBOX_WEBHOOK_SECRET_BILLING {error}"):
        endpoint_secrets(endpoint)
    with pytest.raises(WebhookSecretError, match=error):
        register_endpoint("other", "https://a.example/other", secret=value)


@pytest.mark.parametrize("receiver_holds", ["the new secret", "the previous secret"])
async def test_a_rotated_secret_signs_with_both_and_a_receiver_holding_either_verifies_it(
    app: Engine,
    aengine: AsyncEngine,
    adapters: Callable[..., WebhookAdapter],
    monkeypatch: pytest.MonkeyPatch,
    receiver_holds: str,
) -> None:
    new, previous = OTHER_SECRET, SECRET
    server = Receiver(new if receiver_holds == "the new secret" else previous).start()
    try:
        register_endpoint("billing", server.url)
        monkeypatch.setenv("OUTBOX_WEBHOOK_SECRET_BILLING", f"{new} {previous}")
        register_webhook_event(INVOICE_PAID)
        action_id = enqueue(app)
        await attempt_once(aengine, adapters())
    finally:
        server.stop()
    assert row(app, action_id)["state"] == "DONE", "the receiver verified the signature and kept the webhook"
    assert server.deliveries() == {MSG_ID: 1}
    [seen] = server.seen
    signatures = seen.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2 and all(signature.startswith("v1,") for signature in signatures)
    for secret in (new, previous):
        assert Webhook(secret).verify(seen.body, seen.headers)["data"]["invoice_id"] == 7
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(THIRD_SECRET).verify(seen.body, seen.headers)


def test_endpoints_refuse_a_second_declaration_and_a_shared_variable() -> None:
    register_endpoint("billing", "https://a.example/", secret=SECRET)
    assert register_endpoint("billing", "https://a.example/", secret=SECRET).url == "https://a.example/"
    with pytest.raises(ValueError, match="already registered"):
        register_endpoint("billing", "https://b.example/", secret=SECRET)
    register_endpoint("eu-billing", "https://a.example/")
    with pytest.raises(ValueError, match="would read the same OUTBOX_WEBHOOK_SECRET_EU_BILLING"):
        register_endpoint("eu_billing", "https://a.example/")


def test_events_need_a_registered_endpoint_and_a_valid_type() -> None:
    with pytest.raises(ValueError, match=r"endpoint: the invoice\.paid event's endpoint: no webhook endpoint"):
        register_webhook_event(INVOICE_PAID)
    register_endpoint("billing", "https://a.example/", secret=SECRET)
    assert register_webhook_event(INVOICE_PAID) is event_named("invoice.paid")

    class Spaced(InvoicePaid):
        name = "invoice paid"

    with pytest.raises(ValueError, match="name: a webhook event type"):
        register_webhook_event(Spaced())
    with pytest.raises(ValueError, match="already registered"):
        register_webhook_event(InvoicePaid())


def test_webhook_and_nats_events_register_under_names_that_import_side_by_side() -> None:
    import outbox.nats
    import outbox.webhook
    from outbox.nats import events as nats_registry
    from outbox.nats import register_nats_event

    register_endpoint("billing", "https://a.example/", secret=SECRET)
    assert register_webhook_event(INVOICE_PAID) is event_named("invoice.paid")
    assert "invoice.paid" not in nats_registry._EVENTS, "the webhook event went to the webhooks' registry only"
    assert register_nats_event is not register_webhook_event
    # the earlier names, documented before, still register in their own kind's registry
    assert outbox.webhook.register is register_webhook_event
    assert outbox.nats.register is register_nats_event


NAME = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,62}", fullmatch=True)
ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=80)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(NAME, ANY_TEXT, st.integers(), st.none()))
def test_an_endpoint_name_is_accepted_exactly_when_it_follows_the_rule(name: Any) -> None:
    endpoint_registry._ENDPOINTS.clear()
    follows = isinstance(name, str) and endpoint_registry._NAME.fullmatch(name) is not None
    try:
        register_endpoint(name, "https://a.example/", secret=SECRET)
    except ValueError as refused:
        assert not follows and str(refused).startswith("name: ")
    else:
        assert follows


EVENT_TYPE = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", fullmatch=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(EVENT_TYPE, ANY_TEXT))
def test_an_event_type_is_accepted_exactly_when_it_follows_the_rule(name: str) -> None:
    event_registry._EVENTS.clear()
    endpoint_registry._ENDPOINTS.clear()
    register_endpoint("billing", "https://a.example/", secret=SECRET)
    follows = event_registry._TYPE.fullmatch(name) is not None

    class Named(InvoicePaid):
        pass

    Named.name = name
    try:
        register_webhook_event(Named())
    except ValueError as refused:
        assert not follows and str(refused).startswith("name: ")
    else:
        assert follows


URL_PART = st.text(st.characters(codec="ascii"), max_size=30)
URLS = st.one_of(
    st.builds(
        "{}://{}{}{}".format,
        st.sampled_from(["http", "https", "HTTP", "ftp", "javascript", ""]),
        st.one_of(
            st.sampled_from(["a.example", "127.0.0.1", "[::1]", "u:p@a.example", "a.example:0", "a.example:8080"]),
            URL_PART,
        ),
        st.sampled_from(["", "/", "/hooks?x=1", "/#frag", "/a b", "/\\x"]),
        st.one_of(st.just(""), URL_PART),
    ),
    ANY_TEXT,
)


@settings(max_examples=300, deadline=None)
@given(url=URLS)
def test_a_url_is_accepted_only_when_absolute_http_with_a_host_and_no_credentials(url: str) -> None:
    from urllib.parse import urlsplit

    try:
        check_url("billing", url)
    except ValueError as refused:
        assert str(refused).startswith("url: webhook endpoint billing's url")
        return
    parts = urlsplit(url)
    assert parts.scheme in ("http", "https") and parts.hostname
    assert "@" not in parts.netloc and "#" not in url and parts.port != 0
    assert httpx.URL(url).host  # the client reads the same host


# -- the page's examples

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


async def test_the_pages_examples_run_in_order_and_deliver(
    engine: Engine, aengine: AsyncEngine, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = ROOT / "docs" / "webhooks.md"
    blocks = PYTHON_BLOCK.findall(page.read_text())
    assert len(blocks) == 3
    with engine.begin() as conn:
        conn.execute(
            text("CREATE TABLE invoice (id bigint PRIMARY KEY, amount_cents bigint, currency text, paid bool)")
        )
        conn.execute(text("INSERT INTO invoice VALUES (42, 990, 'EUR', false)"))
    monkeypatch.setenv("BILLING_WEBHOOK_URL", receiver.url)
    monkeypatch.setenv("OUTBOX_WEBHOOK_SECRET_BILLING", SECRET)
    namespace: dict[str, Any] = {"engine": engine}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
    assert namespace["action"].payload == {"event_type": "invoice.paid", "event": {"invoice_id": 42}}
    [adapter] = namespace["adapters"](aengine)
    try:
        await drain(aengine, [adapter])
    finally:
        await adapter.aclose()
    [effect] = receiver.effects.values()
    assert json.loads(effect.body)["data"] == {"invoice_id": 42, "amount": 990, "currency": "EUR"}


# -- the receiver as a process of its own


def test_the_receiver_runs_as_a_process_that_keeps_a_journal(tmp_path: Path) -> None:
    port, journal = free_port(), tmp_path / "journal.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "demo.receiver",
            "--port",
            str(port),
            "--secret",
            SECRET,
            "--journal",
            str(journal),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def answers() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        until(answers, 30, "the receiver process")
        now = datetime.now(UTC)
        content = json.dumps({"type": "invoice.paid", "timestamp": now.isoformat(), "data": {}})
        headers = {
            "webhook-id": MSG_ID,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(SECRET).sign(MSG_ID, now, content),
        }
        for _ in range(2):
            answer = httpx.post(f"http://127.0.0.1:{port}/", content=content, headers=headers)
            assert (answer.status_code, answer.json()) == (200, {"id": "rcv_1"})
        assert json.loads(journal.read_text()) == {MSG_ID: {"body": content, "deliveries": 2, "receiver_id": "rcv_1"}}
    finally:
        process.kill()
        process.wait(10)
