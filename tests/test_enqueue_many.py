"""enqueue_many: a batch of actions in the caller's transaction, in one round trip, in request order."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from outbox import ActionRequest, InvalidRequest
from tests import kinds
from tests.support import waiting_on_a_lock


def request(key: str, lane: str = "lane", **changes: Any) -> ActionRequest:
    values: dict[str, Any] = {
        "kind": kinds.NOOP,
        "workspace_id": 7,
        "lane_key": lane,
        "idempotency_key": key,
        "payload": {"key": key},
    }
    values.update(changes)
    return ActionRequest(**values)


def rows(engine: Engine) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT id, lane_key, idempotency_key FROM agent_action ORDER BY id"))
        return [(r.id, r.lane_key, r.idempotency_key) for r in found]


def statements_of(engine: Engine) -> list[str]:
    """Every statement the engine sends from now on (a listener on the real driver's cursor)."""
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: sent.append(statement))
    return sent


def test_a_batch_is_one_round_trip_in_request_order(engine: Engine) -> None:
    batch = [request(f"k{i}", lane=f"lane-{i % 3}") for i in range(100)]
    sent = statements_of(engine)
    with engine.begin() as conn:
        sent.clear()
        actions = outbox.enqueue_many(conn, batch)
        assert len(sent) == 1
    assert [a.idempotency_key for a in actions] == [r.idempotency_key for r in batch]
    assert [a.id for a in actions] == sorted(a.id for a in actions)  # each lane runs in the order given
    assert len(rows(engine)) == 100


def test_a_repeated_key_in_the_batch_or_before_it_returns_the_first_action(engine: Engine) -> None:
    with engine.begin() as conn:
        earlier = outbox.enqueue(conn, request("old"))
    with engine.begin() as conn:
        actions = outbox.enqueue_many(
            conn, [request("new"), request("old", payload={"x": 1}), request("new", payload={"y": 2})]
        )
    assert actions[1] == earlier
    assert actions[2] == actions[0] and actions[0].payload == {"key": "new"}
    assert [key for _, _, key in rows(engine)] == ["old", "new"]
    # only the first request of a new key created its action; the others say what they held otherwise
    assert [(a.created, a.differing_fields) for a in actions] == [
        (True, ()),
        (False, ("payload",)),
        (False, ("payload",)),
    ]


def test_each_request_of_a_reused_key_that_differs_is_logged_once(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="outbox")
    with engine.begin() as conn:
        outbox.enqueue(conn, request("old"))
        caplog.clear()
        outbox.enqueue_many(conn, [request("old"), request("old", lane="elsewhere"), request("new"), request("new")])
    lines = [r for r in caplog.records if r.name.startswith("outbox")]
    assert [(r.levelno, r.name) for r in lines] == [(logging.WARNING, "outbox.enqueue")]
    assert "'old'" in lines[0].getMessage() and "differs in lane_key;" in lines[0].getMessage()


def test_one_bad_request_writes_nothing_and_names_its_position(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(InvalidRequest) as refused:
            outbox.enqueue_many(conn, [request("a"), request("b", lane_key=""), request("c")])
        assert refused.value.field == "requests[1].lane_key"
        outbox.enqueue(conn, request("after"))  # the caller's transaction is still usable
    assert [key for _, _, key in rows(engine)] == ["after"]


def test_an_expired_request_writes_nothing_and_names_its_position(engine: Engine) -> None:
    past = datetime.now(UTC) - timedelta(minutes=1)
    future = datetime.now(UTC) + timedelta(hours=1)
    with engine.begin() as conn:
        with pytest.raises(InvalidRequest) as refused:
            outbox.enqueue_many(conn, [request("a", expires_at=future), request("b", expires_at=past)])
        assert refused.value.field == "requests[1].expires_at"
        assert "has already passed (database clock" in refused.value.message
        with pytest.raises(InvalidRequest) as single:
            outbox.enqueue(conn, request("c", expires_at=past))
        assert single.value.field == "expires_at"
    assert rows(engine) == []


@pytest.mark.parametrize("requests", ["not a list", request("one"), None, 7])
def test_a_batch_that_is_not_a_sequence_of_requests_is_refused(engine: Engine, requests: Any) -> None:
    with engine.begin() as conn, pytest.raises(InvalidRequest) as refused:
        outbox.enqueue_many(conn, requests)
    assert refused.value.field.startswith("requests")
    assert rows(engine) == []


def test_an_empty_batch_sends_nothing(engine: Engine) -> None:
    sent = statements_of(engine)
    with engine.begin() as conn:
        sent.clear()
        assert outbox.enqueue_many(conn, []) == []
        assert sent == []


async def test_enqueue_many_async_mirrors_enqueue_many(aengine: AsyncEngine) -> None:
    async with aengine.begin() as conn:
        first = await outbox.enqueue_many_async(conn, [request("a"), request("b")])
        again = await outbox.enqueue_many_async(conn, [request("b"), request("a")])
    assert again == first[::-1]


def test_a_racing_duplicate_in_a_batch_returns_the_winner(engine: Engine) -> None:
    results: list[list[outbox.Action]] = []
    with engine.connect() as first:
        winner = outbox.enqueue(first, request("contested", payload={"by": "first"}))

        def second_transaction() -> None:
            with engine.begin() as conn:
                results.append(outbox.enqueue_many(conn, [request("mine"), request("contested")]))

        with waiting_on_a_lock(engine, second_transaction, "the batch to wait on the uncommitted key"):
            first.commit()
    mine, contested = results[0]
    assert contested == winner and contested.payload == {"by": "first"}
    assert mine.idempotency_key == "mine"
    assert len(rows(engine)) == 2


KEYS = st.sampled_from([f"key-{i}" for i in range(12)])
LANES = st.sampled_from(["a", "b", "c"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(st.tuples(KEYS, LANES), max_size=5), batch=st.lists(st.tuples(KEYS, LANES), max_size=30))
def test_every_batch_maps_each_key_to_its_first_action(
    engine: Engine, before: list[tuple[str, str]], batch: list[tuple[str, str]]
) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
        outbox.enqueue_many(conn, [request(k, lane) for k, lane in before])
    existing = {key: (id_, lane) for id_, lane, key in rows(engine)}
    with engine.begin() as conn:
        actions = outbox.enqueue_many(conn, [request(k, lane) for k, lane in batch])
    assert [a.idempotency_key for a in actions] == [k for k, _ in batch]
    first_lane: dict[str, str] = {}
    for (key, lane), action in zip(batch, actions, strict=True):
        created = key not in existing and key not in first_lane
        first_lane.setdefault(key, existing[key][1] if key in existing else lane)
        assert action.lane_key == first_lane[key]  # the first request (or row) with the key wins
        assert action.created is created
        assert action.differing_fields == (() if lane == first_lane[key] else ("lane_key",))
        if key in existing:
            assert action.id == existing[key][0]
    firsts = {a.idempotency_key: a.id for a in reversed(actions) if a.idempotency_key not in existing}
    new_ids = [firsts[k] for k in dict.fromkeys(k for k, _ in batch) if k in firsts]
    assert new_ids == sorted(new_ids)  # inserted in request order
    assert len(rows(engine)) == len(set(existing) | {k for k, _ in batch})
