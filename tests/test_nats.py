"""The NATS_EVENT kind against a real nats-server with JetStream (demo/nats.py) and the real PostgreSQL.

    enqueue_event (the test's order table) ─▶ drain ─▶ NatsAdapter ─▶ [relay] ─▶ nats-server (stream ORDERS)

Each test enqueues, drains (or runs one executor pass), and asserts the action's end and what the stream
holds: every event exactly once by Nats-Msg-Id, through lost leases inside and past the duplicate window,
a server killed after the publish, an unclear publish, and the read-back horizon.
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID

import nats
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from nats.js.api import PubAck, RetentionPolicy, StorageType, StreamConfig, StreamInfo
from sqlalchemy import Engine, TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from demo.nats import NatsServer, free_port
from outbox._internal.redaction.masking import MASK
from outbox.errors import InvalidRequest
from outbox.executor import Abandoned, ActionAttempt, Done, Executor, Result
from outbox.kinds import ActionKind
from outbox.nats import (
    NatsAdapter,
    NatsConfig,
    NatsEvent,
    enqueue_event,
    enqueue_event_async,
    event_token,
    register_nats_event,
)
from outbox.nats.events import check_payload
from outbox.nats.message import (
    MAX_SUBJECT_LENGTH,
    MAX_SUBJECT_TOKENS,
    InvalidEvent,
    check_event_type,
    check_subject,
    message_body,
    message_subject,
)
from outbox.nats.settings import NatsSettingsError, load_config, parse_servers, shown_url
from outbox.requests import ActionRequest
from outbox.testing import drain
from tests.chaos.netrelay import NetRelay
from tests.conftest import CliResult

STREAM = "ORDERS"


class OrderCreated(NatsEvent):
    name: ClassVar[str] = "order.created"
    workspace_scoped: ClassVar[bool] = False
    query: ClassVar[TextClause | None] = text("SELECT id, status, total FROM app_order WHERE id = :order_id")

    def subject(self, event: dict[str, Any]) -> str:
        return "orders.created"

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"order_id": int(event["order_id"])}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        if not rows:
            return None  # the order is gone: nothing to tell
        return {"order_id": rows[0]["id"], "status": rows[0]["status"], "total": rows[0]["total"]}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"order.created:{event['order_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"order:{event['order_id']}"


ORDER_CREATED = register_nats_event(OrderCreated())


@pytest.fixture
def app(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE app_order (id bigint PRIMARY KEY, status text NOT NULL, total int NOT NULL)"))
        conn.execute(text("INSERT INTO app_order SELECT g, 'open', g * 10 FROM generate_series(1, 20) AS g"))
    return engine


def config(url: str, publish_timeout: float = 1.0) -> NatsConfig:
    return NatsConfig(servers=(url,), publish_timeout_seconds=publish_timeout)


@pytest.fixture
async def adapter(aengine: AsyncEngine, nats_server: NatsServer) -> AsyncIterator[NatsAdapter]:
    made = NatsAdapter(aengine, config(nats_server.url))
    yield made
    await made.close()


async def add_stream(url: str, name: str = STREAM, subjects: Sequence[str] = ("orders.>",), **options: Any) -> None:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        settings = {"retention": RetentionPolicy.LIMITS, "storage": StorageType.FILE, **options}
        await nc.jetstream().add_stream(StreamConfig(name=name, subjects=list(subjects), **settings))
    finally:
        await nc.close()


async def stored(url: str, stream: str = STREAM) -> list[tuple[str, str, dict[str, Any]]]:
    """Every message the stream holds: (subject, Nats-Msg-Id, body), in sequence order."""
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        state = (await js.stream_info(stream)).state
        found = []
        for seq in range(max(state.first_seq, 1), state.last_seq + 1):
            try:
                message = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            found.append(
                (str(message.subject), (message.headers or {}).get("Nats-Msg-Id", ""), json.loads(message.data or b""))
            )
        return found
    finally:
        await nc.close()


def enqueue(app: Engine, order_id: int, max_attempts: int = 5) -> int:
    with app.begin() as conn:
        return enqueue_event(conn, ORDER_CREATED, {"order_id": order_id}, max_attempts=max_attempts).id


def ended(app: Engine, action_id: int) -> tuple[str, str | None, int, str | None]:
    with app.connect() as conn:
        row = conn.execute(
            text("SELECT state, stop_reason, attempt, readback_ref FROM agent_action WHERE id = :id"), {"id": action_id}
        ).one()
    return row.state, row.stop_reason, row.attempt, row.readback_ref


def token(order_id: int) -> str:
    return event_token(f"order.created:{order_id}")


async def test_an_event_is_published_once_on_its_own_subject(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url)
    action_id = enqueue(app, 1)
    await drain(aengine, [adapter])
    assert ended(app, action_id) == ("DONE", "CONFIRMED", 1, f"stream={STREAM} seq=1")
    [(subject, msg_id, body)] = await stored(nats_server.url)
    assert subject == f"orders.created.{token(1)}" and msg_id == token(1)
    assert body["type"] == "order.created" and body["id"] == token(1) and body["time"].endswith("Z")
    assert body["data"] == {"order_id": 1, "status": "open", "total": 10}


# -- helpers for the faults


class DiesAfterPublish:
    """A holder that publishes and dies before its result is written: the action stays EXECUTING under its
    lease, its trace (with the floor) written by the fence, as a process killed after the PubAck leaves it."""

    def __init__(self, adapter: NatsAdapter) -> None:
        self.adapter = adapter

    @property
    def kind(self) -> ActionKind:
        return self.adapter.kind

    async def execute(self, attempt: ActionAttempt) -> Result:
        result = await self.adapter.execute(attempt)
        assert isinstance(result, Done), result
        return Abandoned("the holder died after its publish")


async def publish_and_lose_the_lease(app: Engine, aengine: AsyncEngine, adapter: NatsAdapter, action_id: int) -> None:
    await Executor(aengine, [DiesAfterPublish(adapter)], listen=False).run(until_idle=True)
    with app.begin() as conn:
        state = conn.execute(text("SELECT state FROM agent_action WHERE id = :id"), {"id": action_id}).scalar_one()
        assert state == "EXECUTING"
        conn.execute(
            text("UPDATE agent_action SET lease_expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )


async def until_async(
    condition: Callable[[], Coroutine[Any, Any, bool]], seconds: float = 20.0, what: str = "condition"
) -> None:
    """Poll the coroutine `condition()` every 20 ms until it is true (tests.support.until, for the event loop)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.02)


