"""How outbox builds an email's message: each header class made once, one build per attempt.

    PreparedEmail ─▶ written (build_message with outbox's POLICY, message_bytes) ─▶ DATA
    outbox's header registry: the class of a header name made on first use, the same class after

tests/test_email_headers.py holds what the headers say; here, that building the same message twice gives the
same bytes and the same header classes, that a name mapped anew gets its new class, and that an attempt on a
real relay sends the message it built once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email import message_from_bytes
from email.headerregistry import HeaderRegistry
from email.utils import parsedate_to_datetime
from typing import cast

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.sink import SmtpSink
from examples.accounts import notices, schema
from outbox.email import EmailAdapter, PreparedEmail, Recipient, SmtpSettings, enqueue_email
from outbox.email.message import POLICY, build_message, written
from outbox.testing import drain

SENDER = Recipient("outbox@example.com", "outbox")
EMAIL = PreparedEmail((Recipient("ann@example.com", "Ann Lee"),), "Disk full", "The disk is full.\n")
AT = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)


def test_each_header_class_is_made_once() -> None:
    first = build_message(EMAIL, SENDER, "<a@example.com>", AT)
    second = build_message(EMAIL, SENDER, "<a@example.com>", AT)
    for name in ("From", "To", "Subject", "Date", "Message-ID", "Content-Type", "MIME-Version"):
        assert type(first[name]) is type(second[name]), name
    assert type(first["From"]) is not type(first["Subject"])
    assert first.as_bytes() == second.as_bytes() == written(EMAIL, SENDER, "<a@example.com>", AT)


def test_a_name_mapped_anew_gets_its_new_class() -> None:
    registry = cast(HeaderRegistry, POLICY.header_factory)
    before = registry["x-outbox-test"]
    assert registry["X-Outbox-Test"] is before

    class Numbered(before.__mro__[1]):  # type: ignore[misc,name-defined]  # the mapped class, under the made one
        pass

    registry.map_to_type("x-outbox-test", Numbered)
    try:
        assert issubclass(registry["x-outbox-test"], Numbered)
    finally:
        registry.map_to_type("x-outbox-test", before.__mro__[1])
    assert not issubclass(registry["x-outbox-test"], Numbered)


async def test_an_attempt_sends_the_message_it_built(engine: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(text("INSERT INTO app_account VALUES (4, 'Carol Lee', 'carol@example.com', false)"))
        action = enqueue_email(conn, notices.VERIFY_ADDRESS, {"account_id": 4})
    settings = SmtpSettings(host="127.0.0.1", port=sink.port, sender="outbox@example.com", timeout_seconds=2)
    await drain(aengine, [EmailAdapter(aengine, settings)])
    with engine.connect() as conn:
        state = conn.execute(text("SELECT state FROM agent_action WHERE id = :id"), {"id": action.id}).scalar_one()
    assert state == "DONE"
    [received] = sink.received
    sent_at = parsedate_to_datetime(str(message_from_bytes(received.data)["Date"]))
    row = {"address": "carol@example.com", "display_name": "Carol Lee"}
    email = notices.VERIFY_ADDRESS.composed({"account_id": 4}, [row])
    assert email is not None
    expected = written(email, Recipient("outbox@example.com"), received.message_id, sent_at)
    assert received.data.replace(b"\r\n", b"\n") == expected.replace(b"\r\n", b"\n")
