"""The NATS_EVENT kind against a real nats-server with JetStream (tests/nats_server.py) and the real PostgreSQL.

    enqueue_event (the test's order table) ─▶ drain ─▶ NatsAdapter ─▶ [relay] ─▶ nats-server (stream ORDERS)

Each test enqueues, drains (or runs one executor pass), and asserts the action's end and what the stream
holds: every event exactly once by Nats-Msg-Id, through lost leases inside and past the duplicate window,
a server killed after the publish, an unclear publish, and the read-back horizon.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import nats
import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from sqlalchemy import Engine, TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import Abandoned, ActionAttempt, Done, Executor, Result
from outbox.kinds import ActionKind
from outbox.nats import NatsAdapter, NatsConfig, NatsEvent, enqueue_event, event_token, register
from outbox.testing import drain
from tests import nats_server as served
from tests.chaos.netrelay import NetRelay
from tests.nats_server import NatsServer

nats_server = served.nats_server  # the fixture

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


ORDER_CREATED = register(OrderCreated())


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
    probe = {"subject": "orders.probe", "payload": b"{}", "headers": {"Nats-Msg-Id": "probe"}}
    await js.publish(**probe)  # published after the event: once it is no duplicate, the event's window is over

    async def window_passed() -> bool:
        return not (await js.publish(**probe)).duplicate

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