def ids(messages: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return [msg_id for subject, msg_id, _ in messages if subject.startswith("orders.created.")]


def last_error(app: Engine, action_id: int) -> str:
    with app.connect() as conn:
        found = conn.execute(text("SELECT last_error FROM agent_action WHERE id = :id"), {"id": action_id})
        return str(found.scalar_one())


class _HeldAnswers:
    """The server's side of a relayed connection, read through: what it sends is dropped while held."""

    def __init__(self, source: asyncio.StreamReader, relay: HoldingRelay) -> None:
        self._source, self._relay = source, relay

    async def read(self, size: int = -1) -> bytes:
        while data := await self._source.read(size):
            if not self._relay.holding:
                return data
        return b""


class HoldingRelay(NetRelay):
    """A NetRelay that can hold the server's answers back (`holding`): a publish still reaches the server
    and is stored, its acknowledgement never arrives; a new connection never hears the server's INFO."""

    holding = False

    async def _pump(self, conn: Any, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        if sink is conn.client:
            source = _HeldAnswers(source, self)  # type: ignore[assignment]
        await super()._pump(conn, source, sink)


@pytest.fixture
def relay(nats_server: NatsServer) -> Iterator[HoldingRelay]:
    made = HoldingRelay("127.0.0.1", nats_server.port)
    yield made
    made.close()


# -- exactly once through the faults


async def test_a_repeated_msg_id_inside_the_window_is_done_as_a_duplicate(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url)
    nc = await nats.connect(nats_server.url, allow_reconnect=False)  # an earlier publish of the same event
    await nc.jetstream().publish(f"orders.created.{token(1)}", b"{}", headers={"Nats-Msg-Id": token(1)})
    await nc.close()
    action_id = enqueue(app, 1)
    await drain(aengine, [adapter])
    assert ended(app, action_id) == ("DONE", "CONFIRMED", 1, f"stream={STREAM} seq=1 duplicate")
    assert ids(await stored(nats_server.url)) == [token(1)]


async def test_a_reclaim_after_a_lost_lease_inside_the_window_reads_the_event_back(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url)
    action_id = enqueue(app, 1)
    await publish_and_lose_the_lease(app, aengine, adapter, action_id)
    await drain(aengine, [adapter])
    assert ended(app, action_id) == ("DONE", "CONFIRMED", 2, f"stream={STREAM} seq=1 read back")
    assert ids(await stored(nats_server.url)) == [token(1)]


async def test_a_reclaim_past_the_duplicate_window_reads_the_event_back(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url, duplicate_window=1.0)
    action_id = enqueue(app, 1)
    await publish_and_lose_the_lease(app, aengine, adapter, action_id)
    nc = await nats.connect(nats_server.url, allow_reconnect=False)
    js = nc.jetstream()

    async def probe() -> PubAck:
        return await js.publish("orders.probe", b"{}", headers={"Nats-Msg-Id": "probe"})

    await probe()  # published after the event: once it is no duplicate, the event's window is over

    async def window_passed() -> bool:
        return not (await probe()).duplicate

    await until_async(window_passed, what="the duplicate window to pass")
    await nc.close()
    await drain(aengine, [adapter])
    assert ended(app, action_id) == ("DONE", "CONFIRMED", 2, f"stream={STREAM} seq=1 read back")
    assert ids(await stored(nats_server.url)) == [token(1)]


async def test_the_server_killed_after_the_publish_and_restarted(
    app: Engine,
    aengine: AsyncEngine,
    nats_server: NatsServer,
    relay: HoldingRelay,
) -> None:
    await add_stream(nats_server.url)
    adapter = NatsAdapter(aengine, config(f"nats://127.0.0.1:{relay.port}"))
    try:
        await drain(aengine, [adapter])  # nothing to do; then a first event connects the adapter
        first = enqueue(app, 1)
        await drain(aengine, [adapter])
        assert ended(app, first)[0] == "DONE"
        relay.holding = True  # the next publish is stored, its acknowledgement lost
        action_id = enqueue(app, 2)
        run = asyncio.create_task(Executor(aengine, [adapter], listen=False).run(until_idle=True))

        async def stored_twice() -> bool:
            return len(await stored(nats_server.url)) == 2

        await until_async(stored_twice, what="the second event in the stream")
        nats_server.kill()  # before the acknowledgement reached the adapter
        await asyncio.wait_for(run, 30)
        state, reason, attempt, _ = ended(app, action_id)
        assert (state, reason, attempt) == ("ADMITTED", None, 1)  # cannot look: retried, the trace kept
        assert "read-back" in last_error(app, action_id)
        nats_server.restart()
        relay.holding = False
        await drain(aengine, [adapter])
    finally:
        await adapter.close()
    assert ended(app, action_id) == ("DONE", "CONFIRMED", 2, f"stream={STREAM} seq=2 read back")
    assert ids(await stored(nats_server.url)) == [token(1), token(2)]


async def test_an_unclear_publish_is_retried_and_the_last_attempt_ends_uncertain(
    app: Engine,
    aengine: AsyncEngine,
    nats_server: NatsServer,
    relay: HoldingRelay,
) -> None:
    await add_stream(nats_server.url)
    adapter = NatsAdapter(aengine, config(f"nats://127.0.0.1:{relay.port}"))
    try:
        first = enqueue(app, 1)
        await drain(aengine, [adapter])
        assert ended(app, first)[0] == "DONE"
        relay.blackhole()  # the publishes are lost, and so is every look
        retried, last = enqueue(app, 2), enqueue(app, 3, max_attempts=1)
        await Executor(aengine, [adapter], listen=False).run(until_idle=True)
        assert ended(app, retried)[:3] == ("ADMITTED", None, 1)
        assert ended(app, last)[:3] == ("UNCERTAIN", "PROVIDER_UNCERTAIN", 1)
        assert "the event may be in the stream" in last_error(app, last)
        relay.pass_()
        await drain(aengine, [adapter])
    finally:
        await adapter.close()
    # the second attempt looked (claimed before, although the Retry cleared the mark), found none, published
    assert ended(app, retried) == ("DONE", "CONFIRMED", 2, f"stream={STREAM} seq=2")
    assert ids(await stored(nats_server.url)) == [token(1), token(2)]


# -- the horizon, and a subject no stream takes


async def test_an_event_the_streams_max_age_removed_ends_uncertain(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url, max_age=1.0, duplicate_window=1.0)
    action_id = enqueue(app, 1)
    await publish_and_lose_the_lease(app, aengine, adapter, action_id)

    async def expired() -> bool:
        return not await stored(nats_server.url)

    await until_async(expired, what="the event to expire")
    await drain(aengine, [adapter])
    assert ended(app, action_id)[:3] == ("UNCERTAIN", "PROVIDER_UNCERTAIN", 2)
    assert "horizon" in last_error(app, action_id)
    assert await stored(nats_server.url) == []  # not published again


async def test_an_event_consumed_from_a_work_queue_ends_uncertain(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url, retention=RetentionPolicy.WORK_QUEUE)
    action_id = enqueue(app, 1)
    await publish_and_lose_the_lease(app, aengine, adapter, action_id)
    nc = await nats.connect(nats_server.url, allow_reconnect=False)
    consumer = await nc.jetstream().pull_subscribe("orders.>", durable="worker")
    [message] = await consumer.fetch(1, timeout=5)
    await message.ack_sync()
    await nc.close()
    await drain(aengine, [adapter])
    assert ended(app, action_id)[:3] == ("UNCERTAIN", "PROVIDER_UNCERTAIN", 2)
    assert "workqueue retention" in last_error(app, action_id)


async def test_a_subject_no_stream_takes_is_retried_and_nothing_is_published(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url, name="OTHER", subjects=["other.>"])
    action_id = enqueue(app, 1, max_attempts=2)
    await drain(aengine, [adapter])
    assert ended(app, action_id)[:3] == ("FAILED", "ATTEMPTS_EXHAUSTED", 2)
    assert "no stream takes" in last_error(app, action_id)
    assert await stored(nats_server.url, "OTHER") == []


async def test_an_order_gone_before_the_attempt_is_cancelled(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url)
    action_id = enqueue(app, 1)
    with app.begin() as conn:
        conn.execute(text("DELETE FROM app_order WHERE id = 1"))
    await drain(aengine, [adapter])
    assert ended(app, action_id)[:2] == ("CANCELLED", "NOT_WANTED")
    assert await stored(nats_server.url) == []


async def test_the_data_is_read_at_the_attempt_not_at_enqueue(
    app: Engine,
    aengine: AsyncEngine,
    adapter: NatsAdapter,
    nats_server: NatsServer,
) -> None:
    await add_stream(nats_server.url)
    enqueue(app, 1)
    with app.begin() as conn:
        conn.execute(text("UPDATE app_order SET status = 'paid' WHERE id = 1"))
    await drain(aengine, [adapter])
    [(_, _, body)] = await stored(nats_server.url)
    assert body["data"]["status"] == "paid"


async def test_data_grown_past_1_mib_fails_before_the_fence(
    app: Engine, aengine: AsyncEngine, adapter: NatsAdapter, nats_server: NatsServer
) -> None:
    await add_stream(nats_server.url)
    action_id = enqueue(app, 1)  # fits at enqueue
    with app.begin() as conn:
        conn.execute(text("UPDATE app_order SET status = repeat('x', 1100000) WHERE id = 1"))
    await drain(aengine, [adapter])
    assert ended(app, action_id)[:3] == ("FAILED", "PROVIDER_REFUSED", 1)
    assert "the limit is 1048576" in last_error(app, action_id)
    assert await stored(nats_server.url) == []


def test_an_event_with_nothing_to_publish_is_refused_at_enqueue(app: Engine) -> None:
    with app.begin() as conn, pytest.raises(InvalidRequest, match="nothing to publish now"):
        enqueue_event(conn, ORDER_CREATED, {"order_id": 99})


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ([], "payload"),
        ({"event_type": "order.created", "event": {"order_id": 1}, "extra": 1}, "payload"),
        ({"event_type": "no.such", "event": {}}, "payload.event_type"),
        ({"event_type": "order.created", "event": []}, "payload.event"),
        ({"event_type": "order.created", "event": {}}, "payload.event"),
        ({"event_type": "order.created", "event": {"order_id": "x"}}, "payload.event"),
    ],
)
def test_the_payload_check_names_what_is_wrong(payload: Any, field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_payload(payload)
    assert refused.value.field == field


_TOKEN = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=8)


