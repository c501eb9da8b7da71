"""The EMAIL kind against a real SMTP server (aiosmtpd on 127.0.0.1) with one injected fault per test.

Each test enqueues through the example application's notices, drains, and asserts the action's state,
stop reason and attempts, and exactly what the sink received (messages counted by Message-ID), the name
the adapter gave in EHLO, and who a group notice shows in its headers. tests/test_email_headers.py holds
the headers and recipients themselves.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.sink import Faults, SmtpSink
from examples.accounts import notices, schema
from outbox import InvalidRequest
from outbox.email import (
    EmailAdapter,
    SmtpSettings,
    UnknownNotice,
    enqueue_email,
    enqueue_email_async,
    message_id,
    notice_named,
)
from outbox.email.adapter import READBACK_LIMIT, address_literal, is_public_name, readback_ref
from outbox.email.settings import load_settings
from outbox.executor import Executor
from outbox.testing import drain

ROOT = Path(__file__).resolve().parent.parent
ALICE, BOB = "alice@example.com", "bob@example.com"
ALERT = {"workspace_id": 10, "alert_id": 100}
VERIFY = {"account_id": 4}


@pytest.fixture
def app(engine: Engine) -> Engine:
    """The example application: workspace 10 with two admins (Alice, Bob) and a member; Carol unverified."""
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(
            text("""
            INSERT INTO app_account VALUES (1, 'Alice', 'alice@example.com', true), (2, 'Bob', 'bob@example.com', true),
                (3, 'Mallory', 'member@example.com', true), (4, 'Carol', 'carol@example.com', false);
            INSERT INTO app_workspace VALUES (10, 'Research');
            INSERT INTO app_membership VALUES (10, 1, 'admin'), (10, 2, 'admin'), (10, 3, 'member');
            INSERT INTO app_alert VALUES (100, 10, 'Disk full', 'The disk is full.');
        """)
        )
    return engine


def settings(port: int, **changes: Any) -> SmtpSettings:
    values: dict[str, Any] = {"host": "127.0.0.1", "port": port, "sender": "outbox@example.com", "timeout_seconds": 2}
    values.update(changes)
    return SmtpSettings(**values)


def enqueue(app: Engine, notice: Any = notices.WORKSPACE_ALERT, event: dict[str, Any] | None = None) -> int:
    with app.begin() as conn:
        return enqueue_email(conn, notice, event or ALERT).id


def action(app: Engine, action_id: int) -> tuple[str, str | None, int]:
    with app.connect() as conn:
        found = conn.execute(
            text("SELECT state, stop_reason, attempt FROM agent_action WHERE id = :id"), {"id": action_id}
        ).one()
    return found.state, found.stop_reason, found.attempt


async def attempt_once(aengine: AsyncEngine, smtp: SmtpSettings) -> None:
    await Executor(aengine, [EmailAdapter(aengine, smtp)], listen=False).run(until_idle=True)


CASES = [
    ("250", Faults(), ("DONE", "CONFIRMED", 1), 1),
    ("451 to MAIL", Faults(mail="451 4.3.0 try later"), ("ADMITTED", None, 1), 0),
    ("550 to MAIL", Faults(mail="550 5.7.1 sender refused"), ("FAILED", "PROVIDER_REFUSED", 1), 0),
    ("450 to one RCPT of two", Faults(rcpt={BOB: "450 4.2.1 mailbox busy"}), ("ADMITTED", None, 1), 0),
    ("450 to every RCPT", Faults(rcpt={ALICE: "450 4.2.1 busy", BOB: "450 4.2.1 busy"}), ("ADMITTED", None, 1), 0),
    ("550 to one RCPT of two", Faults(rcpt={BOB: "550 5.1.1 no such user"}), ("DONE", "CONFIRMED", 1), 1),
    (
        "550 to every RCPT",
        Faults(rcpt={ALICE: "550 5.1.1 no", BOB: "550 5.1.1 no"}),
        ("FAILED", "PROVIDER_REFUSED", 1),
        0,
    ),
    ("452 to DATA", Faults(data="452 4.3.1 insufficient storage"), ("ADMITTED", None, 1), 0),
    ("554 to DATA", Faults(data="554 5.7.1 message refused"), ("FAILED", "PROVIDER_REFUSED", 1), 0),
    ("dropped after DATA", Faults(after_data="drop"), ("UNCERTAIN", "PROVIDER_UNCERTAIN", 1), 1),
    ("no answer after DATA", Faults(after_data="stall"), ("UNCERTAIN", "PROVIDER_UNCERTAIN", 1), 1),
]


@pytest.mark.parametrize(("faults", "expected", "messages"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_each_smtp_stage_and_reply(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink, faults: Faults, expected: tuple[Any, ...], messages: int
) -> None:
    sink.faults = faults
    action_id = enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    assert action(app, action_id) == expected
    expected_id = message_id("workspace_alert:100", "example.com")
    assert sink.count_by_message_id() == ({expected_id: 1} if messages else {})


async def test_a_250_is_done_with_the_relays_reply_and_a_stable_message_id(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    action_id = enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    with app.connect() as conn:
        reference = conn.execute(text("SELECT readback_ref FROM agent_action WHERE id = :id"), {"id": action_id})
        assert reference.scalar_one().startswith("250 2.0.0 queued as")
    [received] = sink.received
    assert received.rcpt_tos == (ALICE, BOB)  # the admins, not the member
    assert received.message_id == message_id("workspace_alert:100", "example.com")
    assert message_id("workspace_alert:100", "example.com") == received.message_id  # any replica computes it


def readback(app: Engine, action_id: int) -> str:
    with app.connect() as conn:
        found = conn.execute(text("SELECT readback_ref FROM agent_action WHERE id = :id"), {"id": action_id})
        return str(found.scalar_one())


async def test_a_refused_recipient_does_not_stop_the_others(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    sink.faults = Faults(rcpt={BOB: "550 5.1.1 no such user"})
    action_id = enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    assert [r.rcpt_tos for r in sink.received] == [(ALICE,)]
    assert readback(app, action_id) == "250 2.0.0 queued as 1 | 1 of 2 recipients refused: 550"


async def test_recipients_refused_while_others_accept_end_done_with_the_refusals_recorded(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    with app.begin() as conn:  # five admins with a verified address
        conn.execute(
            text("""
            INSERT INTO app_account VALUES (5, 'Dan', 'dan@example.com', true), (6, 'Eve', 'eve@example.com', true),
                (7, 'Fay', 'fay@example.com', true);
            INSERT INTO app_membership VALUES (10, 5, 'admin'), (10, 6, 'admin'), (10, 7, 'admin');
        """)
        )
    sink.faults = Faults(rcpt={BOB: "553 5.1.3 <bob@example.com> bad address", "eve@example.com": "550 5.1.1 no"})
    action_id = enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    assert action(app, action_id) == ("DONE", "CONFIRMED", 1)
    assert readback(app, action_id) == "250 2.0.0 queued as 1 | 2 of 5 recipients refused: 550, 553"
    assert [r.rcpt_tos for r in sink.received] == [(ALICE, "dan@example.com", "fay@example.com")]


def test_the_readback_ref_keeps_the_refusals_within_its_bound() -> None:
    long_reply = "250 " + "x" * 1_000
    kept = readback_ref(long_reply, [550, 553, 550], 5)
    assert len(kept) == READBACK_LIMIT and kept.endswith(" | 3 of 5 recipients refused: 550, 553")
    assert readback_ref(long_reply, [], 5) == long_reply[:READBACK_LIMIT]


async def test_a_group_notice_shows_no_recipient_another_address(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    enqueue(app)  # to both admins
    enqueue(app, notices.VERIFY_ADDRESS, VERIFY)  # to Carol alone
    await drain(aengine, [EmailAdapter(aengine, settings(sink.port))])
    group, single = sorted(sink.received, key=lambda r: len(r.rcpt_tos), reverse=True)
    assert group.rcpt_tos == (ALICE, BOB)  # one transaction, one message, every address in the envelope
    headers = email.message_from_bytes(group.data, policy=email.policy.default)
    assert str(headers["To"]) == "undisclosed-recipients:;"
    assert b"alice" not in group.data.lower() and b"bob" not in group.data.lower()
    assert single.rcpt_tos == ("carol@example.com",)
    assert str(email.message_from_bytes(single.data, policy=email.policy.default)["To"]) == "Carol <carol@example.com>"


# -- the name EHLO gives


async def test_ehlo_gives_the_senders_domain_by_default(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    assert [r.helo_name for r in sink.received] == ["example.com"]


async def test_ehlo_gives_the_configured_name(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_SMTP_PORT", str(sink.port))
    monkeypatch.setenv("OUTBOX_SMTP_SENDER", "outbox@example.com")
    monkeypatch.setenv("OUTBOX_SMTP_HELO_NAME", "mail.example.org")
    enqueue(app)
    await attempt_once(aengine, SmtpSettings.from_settings(load_settings()))
    assert [r.helo_name for r in sink.received] == ["mail.example.org"]


async def test_ehlo_is_never_localhost_by_default(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    """A sender at localhost: this machine's name when it is a public one, else the connection's address."""
    enqueue(app)
    await attempt_once(aengine, settings(sink.port, sender="outbox@localhost"))
    fqdn = socket.getfqdn()
    assert [r.helo_name for r in sink.received] == [fqdn if is_public_name(fqdn) else "[127.0.0.1]"]


def test_which_names_are_public_host_names() -> None:
    public = ["example.com", "mail.example.org", "xn--80ak6aa92e.com", "a-b.example"]
    private = ["localhost", "mail.localhost", "vm", "box.local", "box.localdomain", "db.internal", "127.0.0.1"]
    malformed = ["-bad.example.com", "bad-.example.com", "a..b.com", "under_score.com", "x" * 64 + ".com", ""]
    assert [name for name in public if is_public_name(name)] == public
    assert [name for name in private + malformed if is_public_name(name)] == []


def test_a_configured_ehlo_name_is_a_host_name_or_an_address_literal() -> None:
    for name in ["mail.example.org", "localhost", "[192.0.2.1]", "[IPv6:2001:db8::1]"]:
        assert settings(25, helo_name=name).helo_name == name
    for name in [
        "mail example.org",
        "mail.example.org\r\nRSET",
        "[mail.example.org]",
        "[999.1.1.1]",
        "[IPv6:192.0.2.1]",
        "",
    ]:
        with pytest.raises(ValueError, match="smtp helo name"):
            settings(25, helo_name=name)
    assert address_literal(("192.0.2.1", 25)) == "[192.0.2.1]"
    assert address_literal(("2001:db8::1", 25, 0, 0)) == "[IPv6:2001:db8::1]"
    assert address_literal(("::ffff:192.0.2.1", 25, 0, 0)) == "[192.0.2.1]"


async def test_a_connection_refused_is_retried(app: Engine, aengine: AsyncEngine) -> None:
    closed = SmtpSink()  # never started: nothing listens on its port
    action_id = enqueue(app)
    await attempt_once(aengine, settings(closed.port))
    assert action(app, action_id) == ("ADMITTED", None, 1)


async def test_a_421_greeting_is_deferred_without_spending_an_attempt(app: Engine, aengine: AsyncEngine) -> None:
    async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"421 4.3.2 service not available\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(busy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    action_id = enqueue(app)
    async with server:
        await attempt_once(aengine, settings(port))
    assert action(app, action_id) == ("ADMITTED", None, 0)  # a slow-down: the attempt does not count


async def test_a_535_login_is_retried_and_a_good_login_sends(app: Engine, aengine: AsyncEngine) -> None:
    relay = SmtpSink(credentials=("outbox", "right")).start()
    try:
        action_id = enqueue(app)
        await attempt_once(aengine, settings(relay.port, username="outbox", password="wrong"))
        assert action(app, action_id) == ("ADMITTED", None, 1) and relay.received == []
        await drain(aengine, [EmailAdapter(aengine, settings(relay.port, username="outbox", password="right"))])
        assert action(app, action_id) == ("DONE", "CONFIRMED", 2) and len(relay.received) == 1
    finally:
        relay.stop()


async def test_an_unsubscribe_between_two_attempts_sends_nothing(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    sink.faults = Faults(mail="451 4.3.0 try later")
    action_id = enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    with app.begin() as conn:  # both admins unsubscribe while the action waits out its backoff
        conn.execute(text("INSERT INTO app_unsubscription VALUES (1, 'workspace_alert'), (2, 'workspace_alert')"))
    sink.faults = Faults()
    await drain(aengine, [EmailAdapter(aengine, settings(sink.port))])
    assert action(app, action_id) == ("CANCELLED", "NOT_WANTED", 2)
    assert sink.received == []


async def test_a_retry_reaches_only_who_still_wants_it(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    sink.faults = Faults(mail="451 4.3.0 try later")
    enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    with app.begin() as conn:  # Bob lost the admin role, Alice lost her address
        conn.execute(text("UPDATE app_membership SET role = 'member' WHERE account_id = 2"))
        conn.execute(text("INSERT INTO app_membership VALUES (10, 4, 'admin')"))
        conn.execute(text("UPDATE app_account SET email_verified = true WHERE id = 4"))
        conn.execute(text("UPDATE app_account SET email = NULL WHERE id = 1"))
    sink.faults = Faults()
    await drain(aengine, [EmailAdapter(aengine, settings(sink.port))])
    assert [r.rcpt_tos for r in sink.received] == [("carol@example.com",)]


async def test_the_instance_level_notice_stops_once_the_address_is_verified(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    first = enqueue(app, notices.VERIFY_ADDRESS, VERIFY)
    with app.connect() as conn:
        row = conn.execute(
            text("SELECT workspace_id, subject_account_id FROM agent_action WHERE id = :id"), {"id": first}
        ).one()
    assert tuple(row) == (None, 4)
    with app.begin() as conn:
        conn.execute(text("UPDATE app_account SET email_verified = true WHERE id = 4"))
    await drain(aengine, [EmailAdapter(aengine, settings(sink.port))])
    assert action(app, first) == ("CANCELLED", "NOT_WANTED", 1) and sink.received == []


def test_a_notice_that_reaches_nobody_is_refused_at_enqueue(app: Engine) -> None:
    with app.begin() as conn:
        conn.execute(text("UPDATE app_account SET email_verified = true WHERE id = 4"))
    with app.connect() as conn, pytest.raises(InvalidRequest, match="verify_address notice would reach nobody"):
        enqueue_email(conn, notices.VERIFY_ADDRESS, VERIFY)


def test_a_retried_enqueue_email_returns_the_first_action_after_its_recipient_unsubscribed(
    app: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with app.begin() as conn:
        first = enqueue_email(conn, notices.VERIFY_ADDRESS, VERIFY)
    with app.begin() as conn:
        conn.execute(text("INSERT INTO app_unsubscription VALUES (4, 'verify_address')"))
        conn.execute(text("UPDATE app_account SET email_verified = true WHERE id = 4"))
    caplog.set_level(logging.DEBUG, logger="outbox")
    with app.begin() as conn:
        again = enqueue_email(conn, notices.VERIFY_ADDRESS, VERIFY)
    assert again == first and (first.created, again.created, again.differing_fields) == (True, False, ())
    assert not [r for r in caplog.records if r.name.startswith("outbox")]
    with app.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one() == 1
    # a new key still reaches nobody
    with app.connect() as conn, pytest.raises(InvalidRequest, match="verify_address notice would reach nobody"):
        enqueue_email(conn, notices.VERIFY_ADDRESS, {**VERIFY, "request": 2})


async def test_a_retried_enqueue_email_async_returns_the_first_action_when_it_reaches_nobody(
    app: Engine, aengine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    first = enqueue(app, notices.WORKSPACE_ALERT, ALERT)
    with app.begin() as conn:
        conn.execute(text("DELETE FROM app_membership WHERE role = 'admin'"))
    caplog.set_level(logging.DEBUG, logger="outbox")
    async with aengine.begin() as conn:
        again = await enqueue_email_async(conn, notices.WORKSPACE_ALERT, ALERT)
        with pytest.raises(InvalidRequest, match="workspace_alert notice would reach nobody"):
            await enqueue_email_async(conn, notices.WORKSPACE_ALERT, {**ALERT, "alert_id": 101})
    assert (again.id, again.created, again.differing_fields) == (first, False, ())
    assert not [r for r in caplog.records if r.name.startswith("outbox")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            "UPDATE app_account SET display_name = E'Alice\\r\\nBcc: eve@evil.example' WHERE id = 1",
            "recipient 1 display name: contains a line break",
        ),
        (
            "UPDATE app_account SET email = E'alice@example.com\\r\\nBcc: eve@evil.example' WHERE id = 1",
            "recipient 1 address: contains a line break",
        ),
        ("UPDATE app_account SET email = 'not an address' WHERE id = 1", "recipient 1 address: is not a valid"),
    ],
)
def test_header_injection_and_bad_addresses_are_refused_at_enqueue(app: Engine, change: str, message: str) -> None:
    with app.begin() as conn:
        conn.execute(text(change))
    with app.connect() as conn:
        with pytest.raises(InvalidRequest, match=message) as refused:
            enqueue_email(conn, notices.WORKSPACE_ALERT, ALERT)
        assert "evil" not in str(refused.value) and "not an address" not in str(refused.value)
        assert conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one() == 0


def test_a_malformed_event_and_an_unknown_notice_are_named(app: Engine) -> None:
    with app.connect() as conn, pytest.raises(InvalidRequest, match="needs a positive integer alert_id"):
        enqueue_email(conn, notices.WORKSPACE_ALERT, {"workspace_id": 10})
    with pytest.raises(UnknownNotice, match="no email notice is registered as 'birthday'"):
        notice_named("birthday")


async def test_the_recipient_never_reaches_the_logs(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sink.faults = Faults(rcpt={BOB: "550 5.1.1 <bob@example.com> unknown"}, after_data="drop")
    enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("outbox"))
    [uncertain] = [line for line in logged.splitlines() if "ended UNCERTAIN" in line]
    # the warning line names the email by its trace: the notice and the Message-ID (the sender's domain)
    assert 'notice="workspace_alert"' in uncertain and 'message_id="<outbox.' in uncertain
    # no recipient's address, whole or its local part, and no reply text
    assert not [part for part in ("alice@", "bob@", "<bob", "Disk full", "unknown") if part in logged]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_starttls_with_a_self_signed_certificate(
    app: Engine, aengine: AsyncEngine, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    relay = SmtpSink(tls_context=context).start()
    try:
        action_id = enqueue(app)
        await attempt_once(aengine, settings(relay.port, tls="starttls", ca_file=cert))
        assert action(app, action_id) == ("DONE", "CONFIRMED", 1) and len(relay.received) == 1
    finally:
        relay.stop()


async def test_a_relay_without_starttls_is_refused_when_tls_is_required(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    action_id = enqueue(app)
    await attempt_once(aengine, settings(sink.port, tls="starttls"))
    assert action(app, action_id) == ("ADMITTED", None, 1) and sink.received == []


def test_tls_is_required_by_default_off_loopback() -> None:
    assert settings(25, host="smtp.example.com").effective_tls == "starttls"
    assert settings(25, host="127.0.0.1").effective_tls == "none"
    with pytest.raises(InvalidRequest, match="smtp sender"):
        settings(25, sender="nobody")


async def test_an_executor_killed_during_data_never_sends_twice(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink, database_url: str
) -> None:
    sink.faults = Faults(after_data="stall")  # the message arrives, the reply never does
    action_id = enqueue(app)
    executor = start_executor_process(database_url, sink.port)
    try:
        assert await asyncio.to_thread(sink.data_arrived.wait, 60), "the executor never reached DATA"
    finally:
        executor.send_signal(signal.SIGKILL)
        executor.wait(10)
    with app.begin() as conn:
        held = conn.execute(
            text("SELECT state, write_started_at IS NOT NULL FROM agent_action WHERE id = :id"), {"id": action_id}
        ).one()
        assert tuple(held) == ("EXECUTING", True)
        # the lease runs out
        conn.execute(
            text("UPDATE agent_action SET lease_expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )
    sink.faults = Faults()  # the relay is healthy again: a second send would arrive
    await drain(aengine, [EmailAdapter(aengine, settings(sink.port))])
    assert action(app, action_id) == ("UNCERTAIN", "LEASE_LOST_AFTER_WRITE", 1)
    assert sink.count_by_message_id() == {message_id("workspace_alert:100", "example.com"): 1}


def start_executor_process(database_url: str, smtp_port: int) -> subprocess.Popen[bytes]:
    """`outbox run` with the example application's adapters, as a replica would run it."""
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SMTP_PORT": str(smtp_port),
        "OUTBOX_SMTP_SENDER": "outbox@example.com",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "run", "--adapters", "examples.accounts:adapters"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
