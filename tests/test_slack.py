"""The SLACK_MESSAGE kind: slack_sdk's real AsyncWebClient against a local Slack Web API (demo/slack_api.py)
and the real database.

Each test registers the `acme` workspace at a server of its own (a fresh registry per test), enqueues through
`enqueue_slack_message`, drains or attempts once, and asserts the action's row and exactly the messages the
server stored: one per action, whatever the network did in between.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.slack_api import SlackApi
from outbox import InvalidRequest
from outbox._internal.config.credentials import Sources
from outbox.executor import CredentialsRefused, Executor, Failed, Retry, SlowDown
from outbox.slack import (
    SlackAdapter,
    SlackTokenError,
    add_token_source,
    classify,
    enqueue_slack_message,
    message_marker,
    register_workspace,
    slack_message,
)
from outbox.slack import adapter as slack_adapter
from outbox.slack import workspaces as workspace_registry
from outbox.slack.adapter import ChannelTurns
from outbox.slack.workspaces import workspace_named, workspace_token
from outbox.testing import drain
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "xoxb-1111-2222-localtesttoken"
CHANNEL = "C0000000001"
OTHER = "C0000000002"


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers its own workspaces and token sources."""
    monkeypatch.setattr(workspace_registry, "_WORKSPACES", {})
    monkeypatch.setattr(workspace_registry, "_SOURCES", Sources("token"))
    for name in [name for name in os.environ if name.startswith("OUTBOX_SLACK_TOKEN_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def slack() -> Iterator[SlackApi]:
    server = SlackApi(tokens=[TOKEN], channels=[CHANNEL, OTHER], channel_burst=1000.0).start()
    yield server
    server.stop()


@pytest.fixture
def acme(slack: SlackApi) -> SlackApi:
    register_workspace("acme", token=TOKEN, base_url=slack.url, channel_rate="1000/s")
    return slack


@pytest_asyncio.fixture(loop_scope="function")
async def adapters(aengine: AsyncEngine) -> AsyncIterator[Callable[..., SlackAdapter]]:
    made: list[SlackAdapter] = []

    def make(request_seconds: float = 2.0) -> SlackAdapter:
        made.append(SlackAdapter(aengine, request_seconds=request_seconds))
        return made[-1]

    yield make
    for adapter in made:
        await adapter.aclose()


def enqueue(engine: Engine, key: str = "k-1", channel: str = CHANNEL, **fields: Any) -> int:
    with engine.begin() as conn:
        text_ = fields.pop("text", f"hello from {key}")
        return enqueue_slack_message(conn, "acme", channel, text_, idempotency_key=key, **fields).id


def row(engine: Engine, action_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT state, stop_reason, attempt, last_error, readback_ref, trace, destination"
                " FROM agent_action WHERE id = :id"
            ),
            {"id": action_id},
        )
        return dict(found.mappings().one())


def markers(slack: SlackApi) -> list[str]:
    return [m["metadata"]["event_payload"]["key"] for m in slack.posted()]


# -- posted


async def test_a_message_is_posted_once_with_its_marker_and_done_with_its_channel_and_ts(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    action_id = enqueue(engine, blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "*hi*"}}])
    await drain(aengine, [adapters()])
    found = row(engine, action_id)
    [message] = acme.posted()
    assert (found["state"], found["attempt"], found["destination"]) == ("DONE", 1, "slack:acme")
    assert found["readback_ref"] == f"channel={CHANNEL} ts={message['ts']}"
    assert message["text"] == "hello from k-1" and message["blocks"][0]["type"] == "section"
    assert message["metadata"] == {"event_type": "outbox_action", "event_payload": {"key": message_marker("k-1")}}
    assert found["trace"]["marker"] == message_marker("k-1") and found["trace"]["channel"] == CHANNEL
    assert acme.calls == {"chat.postMessage": 1}  # no read-back on a first attempt