@given(st.lists(_TOKEN, min_size=1, max_size=MAX_SUBJECT_TOKENS - 1), st.text(min_size=1, max_size=40))
def test_a_valid_subject_gets_the_events_id_as_its_last_token(tokens: list[str], key: str) -> None:
    subject = ".".join(tokens)[:MAX_SUBJECT_LENGTH].strip(".")
    assume(subject and all(subject.split(".")))
    full = message_subject(subject, event_token(key))
    assert full == f"{subject}.{event_token(key)}" and full.count(".") == subject.count(".") + 1
    assert event_token(key) == event_token(key) and len(event_token(key)) == 32


@given(st.text(max_size=60))
def test_a_subject_is_accepted_only_as_dot_separated_safe_tokens(subject: str) -> None:
    tokens = subject.split(".")
    valid = (
        0 < len(subject) <= MAX_SUBJECT_LENGTH
        and len(tokens) <= MAX_SUBJECT_TOKENS
        and all(token and set(token) <= set(string.ascii_letters + string.digits + "-_") for token in tokens)
        and not subject.startswith("_INBOX")
    )
    if valid:
        assert check_subject(subject) == subject
    else:
        with pytest.raises(InvalidEvent) as refused:
            check_subject(subject)
        assert refused.value.field == "subject"


