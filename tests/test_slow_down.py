"""A provider's slow-down ends the attempt Defer: every row of the email reply table against a real SMTP server
(the demo's sink, one injected reply per stage), the table in docs/email.md against the rules in code, the
backoff of repeated deferrals, and webhooks' 429 and 503 without Retry-After against a real receiver.

A Defer must leave `attempt` as it was (the attempt does not count), count as DEFER in
action_attempts_total, and send nothing; a reply that is no slow-down keeps its Retry, Failed or Uncertain.
"""

from __future__ import annotations

import base64
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.receiver import Receiver
from demo.sink import Faults, SmtpSink
from examples.accounts import notices, schema
from outbox._internal.config.credentials import Sources
from outbox.email import EmailAdapter, SmtpSettings, enqueue_email
from outbox.email.replies import BEFORE_DATA, REPLY_RULES, SLOW_DOWN_WORDS, ReplyRule, classify_reply, markdown_rows
from outbox.executor import Defer, Executor, Failed, Retry, SlowDown, Uncertain
from outbox.executor.backoff import SLOW_DOWN_CAP_SECONDS, SLOW_DOWN_DEFERRALS, slow_down_delay
from outbox.metrics.exporter import registry_for
from outbox.webhook import WebhookAdapter, enqueue_webhook, register_endpoint, register_webhook_event
from outbox.webhook import endpoints as endpoint_registry
from outbox.webhook import events as event_registry
from tests.webhook_events import NumberedHook

ROOT = Path(__file__).resolve().parent.parent
ALICE, BOB = "alice@example.com", "bob@example.com"
CREDENTIALS = ("outbox", "right")
STATES = {
    "Slow down": ("ADMITTED", None, 0),
    "Defer": ("ADMITTED", None, 0),
    "Retry": ("ADMITTED", None, 1),
    "Failed": ("FAILED", "PROVIDER_REFUSED", 1),
    "Uncertain": ("UNCERTAIN", "PROVIDER_UNCERTAIN", 1),
}


@pytest.fixture
def app(engine: Engine) -> Engine:
    """The example application: workspace 10 with two admins, Alice and Bob, and one alert."""
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(
            text("""
            INSERT INTO app_account VALUES (1, 'Alice', 'alice@example.com', true), (2, 'Bob', 'bob@example.com', true);
            INSERT INTO app_workspace VALUES (10, 'Research');
            INSERT INTO app_membership VALUES (10, 1, 'admin'), (10, 2, 'admin');
            INSERT INTO app_alert VALUES (100, 10, 'Disk full', 'The disk is full.');
        """)
        )
    return engine


def enqueue(app: Engine) -> int:
    with app.begin() as conn:
        return enqueue_email(conn, notices.WORKSPACE_ALERT, {"workspace_id": 10, "alert_id": 100}).id


def stored(app: Engine, action_id: int) -> Any:
    with app.connect() as conn:
        return conn.execute(
            text(
                "SELECT state, stop_reason, attempt, max_attempts, epoch, last_error, write_started_at,"
                " extract(epoch FROM due_at - now()) AS due_in FROM agent_action WHERE id = :id"
            ),
            {"id": action_id},
        ).one()


def attempts_counted(app: Engine, kind: str, result: str) -> float:
    """action_attempts_total{kind, result, recorded="true"} as the exporter reads it from the tallies."""
    value = registry_for(app, cache_seconds=0).get_sample_value(
        "action_attempts_total", {"kind": kind, "result": result, "recorded": "true"}
    )
    return value or 0.0


def make_due(app: Engine, action_id: int) -> None:
    """The action due now, and the relay's pause over."""
    with app.begin() as conn:
        conn.execute(text("UPDATE agent_action SET due_at = now() WHERE id = :id"), {"id": action_id})
        conn.execute(text("UPDATE agent_destination SET paused_until = now() WHERE paused_until > now()"))


async def attempt_once(aengine: AsyncEngine, smtp: SmtpSettings) -> None:
    await Executor(aengine, [EmailAdapter(aengine, smtp)], listen=False).run(until_idle=True)


