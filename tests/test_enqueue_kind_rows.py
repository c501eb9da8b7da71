"""Enqueue refuses a kind whose row in agent_action_kind is missing or declares it otherwise than the code.

The refusal is an InvalidRequest naming `kind` (or `requests[i].kind`) with the step to take, raised before
the foreign key or the guard could refuse anything: nothing is written and the caller's transaction goes on.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from examples.accounts import notices, schema
from outbox import ActionKind, ActionRequest, InvalidRequest
from outbox._internal.checks.kind_rows import KindRow, mismatch
from outbox.email import enqueue_email
from tests import kinds

ROWLESS = kinds.ROWLESS

FLAGS = ("at_most_once", "instance_level", "workspace_level")
# every row the table accepts (a kind runs somewhere) that declares NOOP otherwise than the code
DIFFERING_ROWS = [
    KindRow(*flags)
    for flags in itertools.product((False, True), repeat=3)
    if (flags[1] or flags[2]) and KindRow(*flags) != KindRow(False, False, True)
]


def request(key: str, kind: ActionKind = kinds.NOOP, **changes: Any) -> ActionRequest:
    values: dict[str, Any] = {"kind": kind, "workspace_id": 7, "lane_key": "lane", "idempotency_key": key}
    return ActionRequest(payload={}, **(values | changes))


def set_row(engine: Engine, name: str, row: KindRow) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE agent_action_kind SET at_most_once = :at_most_once, instance_level = :instance_level,"
                " workspace_level = :workspace_level WHERE name = :name"
            ),
            {"name": name, **{flag: getattr(row, flag) for flag in FLAGS}},
        )


def keys(conn: Connection) -> list[str]:
    return list(conn.execute(text("SELECT idempotency_key FROM agent_action ORDER BY id")).scalars())


def committed_keys(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return keys(conn)


def test_a_kind_without_its_row_is_refused_by_name_and_the_transaction_goes_on(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE invoice (id int PRIMARY KEY)"))
        conn.execute(text("INSERT INTO invoice VALUES (1)"))
        with pytest.raises(InvalidRequest) as refused:
            outbox.enqueue(conn, request("rowless", ROWLESS))
        assert refused.value.field == "kind"
        assert refused.value.message == mismatch(ROWLESS, None)
        assert "TEST_ROWLESS has no row in agent_action_kind" in str(refused.value)
        assert "declare_kinds" in str(refused.value)
        assert keys(conn) == []
        outbox.enqueue(conn, request("valid"))
        conn.commit()
    assert committed_keys(engine) == ["valid"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM invoice")).scalar_one() == 1


@pytest.mark.parametrize("row", DIFFERING_ROWS, ids=str)
def test_a_kind_whose_row_differs_is_refused_before_the_guard(engine: Engine, row: KindRow) -> None:
    set_row(engine, kinds.NOOP.name, row)
    with engine.connect() as conn:
        with pytest.raises(InvalidRequest) as refused:
            outbox.enqueue(conn, request("differs"))
        assert refused.value.field == "kind"
        assert refused.value.message == mismatch(kinds.NOOP, row)
        assert keys(conn) == []
        outbox.enqueue(conn, request("valid", kinds.READBACK, workspace_id=None))
        conn.commit()
    assert committed_keys(engine) == ["valid"]


def test_a_row_the_guard_would_refuse_the_action_by_is_refused_by_name(engine: Engine) -> None:
    # READBACK runs at instance level only; its row now says the opposite, so the guard would raise
    set_row(engine, kinds.READBACK.name, KindRow(at_most_once=False, instance_level=False, workspace_level=True))
    with engine.connect() as conn:
        with pytest.raises(InvalidRequest, match="instance_level=false \\(the code: true\\)") as refused:
            outbox.enqueue(conn, request("guarded", kinds.READBACK, workspace_id=None))
        assert refused.value.field == "kind"
        outbox.enqueue(conn, request("valid"))
        conn.commit()
    assert committed_keys(engine) == ["valid"]


@pytest.mark.parametrize("position", [0, 1, 2])
def test_a_batch_with_a_rowless_kind_writes_nothing_and_names_its_position(engine: Engine, position: int) -> None:
    batch = [request(f"k{i}") for i in range(3)]
    batch[position] = request("rowless", ROWLESS)
    with engine.connect() as conn:
        with pytest.raises(InvalidRequest) as refused:
            outbox.enqueue_many(conn, batch)
        assert refused.value.field == f"requests[{position}].kind"
        assert refused.value.message == mismatch(ROWLESS, None)
        assert keys(conn) == []
        outbox.enqueue_many(conn, [request("valid")])
        conn.commit()
    assert committed_keys(engine) == ["valid"]


def test_a_batch_names_the_first_request_whose_kind_row_differs(engine: Engine) -> None:
    row = KindRow(at_most_once=True, instance_level=False, workspace_level=True)
    set_row(engine, kinds.NOOP.name, row)
    batch = [request("a", kinds.READBACK, workspace_id=None), request("b"), request("c", ROWLESS), request("d")]
    with engine.connect() as conn:
        with pytest.raises(InvalidRequest) as refused:
            outbox.enqueue_many(conn, batch)
        assert (refused.value.field, refused.value.message) == ("requests[1].kind", mismatch(kinds.NOOP, row))
        assert keys(conn) == []
        outbox.enqueue_many(conn, [batch[0]])
        conn.commit()
    assert committed_keys(engine) == ["a"]


def test_a_kind_row_is_checked_before_an_expiry(engine: Engine) -> None:
    past = datetime(2000, 1, 1, tzinfo=UTC)
    with engine.connect() as conn, pytest.raises(InvalidRequest) as refused:
        outbox.enqueue_many(conn, [request("old", expires_at=past), request("rowless", ROWLESS)])
    assert refused.value.field == "requests[1].kind"


async def test_the_async_enqueues_refuse_a_rowless_kind_and_the_transaction_goes_on(
    aengine: AsyncEngine, engine: Engine
) -> None:
    async with aengine.connect() as conn:
        with pytest.raises(InvalidRequest) as alone:
            await outbox.enqueue_async(conn, request("rowless", ROWLESS))
        with pytest.raises(InvalidRequest) as batched:
            await outbox.enqueue_many_async(conn, [request("a"), request("rowless", ROWLESS)])
        assert (alone.value.field, batched.value.field) == ("kind", "requests[1].kind")
        await outbox.enqueue_async(conn, request("valid"))
        await conn.commit()
    assert committed_keys(engine) == ["valid"]


def test_enqueue_email_refuses_when_emails_row_differs(engine: Engine) -> None:
    row = KindRow(at_most_once=False, instance_level=True, workspace_level=True)
    set_row(engine, ActionKind.EMAIL.name, row)
    with engine.connect() as conn:
        schema.create(conn)
        conn.execute(text("INSERT INTO app_account VALUES (4, 'Carol', 'carol@example.com', false)"))
        with pytest.raises(InvalidRequest) as refused:
            enqueue_email(conn, notices.VERIFY_ADDRESS, {"account_id": 4})
        assert (refused.value.field, refused.value.message) == ("kind", mismatch(ActionKind.EMAIL, row))
        outbox.enqueue(conn, request("valid"))
        conn.commit()
    assert committed_keys(engine) == ["valid"]