@pytest.mark.parametrize(
    "subject", ["orders.*", "orders.>", "orders..created", " orders", "$JS.API.STREAM", "_INBOX.x", "", "a.b c"]
)
def test_a_wildcard_an_empty_token_or_a_reserved_subject_is_refused(subject: str) -> None:
    with pytest.raises(InvalidEvent):
        check_subject(subject)


@given(st.text(max_size=80))
def test_an_event_type_is_letters_digits_dots_dashes_and_underscores(name: str) -> None:
    allowed = set(string.ascii_letters + string.digits + "._-")
    valid = 0 < len(name) <= 64 and set(name) <= allowed and name[0].isalnum() and name[0].isascii()
    if valid:
        assert check_event_type(name) == name
    else:
        with pytest.raises(InvalidEvent):
            check_event_type(name)


@given(
    st.dictionaries(
        st.text(max_size=5),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.text(), lambda c: st.lists(c, max_size=3), max_leaves=5
        ),
        max_size=4,
    )
)
def test_a_body_is_compact_json_or_a_clear_refusal(data: dict[str, Any]) -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    try:
        body = message_body("order.created", "t" * 32, data, at)
    except InvalidEvent as refused:
        assert refused.field == "data"
        return
    decoded = json.loads(body)
    assert decoded["type"] == "order.created" and decoded["time"] == "2026-12-01T00:00:00.000Z"
    assert b" " not in body.replace(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode(), b"")