def relay_for(stage: str, reply: str) -> tuple[SmtpSink, dict[str, Any]]:
    """A sink that answers `reply` at `stage`, and the settings that reach that stage."""
    changes: dict[str, Any] = {}
    options: dict[str, Any] = {}
    faults = Faults()
    if stage == "rcpt":
        faults.rcpt = {ALICE: reply, BOB: reply}
    else:
        setattr(faults, stage, reply)
    if stage == "starttls":  # offered by a sink with a TLS context; the refusal comes before any handshake
        options["tls_context"] = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        changes["tls"] = "starttls"
    if stage == "login":
        options["credentials"] = CREDENTIALS
        changes.update(username=CREDENTIALS[0], password=CREDENTIALS[1])
    return SmtpSink(faults=faults, **options).start(), changes


EXAMPLES = [(rule, stage, reply) for rule in REPLY_RULES for stage, reply in rule.examples]


@pytest.mark.parametrize(
    ("rule", "stage", "reply"), EXAMPLES, ids=[f"{stage} {reply[:40]}" for _, stage, reply in EXAMPLES]
)
async def test_each_reply_of_the_table_at_its_stage(
    app: Engine, aengine: AsyncEngine, rule: ReplyRule, stage: str, reply: str
) -> None:
    relay, changes = relay_for(stage, reply)
    try:
        action_id = enqueue(app)
        smtp = SmtpSettings(
            host="127.0.0.1", port=relay.port, sender="outbox@example.com", timeout_seconds=2, **changes
        )
        await attempt_once(aengine, smtp)
    finally:
        relay.stop()
    found = stored(app, action_id)
    code = reply[:3]
    assert (found.state, found.stop_reason, found.attempt) == STATES[rule.verdict], found.last_error
    assert found.epoch == 1 and relay.received == []
    assert found.last_error.startswith(f"{stage}: {code}; "), found.last_error
    label = "DEFER" if rule.verdict == "Slow down" else rule.verdict.upper()
    assert attempts_counted(app, "EMAIL", label) == 1
    with app.connect() as conn:
        paused = conn.execute(
            text("SELECT paused_until > now() FROM agent_destination WHERE name = 'smtp'")
        ).scalar_one_or_none()
    # a slow-down pauses the relay for every executor; nothing else does (a greylisted message waits alone)
    assert bool(paused) is (rule.verdict == "Slow down")
    if rule.verdict in ("Defer", "Slow down"):
        assert found.last_error == f"{stage}: {code}; {rule.why}"
        assert found.write_started_at is None  # the fence is put back: nothing was written
        # the first slow-down pauses the relay for 0.5 s, and the email waits the pause; a greylisted one
        # waits 0.5 .. 1 s alone
        assert 0 < found.due_in <= 1


def test_the_docs_table_is_the_rules_in_code() -> None:
    page = (ROOT / "docs" / "email.md").read_text()
    marker = page.index("<!-- reply rules:")
    lines = page[marker:].splitlines()[1:]
    table = []
    for line in lines[2:]:  # after the header and its rule
        if not line.startswith("|"):
            break
        table.append(line)
    assert lines[0] == "| stage | reply | result | why |"
    assert table == markdown_rows()