async def test_a_reply_goes_to_its_thread(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    enqueue(engine, "parent")
    await drain(aengine, [adapters()])
    [parent] = acme.posted()
    reply = enqueue(engine, "reply", thread_ts=parent["ts"])
    await drain(aengine, [adapters()])
    assert row(engine, reply)["state"] == "DONE"
    assert acme.posted()[1]["thread_ts"] == parent["ts"]


# -- exactly once


@pytest.mark.parametrize("fault", ["kept-reset", "kept-502"])
async def test_a_lost_answer_leaves_exactly_one_message(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter], fault: str
) -> None:
    """The message is stored and the answer lost (the connection reset, or a 502 after the write): the next
    attempt reads the channel back, finds it by its marker, and posts nothing more."""
    acme.steps.append(fault)
    action_id = enqueue(engine)
    await drain(aengine, [adapters()])
    found = row(engine, action_id)
    [message] = acme.posted()
    assert (found["state"], found["attempt"]) == ("DONE", 2)
    assert found["readback_ref"] == f"channel={CHANNEL} ts={message['ts']} read back"
    assert [seen.step for seen in acme.seen] == [fault]  # one post; the second attempt only read back
    assert acme.calls == {"chat.postMessage": 1, "conversations.history": 1}
    assert found["trace"]["answer_lost"] is True


class ClockHoursAhead:
    """An executor host's wall clock three hours ahead (its monotonic clock as it is)."""

    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def time() -> float:
        return time.time() + 3 * 3600