@given(st.text(alphabet=string.printable, min_size=4, max_size=20))
def test_a_urls_password_is_never_shown(password: str) -> None:
    url = f"nats://user:{password}@127.0.0.1:1"
    assert shown_url(url) == f"nats://user:{MASK}@127.0.0.1:1"
    masked = f"nats://user:{MASK}@127.0.0.1:1"
    try:
        configured = NatsConfig(servers=(url,))
    except NatsSettingsError as refused:  # the URL appears only masked, or not at all
        said = str(refused)
        assert repr(masked) in said or ("127.0.0.1" not in said and "user" not in said)
    else:
        assert configured.shown == masked
        assert repr(configured) == f"NatsConfig(servers={masked!r}, credentials=None)"


@pytest.mark.parametrize(
    "value",
    [
        "",
        "http://127.0.0.1:1",
        "nats://",
        "nats://127.0.0.1:1/path",
        "nats://127.0.0.1:99999",
        "nats://a b",
        "nats://h:1,",
    ],
)
def test_a_bad_nats_url_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(NatsSettingsError, match="OUTBOX_NATS_URL"):
        NatsConfig(servers=parse_servers(value) if value else ())


# -- outbox nats ensure-stream


def test_ensure_stream_creates_the_stream_then_finds_it_serves_read_back(
    cli: Callable[..., CliResult], nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_NATS_URL", nats_server.url)
    created = cli("nats", "ensure-stream", "--stream", STREAM, "--subject", "orders.>", "--max-age", "7d")
    assert created.code == 0 and "created stream ORDERS" in created.out
    info = asyncio.run(stream_info(nats_server.url))
    assert (info.config.retention, info.config.storage) == ("limits", "file")
    assert (info.config.duplicate_window, info.config.max_age) == (120.0, 7 * 86_400.0)
    again = cli("nats", "ensure-stream", "--stream", STREAM, "--subject", "orders.created.*")
    assert again.code == 0 and "exists and takes orders.created.*" in again.out
    assert "note: stream ORDERS: max age is 604800 s, asked unlimited" in again.out


def test_ensure_stream_says_what_read_back_misses_and_changes_nothing(
    cli: Callable[..., CliResult], nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_NATS_URL", nats_server.url)
    asyncio.run(add_stream(nats_server.url, retention=RetentionPolicy.WORK_QUEUE))
    checked = cli("nats", "ensure-stream", "--stream", STREAM, "--subject", "orders.>", "--subject", "refunds.>")
    assert checked.code == 1
    assert "retention is workqueue, read-back needs limits" in checked.out
    assert "subject refunds.> is not among the stream's subjects (orders.>)" in checked.out
    info = asyncio.run(stream_info(nats_server.url))
    assert info.config.retention == "workqueue" and info.config.subjects == ["orders.>"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--stream", "OR.DERS", "--subject", "orders.>"], "--stream: 'OR.DERS' must be"),
        (["--stream", STREAM, "--subject", "orders.created"], "takes no event"),
        (["--stream", STREAM, "--subject", "orders.>.x"], "'>' only as the last"),
        (["--stream", STREAM, "--subject", ">"], "not alone"),
        (["--stream", STREAM, "--subject", "orders.>", "--duplicate-window", "soon"], "--duplicate-window"),
        (["--stream", STREAM, "--subject", "orders.>", "--max-age", "1s"], "--max-age: at least"),
    ],
)
def test_ensure_stream_refuses_bad_input_in_one_line(
    cli: Callable[..., CliResult], nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    monkeypatch.setenv("OUTBOX_NATS_URL", nats_server.url)
    refused = cli("nats", "ensure-stream", *args)
    assert refused.code == 2 and said in refused.err and len(refused.err.strip().splitlines()) == 1
    assert asyncio.run(stream_names(nats_server.url)) == []


def test_ensure_stream_names_an_unreachable_server_without_its_password(
    cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("OUTBOX_NATS_URL", f"nats://app:s3cret-pw@127.0.0.1:{port}")
    failed = cli("nats", "ensure-stream", "--stream", STREAM, "--subject", "orders.>")
    assert failed.code == 1 and len(failed.err.strip().splitlines()) == 1
    assert f"cannot reach NATS at nats://app:***@127.0.0.1:{port}" in failed.err
    assert "s3cret" not in failed.err + failed.out


async def stream_info(url: str) -> StreamInfo:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        return await nc.jetstream().stream_info(STREAM)
    finally:
        await nc.close()


async def stream_names(url: str) -> list[str]:
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        return [info.config.name or "" for info in await nc.jetstream().streams_info()]
    finally:
        await nc.close()


async def test_the_adapter_connects_to_the_first_server_of_its_list_that_answers(
    app: Engine, aengine: AsyncEngine, nats_server: NatsServer
) -> None:
    await add_stream(nats_server.url)
    dead = f"nats://127.0.0.1:{free_port()}"
    adapter = NatsAdapter(aengine, NatsConfig(servers=(dead, nats_server.url), publish_timeout_seconds=1))
    try:
        action_id = enqueue(app, 1)
        await drain(aengine, [adapter])
    finally:
        await adapter.close()
    assert ended(app, action_id)[:2] == ("DONE", "CONFIRMED")


async def test_a_server_that_cannot_be_reached_is_retried_and_nothing_is_claimed_sent(
    app: Engine, aengine: AsyncEngine
) -> None:
    adapter = NatsAdapter(aengine, config(f"nats://app:s3cret-pw@127.0.0.1:{free_port()}"))
    action_id = enqueue(app, 1, max_attempts=1)
    await drain(aengine, [adapter])
    assert ended(app, action_id)[:3] == ("FAILED", "ATTEMPTS_EXHAUSTED", 1)  # epoch 1: nothing was ever sent
    error = last_error(app, action_id)
    assert error.startswith("connect: cannot reach NATS") and "s3cret" not in error


def test_the_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    creds = tmp_path / "app.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\n")
    monkeypatch.setenv("OUTBOX_NATS_URL", " nats://a:pw-one@h1:4223 , nats://h2 ")
    monkeypatch.setenv("OUTBOX_NATS_CREDENTIALS", str(creds))
    monkeypatch.setenv("OUTBOX_NATS_PUBLISH_TIMEOUT_SECONDS", "3")
    loaded = load_config()
    assert loaded.servers == ("nats://a:pw-one@h1:4223", "nats://h2") and loaded.credentials == creds
    assert loaded.publish_timeout_seconds == 3 and "pw-one" not in repr(loaded)
    monkeypatch.delenv("OUTBOX_NATS_URL")
    with pytest.raises(NatsSettingsError, match="OUTBOX_NATS_URL is not set"):
        load_config()


def test_a_rows_timestamps_numerics_and_uuids_are_written_as_postgresql_gives_them() -> None:
    at = datetime(2026, 12, 1, 9, 42, 14, 618000, tzinfo=UTC)
    data = {"at": at, "total": Decimal("19.90"), "ref": UUID(int=1), "day": at.date()}
    decoded = json.loads(message_body("order.created", "t" * 32, data, at))
    assert decoded["data"] == {
        "at": "2026-12-01T09:42:14.618000+00:00",
        "total": "19.90",
        "ref": "00000000-0000-0000-0000-000000000001",
        "day": "2026-12-01",
    }
    for refused in ({"n": Decimal("NaN")}, {"b": b"bytes"}, {"f": float("inf")}):
        with pytest.raises(InvalidEvent, match="data"):
            message_body("order.created", "t" * 32, refused, at)


async def test_enqueue_event_async_enqueues_once_per_key(app: Engine, aengine: AsyncEngine) -> None:
    async with aengine.begin() as conn:
        first = await enqueue_event_async(conn, ORDER_CREATED, {"order_id": 3})
        again = await enqueue_event_async(conn, ORDER_CREATED, {"order_id": 3})
    assert first.id == again.id and first.payload == {"event_type": "order.created", "event": {"order_id": 3}}


def test_a_raw_enqueue_of_a_bad_nats_payload_is_refused(app: Engine) -> None:
    request = ActionRequest(
        kind=ActionKind.NATS_EVENT, lane_key="l", idempotency_key="k", payload={"event_type": "order.created"}
    )
    with app.begin() as conn, pytest.raises(InvalidRequest, match=r"payload\.event"):
        outbox.enqueue(conn, request)
