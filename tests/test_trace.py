"""An email is traced from outbox alone: after it ends, its action keeps the notice, the Message-ID the relay
received and what went wrong last (stage and reply code, never an address), and the reader role reads them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.sink import Faults, SmtpSink
from outbox import ops
from outbox.action import Action
from outbox.executor.executor import LAST_ERROR_LIMIT, error_text
from tests import test_email, test_reader_role
from tests.conftest import CliResult
from tests.test_email import ALICE, BOB, attempt_once, enqueue, settings

# the fixtures of the email and reader tests: the example application, the relay and the reader login
app, reader = test_email.app, test_reader_role.reader

NOTICE = "workspace_alert"


def stored(app: Engine, action_id: int) -> Action:
    with app.connect() as conn:
        return ops.get_action(conn, action_id)


async def send(app: Engine, aengine: AsyncEngine, sink: SmtpSink, faults: Faults) -> Action:
    sink.faults = faults
    action_id = enqueue(app)
    await attempt_once(aengine, settings(sink.port))
    return stored(app, action_id)


async def test_an_uncertain_email_keeps_its_notice_message_id_and_stage(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    action = await send(app, aengine, sink, Faults(after_data="drop"))
    assert (action.state, action.stop_reason, action.payload) == ("UNCERTAIN", "PROVIDER_UNCERTAIN", None)
    [received] = sink.received
    assert action.trace == {"notice": NOTICE, "message_id": received.message_id}
    assert action.last_error is not None and action.last_error.startswith("data: ")


async def test_a_5xx_fails_with_its_code(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    action = await send(app, aengine, sink, Faults(data="554 5.7.1 message refused"))
    assert (action.state, action.stop_reason) == ("FAILED", "PROVIDER_REFUSED")
    assert action.last_error == "data: 554; the relay refused the message"
    assert action.trace is not None and action.trace["notice"] == NOTICE


@pytest.mark.parametrize(
    ("reply", "state"),
    [("550 5.1.1 <{}> no such user", "FAILED"), ("450 4.2.1 <{}> mailbox busy", "ADMITTED")],
)
async def test_a_rcpt_reply_that_echoes_the_address_never_reaches_last_error(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink, reply: str, state: str
) -> None:
    faults = Faults(rcpt={ALICE: reply.format(ALICE), BOB: reply.format(BOB)})
    action = await send(app, aengine, sink, faults)
    assert action.state == state
    assert action.last_error is not None and action.last_error.startswith(f"rcpt: {reply[:3]}")
    assert "@" not in action.last_error and "example.com" not in action.last_error


async def test_done_clears_the_error_of_an_earlier_attempt(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    action = await send(app, aengine, sink, Faults(mail="451 4.3.0 try later"))
    assert (action.state, action.last_error) == ("ADMITTED", "mail: 451; the relay accepted nothing")
    with app.begin() as conn:
        conn.execute(text("UPDATE agent_action SET due_at = now() WHERE id = :id"), {"id": action.id})
    sink.faults = Faults()
    await attempt_once(aengine, settings(sink.port))
    done = stored(app, action.id)
    assert (done.state, done.last_error, done.attempt) == ("DONE", None, 2)
    assert done.trace == {"notice": NOTICE, "message_id": sink.received[0].message_id}


async def test_the_reader_reads_last_error_and_trace(
    app: Engine,
    aengine: AsyncEngine,
    sink: SmtpSink,
    reader: Engine,
) -> None:
    action = await send(app, aengine, sink, Faults(after_data="drop"))
    with reader.connect() as conn:
        row = conn.execute(text("SELECT last_error, trace FROM agent_action WHERE id = :id"), {"id": action.id}).one()
    assert (row.last_error, row.trace) == (action.last_error, action.trace)


def test_error_text_leaves_out_addresses_and_keeps_its_bound() -> None:
    assert error_text("rcpt: 550 <bob@example.com> and carol@example.org: unknown") == (
        "rcpt: 550 <(an address)> and (an address): unknown"
    )
    assert error_text("") is None
    assert len(error_text("x" * 2000) or "") == LAST_ERROR_LIMIT


def test_the_database_bounds_last_error(engine: Engine) -> None:
    with engine.begin() as conn:
        bound = conn.execute(
            text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_agent_action_last_error'")
        ).scalar_one()
    assert str(LAST_ERROR_LIMIT) in bound


async def test_outbox_show_and_list_give_the_trace_of_an_uncertain_email(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink, cli: Callable[..., CliResult]
) -> None:
    action = await send(app, aengine, sink, Faults(after_data="drop"))
    [received] = sink.received
    shown = cli("show", str(action.id), "--json").json()
    assert shown["trace"] == {"notice": NOTICE, "message_id": received.message_id}
    assert shown["last_error"] == action.last_error
    for moment in ("created_at", "due_at", "write_started_at", "ended_at"):
        assert shown[moment] is not None, moment
    assert {"expires_at", "lease_expires_at"} <= shown.keys()
    # the table folds a long value over lines of its column: read it without the frame and the spaces
    table = "".join(cli("show", str(action.id)).out.replace("│", "").split())
    for expected in (NOTICE, received.message_id, "lasterror", "Message-ID", "writestarted", "ended"):
        assert expected in table, expected
    [listed] = cli("list", "--json").json()["actions"]
    assert listed["trace"]["message_id"] == received.message_id


def test_show_escapes_control_characters_of_last_error_and_trace(engine: Engine, cli: Callable[..., CliResult]) -> None:
    with engine.begin() as conn:
        action_id = conn.execute(
            text(
                "INSERT INTO agent_action (kind, lane_key, idempotency_key, max_attempts, state, last_error, trace)"
                " VALUES ('EMAIL', 'l', 'k', 1, 'ADMITTED', E'data: \\x1b[31mred', '{\"notice\": \"n\\u001b[2J\"}')"
                " RETURNING id"
            )
        ).scalar_one()
    table = cli("show", str(action_id)).out
    assert "\x1b" not in table and "red" in table