async def test_a_lost_answer_of_an_executor_whose_clock_is_hours_ahead_leaves_exactly_one_message(
    engine: Engine,
    aengine: AsyncEngine,
    acme: SlackApi,
    adapters: Callable[..., SlackAdapter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read-back's window starts from the claim, by the database's clock: an executor whose own clock runs
    hours ahead still finds the message its first attempt posted (from its own clock, it would look only at
    messages three hours after it, and post again)."""
    monkeypatch.setattr(slack_adapter, "time", ClockHoursAhead)
    acme.steps.append("kept-reset")
    action_id = enqueue(engine)
    await drain(aengine, [adapters()])
    assert row(engine, action_id)["readback_ref"].endswith(" read back")
    assert markers(acme) == [message_marker("k-1")]


async def test_a_lost_answer_of_a_reply_is_read_back_from_its_thread(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    enqueue(engine, "parent")
    await drain(aengine, [adapters()])
    [parent] = acme.posted()
    acme.steps.append("kept-reset")
    reply = enqueue(engine, "reply", thread_ts=parent["ts"])
    await drain(aengine, [adapters()])
    assert row(engine, reply)["readback_ref"].endswith(" read back")
    assert markers(acme) == [message_marker("parent"), message_marker("reply")]


async def test_an_answer_lost_before_the_write_is_posted_on_the_next_attempt(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    """A reset with nothing stored, then a 500: read-back proves the absence each time, and the third posts."""
    acme.steps.extend(["reset", "500"])
    action_id = enqueue(engine)
    await drain(aengine, [adapters()])
    found = row(engine, action_id)
    assert (found["state"], found["attempt"]) == ("DONE", 3)
    assert not found["readback_ref"].endswith("read back")
    assert markers(acme) == [message_marker("k-1")]


async def test_the_clients_default_retry_would_post_twice(acme: SlackApi) -> None:
    """Why the adapter passes `retry_handlers=[]`: slack_sdk's default client re-sends once after a
    connection error, and the local server's lost answer then holds two messages."""
    from slack_sdk.web.async_client import AsyncWebClient

    acme.steps.append("kept-reset")
    client = AsyncWebClient(token=TOKEN, base_url=acme.url)
    answer = await client.chat_postMessage(channel=CHANNEL, text="twice?")
    assert answer["ok"] and len(acme.posted()) == 2


async def test_at_the_last_attempt_a_lost_answer_is_uncertain(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    acme.steps.extend(["502"])
    action_id = enqueue(engine, max_attempts=1)
    await drain(aengine, [adapters()])
    found = row(engine, action_id)
    assert (found["state"], found["stop_reason"]) == ("UNCERTAIN", "PROVIDER_UNCERTAIN")


async def test_a_killed_executor_mid_post_leaves_one_message(
    engine: Engine, aengine: AsyncEngine, database_url: str, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    """`outbox run` in a process of its own posts; the server stores the message and holds the answer; the
    process is SIGKILLed. Once its lease expires, another executor reads back and finds the message."""
    acme.steps.append("kept-stall")
    action_id = enqueue(engine)
    await asyncio.to_thread(post_and_get_killed, database_url, acme)
    with engine.begin() as conn:
        assert row(engine, action_id)["state"] == "EXECUTING"
        conn.execute(
            text("UPDATE agent_action SET lease_expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )
    await drain(aengine, [adapters()])
    found = row(engine, action_id)
    assert found["state"] == "DONE" and found["readback_ref"].endswith(" read back")
    assert markers(acme) == [message_marker("k-1")]


def test_outbox_run_posts_and_closes_its_slack_client_when_it_ends(
    engine: Engine, database_url: str, acme: SlackApi
) -> None:
    """`outbox run --max-actions 1` posts one message and ends with the adapter's connections closed: no
    "Unclosed client session" or "Unclosed connector" from aiohttp at exit."""
    action_id = enqueue(engine)
    env = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOX_")}
    env |= {"OUTBOX_DATABASE_URL": database_url, "OUTBOX_SLACK_TOKEN_ACME": TOKEN, "OUTBOX_TEST_SLACK_URL": acme.url}
    run = ["run", "--adapters", "tests.slack_adapters:acme_adapters", "--max-actions", "1"]
    ended = subprocess.run(
        [sys.executable, "-X", "dev", "-m", "outbox.cli", *run],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ended.returncode == 0, ended.stderr
    assert row(engine, action_id)["state"] == "DONE"
    assert "Unclosed" not in ended.stderr, ended.stderr


def post_and_get_killed(database_url: str, acme: SlackApi) -> None:
    """`outbox run` in a process of its own until the server stored its message, then SIGKILL."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOX_")}
    env |= {"OUTBOX_DATABASE_URL": database_url, "OUTBOX_SLACK_TOKEN_ACME": TOKEN, "OUTBOX_TEST_SLACK_URL": acme.url}
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.slack_adapters:acme_adapters"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        until(lambda: bool(acme.posted()) or process.poll() is not None, 60, "the killed executor's post")
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stderr:
            process.stderr.close()


async def test_no_token_and_no_message_text_reach_a_log_line_even_at_debug(
    engine: Engine,
    aengine: AsyncEngine,
    acme: SlackApi,
    adapters: Callable[..., SlackAdapter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every logger at DEBUG (slack_sdk's and aiohttp's among them), a post and a lost answer's read-back."""
    acme.steps.append("kept-reset")
    enqueue(engine, text="the secret plan for order 42")
    with caplog.at_level(logging.DEBUG):
        await drain(aengine, [adapters()])
    lines = "\n".join(record.getMessage() for record in caplog.records)
    assert TOKEN not in lines and "secret plan" not in lines
    assert len(acme.posted()) == 1


# -- classified


async def test_each_answer_of_slack(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    """Real answers through the real client: an ended message, a rate limit, broken credentials."""
    acme.archived.add(OTHER)
    archived = enqueue(engine, "archived", channel=OTHER)
    await Executor(aengine, [adapters()], listen=False).run(until_idle=True)
    assert (row(engine, archived)["state"], row(engine, archived)["stop_reason"]) == ("FAILED", "PROVIDER_REFUSED")
    assert "is_archived" in row(engine, archived)["last_error"]

    acme.steps.append("429 7")
    limited = enqueue(engine, "limited")
    await Executor(aengine, [adapters()], listen=False).run(until_idle=True)
    found = row(engine, limited)
    assert (found["state"], found["attempt"]) == ("ADMITTED", 0) and "ratelimited" in found["last_error"]
    with engine.connect() as conn:
        pause = conn.execute(
            text("SELECT extract(epoch FROM paused_until - now()) FROM agent_destination WHERE name = 'slack:acme'")
        ).scalar_one()
    assert 5 < pause <= 7


async def test_a_revoked_token_holds_the_workspace_and_spends_no_attempt(
    engine: Engine, aengine: AsyncEngine, acme: SlackApi, adapters: Callable[..., SlackAdapter]
) -> None:
    acme.revoked.add(TOKEN)
    ids = [enqueue(engine, f"k-{n}", lane_key=f"lane-{n}") for n in range(5)]
    await Executor(aengine, [adapters()], listen=False).run(until_idle=True)
    found = [row(engine, action_id) for action_id in ids]
    assert [f["attempt"] for f in found] == [0] * 5 and {f["state"] for f in found} == {"ADMITTED"}
    with engine.connect() as conn:
        reason = conn.execute(
            text("SELECT credentials_reason FROM agent_destination WHERE name = 'slack:acme'")
        ).scalar_one()
    assert "token_revoked" in reason and TOKEN not in reason
    assert len(acme.seen) <= 5 and not acme.posted()


# every row of docs/slack.md's table, through `classify`
CLASSIFIED = [
    (200, "channel_not_found", None, Failed),
    (200, "is_archived", None, Failed),
    (200, "not_in_channel", None, Failed),
    (200, "msg_too_long", None, Failed),
    (200, "invalid_blocks", None, Failed),
    (200, "invalid_auth", None, CredentialsRefused),
    (200, "token_revoked", None, CredentialsRefused),
    (200, "account_inactive", None, CredentialsRefused),
    (401, None, None, CredentialsRefused),
    (429, "ratelimited", "30", SlowDown),
    (429, "ratelimited", None, SlowDown),
    (200, "internal_error", None, Retry),
    (502, None, None, Retry),
    (200, "some_new_error", None, Retry),
]


@pytest.mark.parametrize(("status", "code", "retry_after", "expected"), CLASSIFIED)
def test_the_classification_table(status: int, code: str | None, retry_after: str | None, expected: type) -> None:
    result = classify(status, code, retry_after, 0)
    assert type(result) is expected, result
    if retry_after is not None:
        assert isinstance(result, SlowDown) and result.named and result.after == 30
    if expected is Retry and (status >= 500 or code == "internal_error"):
        assert "may have been posted" in result.reason  # the next attempt reads back


# the result column of docs/slack.md's table, as its first words say it: the result classify must give
DOCS_RESULTS = {
    "a slow-down": SlowDown,
    "[credentials refused]": CredentialsRefused,
    "`FAILED`": Failed,
    "retried; the message may have been posted": Retry,
}


def docs_rows() -> list[tuple[list[tuple[int, str | None]], type]]:
    """Each row of docs/slack.md's "What Slack answered" that names Slack's answers: (status, code) pairs, and
    the result its words give."""
    page = (ROOT / "docs" / "slack.md").read_text()
    section = page[page.index("## What Slack answered") :]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| answer") or line.startswith("| ---"):
            continue
        answer, result = (cell.strip() for cell in line.strip("|").split("|"))
        expected = next((cls for words, cls in DOCS_RESULTS.items() if result.startswith(words)), None)
        if expected is None:
            continue  # ok, or a network fault: no code of Slack's
        answers: list[tuple[int, str | None]] = []
        for status in re.findall(r"HTTP (\d{3})", answer):
            answers.append((int(status), None))
        if "any HTTP 5xx" in answer:
            answers += [(500, None), (502, None), (503, None)]
        answers += [(200, code) for code in re.findall(r"`([a-z_]+)`", answer)]
        rows.append((answers, expected))
    return rows


def test_every_row_of_the_docs_table_is_what_classify_gives() -> None:
    from outbox.slack.adapter import CREDENTIALS, ENDS, SLOW, UNCLEAR

    rows = docs_rows()
    assert [expected for _, expected in rows] == [SlowDown, CredentialsRefused, Failed, Retry]
    documented = set()
    for answers, expected in rows:
        for status, code in answers:
            result = classify(status, code, None, 0)
            assert type(result) is expected, (status, code, result)
            if expected is Retry:
                assert "may have been posted" in result.reason
            documented.add(code)
    assert documented >= CREDENTIALS | ENDS | SLOW | UNCLEAR  # every code the adapter names is in the table


# -- the channel's pace


def test_a_channels_turns_come_one_a_second_and_others_are_not_held() -> None:
    register_workspace("acme", token=TOKEN)
    turns, workspace = ChannelTurns(), workspace_named("acme")
    waits = [turns.take(workspace, CHANNEL) for _ in range(3)]
    assert waits[0] == 0 and 0.9 < waits[1] <= 1.0 and 1.9 < waits[2] <= 2.0
    assert turns.take(workspace, OTHER) == 0


# -- bad input, nothing written


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"channel": "#general"}, "payload.channel"),
        ({"channel": "c0123abcd"}, "payload.channel"),
        ({"text": ""}, "payload.text"),
        ({"text": "x" * 40_001}, "payload.text"),
        ({"thread_ts": "yesterday"}, "payload.thread_ts"),
        ({"blocks": []}, "payload.blocks"),
        ({"blocks": [{"text": "no type"}]}, "payload.blocks"),
        ({"workspace": "nowhere"}, "payload.workspace"),
    ],
)
def test_bad_input_is_refused_at_enqueue_naming_the_field_and_nothing_is_written(
    engine: Engine, acme: SlackApi, fields: dict[str, Any], field: str
) -> None:
    args = {"workspace": "acme", "channel": CHANNEL, "text": "hello"} | fields
    with pytest.raises(InvalidRequest) as refused, engine.begin() as conn:
        enqueue_slack_message(
            conn, args.pop("workspace"), args.pop("channel"), args.pop("text"), idempotency_key="k", **args
        )
    assert refused.value.field == field
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one() == 0


def test_forty_thousand_characters_are_accepted() -> None:
    register_workspace("acme", token=TOKEN)
    assert slack_message("acme", CHANNEL, "x" * 40_000, idempotency_key="k").payload["text"] == "x" * 40_000


# -- the token


def test_a_missing_token_refuses_to_build_the_adapter_naming_every_place(aengine: AsyncEngine) -> None:
    register_workspace("acme")
    add_token_source(lambda name: None, label=lambda name: f"the Prefect Secret block outbox-slack-{name}")
    with pytest.raises(SlackTokenError) as missing:
        SlackAdapter(aengine)
    assert "OUTBOX_SLACK_TOKEN_ACME" in str(missing.value) and "outbox-slack-acme" in str(missing.value)


def test_a_malformed_token_is_named_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    register_workspace("acme")
    monkeypatch.setenv("OUTBOX_SLACK_TOKEN_ACME", "not-a-token-secret-value")
    with pytest.raises(SlackTokenError) as malformed:
        workspace_token(workspace_named("acme"))
    assert "OUTBOX_SLACK_TOKEN_ACME" in str(malformed.value) and "secret-value" not in str(malformed.value)


def test_outbox_run_refuses_to_start_without_a_token(database_url: str) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOX_")}
    env |= {"OUTBOX_DATABASE_URL": database_url, "OUTBOX_TEST_SLACK_URL": "http://127.0.0.1:9/api/"}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.slack_adapters:acme_adapters"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "OUTBOX_SLACK_TOKEN_ACME" in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_importing_outbox_loads_no_slack_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, outbox, outbox.slack; assert 'slack_sdk' not in sys.modules"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


CHANNEL_ID = st.from_regex(r"[CGD][A-Z0-9]{6,20}", fullmatch=True)
ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=30)


@settings(max_examples=150, deadline=None)
@given(channel=st.one_of(CHANNEL_ID, ANY_TEXT, st.integers(), st.none()), ts=st.one_of(st.none(), ANY_TEXT))
def test_a_channel_and_a_thread_are_accepted_exactly_when_they_follow_the_rule(channel: Any, ts: Any) -> None:
    workspace_registry._WORKSPACES.clear()
    register_workspace("acme", token=TOKEN)
    follows = isinstance(channel, str) and re.fullmatch(r"[CGD][A-Z0-9]{6,20}", channel) is not None
    threaded = ts is None or re.fullmatch(r"[0-9]{10}\.[0-9]{6}", ts) is not None
    try:
        slack_message("acme", channel, "hello", idempotency_key="k", thread_ts=ts)
    except InvalidRequest as refused:
        assert not (follows and threaded)
        assert refused.field == ("payload.channel" if not follows else "payload.thread_ts")
    else:
        assert follows and threaded
