"""Enqueue on a plain psycopg 3 connection, sync and async: inside the caller's transaction, same guarantees.

A framework's connection may load `jsonb` as text and timestamps without a zone (Django does); outbox reads
through loaders of its own, so the action reads the same as through SQLAlchemy.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.string import TextLoader
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

import outbox
from outbox import ActionRequest, ActionState, InvalidRequest, OutboxError
from tests.test_enqueue import request as enqueue_request


def request(**changes: Any) -> ActionRequest:
    """The enqueue tests' request, with a `%` in its payload (psycopg's placeholder character)."""
    return enqueue_request(**{"payload": {"account_id": 42, "note": "50% off"}, **changes})


def libpq_url(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def actions(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text("SELECT idempotency_key, state FROM agent_action ORDER BY id"))]


def test_a_rollback_leaves_no_action_and_a_commit_leaves_one(database_url: str, engine: Engine) -> None:
    with psycopg.connect(libpq_url(database_url)) as conn:
        outbox.enqueue(conn, request(idempotency_key="rolled-back"))
        conn.rollback()
        first = outbox.enqueue(conn, request())
        again = outbox.enqueue(conn, request(lane_key="elsewhere"))  # the same key: the first action
        conn.commit()
    assert actions(engine) == [("welcome:7", "ADMITTED")]
    assert again == first and first.state is ActionState.ADMITTED
    assert first.payload == {"account_id": 42, "note": "50% off"}


def test_the_action_reads_the_same_whatever_loaders_the_connection_has(database_url: str, engine: Engine) -> None:
    expires = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(libpq_url(database_url)) as conn:
        conn.adapters.register_loader("jsonb", TextLoader)  # as Django registers it
        conn.adapters.register_loader("timestamptz", TextLoader)
        action = outbox.enqueue(conn, request(expires_at=expires))
        conn.commit()
        assert conn.execute("SELECT payload FROM agent_action").fetchone() == ('{"note": "50% off", "account_id": 42}',)
    with engine.begin() as sa_conn:
        assert outbox.enqueue(sa_conn, request()) == action
    assert action.payload == {"account_id": 42, "note": "50% off"}
    assert action.expires_at == expires and action.created_at.tzinfo is not None


def test_an_autocommit_connection_without_a_transaction_is_refused(database_url: str, engine: Engine) -> None:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        with pytest.raises(OutboxError, match="autocommit"):
            outbox.enqueue(conn, request())
        assert actions(engine) == []
        with conn.transaction():
            outbox.enqueue(conn, request())
    assert actions(engine) == [("welcome:7", "ADMITTED")]


def test_bad_input_leaves_the_callers_transaction_usable(database_url: str, engine: Engine) -> None:
    with psycopg.connect(libpq_url(database_url)) as conn:
        conn.execute("CREATE TABLE invoice (id int PRIMARY KEY)")
        conn.execute("INSERT INTO invoice VALUES (1)")
        with pytest.raises(InvalidRequest) as refused:
            outbox.enqueue(conn, request(lane_key=""))
        assert refused.value.field == "lane_key"
        outbox.enqueue(conn, request())
        conn.commit()
    with engine.connect() as sa_conn:
        assert sa_conn.execute(text("SELECT count(*) FROM invoice")).scalar_one() == 1
    assert actions(engine) == [("welcome:7", "ADMITTED")]


def test_a_connection_of_another_kind_is_named_in_the_error(database_url: str) -> None:
    with pytest.raises(TypeError, match="not AsyncConnection"):
        outbox.enqueue(psycopg.AsyncConnection.__new__(psycopg.AsyncConnection), request())  # type: ignore[arg-type]


async def test_enqueue_async_on_a_psycopg_async_connection(database_url: str, engine: Engine) -> None:
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url)) as conn:
        await outbox.enqueue_async(conn, request(idempotency_key="rolled-back"))
        await conn.rollback()
        action = await outbox.enqueue_async(conn, request())
        await conn.commit()
    assert actions(engine) == [("welcome:7", "ADMITTED")]
    assert action.payload == {"account_id": 42, "note": "50% off"}
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True) as conn:
        with pytest.raises(OutboxError, match="autocommit"):
            await outbox.enqueue_async(conn, request(idempotency_key="alone"))