async def test_a_slow_down_to_one_recipient_defers_the_whole_email(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    sink.faults = Faults(rcpt={BOB: "451 4.7.0 Too many messages for this recipient, try again later"})
    action_id = enqueue(app)
    await attempt_once(aengine, SmtpSettings(host="127.0.0.1", port=sink.port, sender="outbox@example.com"))
    found = stored(app, action_id)
    assert (found.state, found.attempt) == ("ADMITTED", 0) and sink.received == []
    assert found.last_error == "rcpt: 451; the relay asks to slow down; nothing was sent"


async def test_a_greylisted_recipient_defers_the_email_alone(app: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    sink.faults = Faults(rcpt={BOB: "451 4.7.1 Greylisted, please come back later"})
    action_id = enqueue(app)
    await attempt_once(aengine, SmtpSettings(host="127.0.0.1", port=sink.port, sender="outbox@example.com"))
    found = stored(app, action_id)
    assert (found.state, found.attempt) == ("ADMITTED", 0) and sink.received == []
    assert found.last_error == "rcpt: 451; the relay wants this message again later (greylisting); nothing was sent"
    with app.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM agent_destination")).scalar_one() == 0


async def test_deferrals_never_spend_attempts_and_wait_longer_each_time(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    """Five slow-downs in a row: attempt stays 0, epoch counts the claims, the relay's pause doubles from 0.5 s
    and the email waits it, and DEFER counts five; then the relay accepts and the email is DONE at its first
    attempt."""
    smtp = SmtpSettings(host="127.0.0.1", port=sink.port, sender="outbox@example.com")
    sink.faults = Faults(mail="450 4.7.1 Error: too much mail from 127.0.0.1")
    action_id = enqueue(app)
    for deferral in range(5):
        await attempt_once(aengine, smtp)
        found = stored(app, action_id)
        assert (found.state, found.attempt, found.epoch) == ("ADMITTED", 0, deferral + 1)
        pause = 0.5 * 2.0**deferral  # 0.5 s, 1 s, 2 s, ...: the relay's pause, which the email waits
        with app.begin() as conn:
            paused = conn.execute(
                text(
                    "SELECT slow_downs, extract(epoch FROM paused_until - now()) AS left_,"
                    " extract(epoch FROM (SELECT due_at FROM agent_action) - paused_until) AS after_pause"
                    " FROM agent_destination"
                )
            ).one()
        # the slow-downs in a row (the pause is 0.5 s * 2 ** (n - 1)); the email is due as the pause ends
        assert paused.slow_downs == deferral + 1 and paused.left_ <= pause
        assert 0 <= paused.after_pause < 0.5 and found.due_in <= pause
        make_due(app, action_id)
    assert attempts_counted(app, "EMAIL", "DEFER") == 5
    sink.faults = Faults()
    await attempt_once(aengine, smtp)
    found = stored(app, action_id)
    assert (found.state, found.attempt, found.epoch, found.last_error) == ("DONE", 1, 6, None)
    assert len(sink.received) == 1 and attempts_counted(app, "EMAIL", "RETRY") == 0


def test_the_slow_down_wait_doubles_and_is_capped() -> None:
    for uncounted in range(40):
        ceiling = min(SLOW_DOWN_CAP_SECONDS, 2.0**uncounted)
        waits = [slow_down_delay(uncounted) for _ in range(50)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
    assert slow_down_delay(10**9) <= SLOW_DOWN_CAP_SECONDS == 300


# -- the rules over any reply text

texts = st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=80)


@given(code=st.integers(400, 499), reply=texts, uncounted=st.integers(0, 50))
def test_a_4xx_after_data_is_always_a_retry(code: int, reply: str, uncounted: int) -> None:
    assert isinstance(classify_reply("data", code, reply, uncounted), Retry)


@given(code=st.integers(500, 599), stage=st.sampled_from([*BEFORE_DATA, "data"]), reply=texts)
def test_a_5xx_is_never_a_slow_down(code: int, stage: str, reply: str) -> None:
    assert not isinstance(classify_reply(stage, code, reply, 0), Defer)


@given(stage=st.sampled_from(BEFORE_DATA), reply=texts, uncounted=st.integers(0, SLOW_DOWN_DEFERRALS - 1))
def test_a_421_before_data_is_always_a_defer_within_the_cap(stage: str, reply: str, uncounted: int) -> None:
    result = classify_reply(stage, 421, reply, uncounted)
    assert isinstance(result, Defer) and 0 < result.after <= SLOW_DOWN_CAP_SECONDS


@given(stage=st.sampled_from(BEFORE_DATA), reply=texts, uncounted=st.integers(SLOW_DOWN_DEFERRALS, 10**6))
def test_a_slow_down_past_the_deferrals_an_action_may_have_counts_as_an_attempt(
    stage: str, reply: str, uncounted: int
) -> None:
    assert isinstance(classify_reply(stage, 421, reply, uncounted), Retry)


async def test_a_relay_that_says_slow_down_for_ever_still_lets_the_email_end(
    app: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    """A policy refusal sent as a 4.7.x (Postfix's `reject_unknown_client_hostname` answers 450 4.7.1): the
    email is deferred SLOW_DOWN_DEFERRALS times, then each refusal is an attempt, and it ends FAILED."""
    smtp = SmtpSettings(host="127.0.0.1", port=sink.port, sender="outbox@example.com")
    sink.faults = Faults(mail="450 4.7.1 Client host rejected: cannot find your hostname")
    action_id = enqueue(app)
    for _ in range(SLOW_DOWN_DEFERRALS):
        await attempt_once(aengine, smtp)
        make_due(app, action_id)
    assert stored(app, action_id).attempt == 0
    for _ in range(10):  # the email's attempts, each counted now, then its end
        await attempt_once(aengine, smtp)
        if (found := stored(app, action_id)).state != "ADMITTED":
            break
        make_due(app, action_id)
    assert (found.state, found.stop_reason, found.attempt) == ("FAILED", "ATTEMPTS_EXHAUSTED", found.max_attempts)
    assert attempts_counted(app, "EMAIL", "DEFER") == SLOW_DOWN_DEFERRALS
    assert attempts_counted(app, "EMAIL", "RETRY") == found.max_attempts


WORDS = ["rate", "too many", "Throttled", "try again later", "TOO MUCH MAIL", "greylisted"]


@given(
    code=st.integers(400, 499),
    stage=st.sampled_from(BEFORE_DATA),
    before=texts,
    word=st.sampled_from(WORDS),
    after=texts,
)
def test_a_4xx_before_data_that_names_a_rate_is_a_defer(
    code: int, stage: str, before: str, word: str, after: str
) -> None:
    reply = f"4.2.0 {before} {word} {after}"
    if stage == "rcpt" and "too many recipients" in reply.lower():
        return  # a limit of the message (its own rule)
    assert isinstance(classify_reply(stage, code, reply, 0), Defer)


@given(code=st.integers(400, 499).filter(lambda c: c != 421), stage=st.sampled_from(BEFORE_DATA), reply=texts)
def test_a_4xx_before_data_without_a_slow_down_sign_is_a_retry(code: int, stage: str, reply: str) -> None:
    text_ = f"4.3.0 {reply}"
    if SLOW_DOWN_WORDS.search(text_):
        return
    assert isinstance(classify_reply(stage, code, text_, 0), Retry)


def test_every_verdict_of_the_rules_is_a_result() -> None:
    made = {type(rule.result(stage, int(reply[:3]), 0)) for rule in REPLY_RULES for stage, reply in rule.examples}
    assert made == {SlowDown, Defer, Retry, Failed, Uncertain}
    assert all(re.fullmatch(r"[0-9x]{3}", rule.code) for rule in REPLY_RULES)


# -- webhooks: 429 and 503 without Retry-After

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


class Pinged(NumberedHook):
    name = "test.pinged"
    endpoint = "slowdown"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """A receiver registered as the `slowdown` endpoint, in registries of this test's own."""
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(endpoint_registry, "_SOURCES", Sources("secret"))
    monkeypatch.setattr(event_registry, "_EVENTS", {})
    started = Receiver(SECRET).start()
    register_endpoint("slowdown", started.url, secret=SECRET)
    register_webhook_event(PINGED)
    yield started
    started.stop()


PINGED = Pinged()


async def test_a_webhook_answered_429_and_503_without_retry_after_is_deferred_until_taken(
    app: Engine, aengine: AsyncEngine, receiver: Receiver
) -> None:
    receiver.script.extend(["429", "503", "429", "ok"])
    with app.begin() as conn:
        action_id = enqueue_webhook(conn, PINGED, {"n": 1}).id
    adapter = WebhookAdapter(aengine)
    waits: list[float] = []
    try:
        for _ in range(3):
            await Executor(aengine, [adapter], listen=False).run(until_idle=True)
            found = stored(app, action_id)
            assert (found.state, found.attempt) == ("ADMITTED", 0), found.last_error
            assert re.fullmatch(r"(429|503): the receiver asks to slow down; it took nothing", found.last_error)
            waits.append(found.due_in)
            make_due(app, action_id)
        await Executor(aengine, [adapter], listen=False).run(until_idle=True)
    finally:
        await adapter.aclose()
    found = stored(app, action_id)
    assert (found.state, found.attempt, found.epoch) == ("DONE", 1, 4)
    assert waits[0] <= 1 and 0.5 < waits[1] <= 2 and 1.5 < waits[2] <= 4  # the doubling's bounds
    assert attempts_counted(app, "WEBHOOK", "DEFER") == 3 and attempts_counted(app, "WEBHOOK", "RETRY") == 0
    assert len(receiver.seen) == 4 and len(receiver.effects) == 1
