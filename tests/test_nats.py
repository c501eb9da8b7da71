"""The NATS_EVENT kind against a real nats-server with JetStream (tests/nats_server.py) and the real PostgreSQL.

    enqueue_event (the test's order table) ─▶ drain ─▶ NatsAdapter ─▶ [relay] ─▶ nats-server (stream ORDERS)

Each test enqueues, drains (or runs one executor pass), and asserts the action's end and what the stream
holds: every event exactly once by Nats-Msg-Id, through lost leases inside and past the duplicate window,
a server killed after the publish, an unclear publish, and the read-back horizon.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

import nats
import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from sqlalchemy import Engine, TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.nats import NatsAdapter, NatsConfig, NatsEvent, enqueue_event, event_token, register
from outbox.testing import drain
from tests.nats_server import NatsServer, nats_server  # noqa: F401 (the fixture)

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
async def adapter(aengine: AsyncEngine, nats_server: NatsServer) -> AsyncIterator[NatsAdapter]:  # noqa: F811
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
    nats_server: NatsServer,  # noqa: F811
) -> None:
    await add_stream(nats_server.url)
    action_id = enqueue(app, 1)
    await drain(aengine, [adapter])
    assert ended(app, action_id) == ("DONE", "CONFIRMED", 1, f"stream={STREAM} seq=1")
    [(subject, msg_id, body)] = await stored(nats_server.url)
    assert subject == f"orders.created.{token(1)}" and msg_id == token(1)
    assert body["type"] == "order.created" and body["id"] == token(1) and body["time"].endswith("Z")
    assert body["data"] == {"order_id": 1, "status": "open", "total": 10}
