"""An action is traced from outbox alone. Any adapter notes a trace on its attempt (`attempt.note`): outbox
writes it with the fence (durable before the provider call) or the result, keeps it after the action ends, and
shows it in the UNCERTAIN warning line and to the executor's listeners, for every kind. An email's trace is
its notice and the Message-ID the relay received; beside it, what went wrong last (stage and reply code,
never an address). The reader role reads both."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.sink import Faults, SmtpSink
from outbox import ops
from outbox.action import Action
from outbox.executor import ActionAttempt, Done, Executor, Failed, Result, Retry, Uncertain
from outbox.executor.attempt import TRACE_LIMIT, trace_text
from outbox.executor.executor import LAST_ERROR_LIMIT, error_text
from outbox.executor.outcomes import EndedAction
from tests import kinds, test_email, test_reader_role
from tests.adapters import ScriptedAdapter
from tests.conftest import CliResult
from tests.test_email import ALICE, BOB, attempt_once, enqueue, settings
from tests.test_executor_holders import expire_lease
from tests.test_executor_results import enqueue as enqueue_test_kind
from tests.test_executor_results import row

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


# ---- the trace of any kind ---------------------------------------------------------------------------


async def run_with(
    aengine: AsyncEngine, behaviour: Callable[[ActionAttempt], Any], kind: Any = kinds.NOOP
) -> list[EndedAction]:
    """One executor run until idle with `behaviour` as the kind's adapter; the actions it ended."""
    executor = Executor(aengine, [ScriptedAdapter(kind, behaviour)], listen=False)
    ended: list[EndedAction] = []
    executor.outcomes.listeners.append(ended.append)
    await executor.run(until_idle=True)
    return ended


async def test_a_trace_noted_before_the_fence_is_durable_before_the_provider_call(
    engine: Engine, aengine: AsyncEngine
) -> None:
    action_id = enqueue_test_kind(engine)
    during_the_call: list[Any] = []

    async def behaviour(attempt: ActionAttempt) -> Result:
        attempt.note(ref="order-7", tries=1, sandbox=False)
        (await attempt.fence().begin_write()).check()
        during_the_call.append(row(engine, action_id)["trace"])  # the provider call would run here
        return Done("ok")

    [ended] = await run_with(aengine, behaviour)
    trace = {"ref": "order-7", "tries": 1, "sandbox": False}
    assert during_the_call == [trace]
    assert (row(engine, action_id)["trace"], row(engine, action_id)["payload"]) == (trace, None)
    assert (ended.id, ended.state, ended.reason, dict(ended.trace)) == (action_id, "DONE", "CONFIRMED", trace)


async def test_a_trace_is_written_with_a_result_that_never_fenced(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue_test_kind(engine)

    async def behaviour(attempt: ActionAttempt) -> Result:
        attempt.note(ref="refused-before-sending")
        return Failed("prepare: refused")

    [ended] = await run_with(aengine, behaviour)
    assert row(engine, action_id)["trace"] == {"ref": "refused-before-sending"}
    assert (ended.state, dict(ended.trace)) == ("FAILED", {"ref": "refused-before-sending"})


async def test_each_attempt_adds_to_the_trace_and_one_that_notes_nothing_keeps_it(
    engine: Engine, aengine: AsyncEngine
) -> None:
    action_id = enqueue_test_kind(engine, max_attempts=3)
    seen: list[dict[str, Any]] = []

    async def behaviour(attempt: ActionAttempt) -> Result:
        seen.append(dict(attempt.trace))  # what the claim found
        if attempt.action.attempt == 1:
            attempt.note(ref="first", stage="connect")
            return Retry("connect: refused", after=0)
        if attempt.action.attempt == 2:
            attempt.note(stage="data")
            return Retry("data: 451", after=0)
        return Failed("data: 554")

    [ended] = await run_with(aengine, behaviour)
    final = {"ref": "first", "stage": "data"}
    assert seen == [{}, {"ref": "first", "stage": "connect"}, final]
    assert (row(engine, action_id)["trace"], dict(ended.trace)) == (final, final)


async def test_the_uncertain_warning_line_shows_the_trace_of_any_kind(
    engine: Engine, aengine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    action_id = enqueue_test_kind(engine)

    async def behaviour(attempt: ActionAttempt) -> Result:
        attempt.note(ref="abc-1", count=2)
        (await attempt.fence().begin_write()).check()
        return Uncertain("the provider did not answer")

    with caplog.at_level(logging.WARNING, "outbox.executor"):
        await run_with(aengine, behaviour)
    [line] = [r.getMessage() for r in caplog.records if "ended UNCERTAIN" in r.getMessage()]
    assert (
        line
        == f'action {action_id} of kind {kinds.NOOP.name} ended UNCERTAIN: PROVIDER_UNCERTAIN (ref="abc-1" count=2)'
    )


async def test_an_action_the_sweep_ends_shows_the_trace_its_row_keeps(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue_test_kind(engine, kind=kinds.ONCE)
    in_provider, release = asyncio.Event(), asyncio.Event()

    async def holder(attempt: ActionAttempt) -> Result:
        attempt.note(ref="sent-once")
        (await attempt.fence().begin_write()).check()
        in_provider.set()
        await release.wait()
        return Done("late")

    first = asyncio.create_task(run_with(aengine, holder, kinds.ONCE))
    await asyncio.wait_for(in_provider.wait(), 10)
    expire_lease(engine, action_id)  # the holder is paused past its lease: the next sweep ends the action
    swept = await run_with(aengine, holder, kinds.ONCE)
    release.set()
    assert await asyncio.wait_for(first, 10) == []  # the late result is not recorded
    assert [(e.id, e.state, e.reason, dict(e.trace)) for e in swept] == [
        (action_id, "UNCERTAIN", "LEASE_LOST_AFTER_WRITE", {"ref": "sent-once"})
    ]


async def test_note_refuses_what_the_trace_cannot_hold_and_adds_nothing(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue_test_kind(engine)
    refusals: list[str] = []
    # at the database's bound exactly, non-ASCII and escaped characters included
    base = {"ref": "é\n"}
    longest = "x" * (TRACE_LIMIT - len(trace_text({**base, "more": ""})))

    async def behaviour(attempt: ActionAttempt) -> Result:
        attempt.note(**base)
        bad: list[dict[str, Any]] = [{"Ref": "x"}, {"ratio": 0.5}, {"nested": {"a": 1}}, {"nul": "a\x00b"}]
        bad.append({"more": longest + "x"})
        for fields in bad:
            with pytest.raises((ValueError, TypeError)) as refused:
                attempt.note(**fields)
            refusals.append(str(refused.value))
        attempt.note(more=longest)
        return Done("ok")

    [ended] = await run_with(aengine, behaviour)
    assert row(engine, action_id)["trace"] == {**base, "more": longest} == dict(ended.trace)
    assert [r.split(":")[0] for r in refusals[:4]] == [
        "trace field 'Ref'",
        "trace field ratio",
        "trace field nested",
        "trace field nul",
    ]
    assert str(TRACE_LIMIT) in refusals[4]
