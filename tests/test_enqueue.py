"""Enqueue inside the caller's transaction: atomicity, idempotency under a race, proposals, bad input."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

import outbox
from outbox import ActionKind, ActionRequest, ActionState, InvalidRequest, StopReason
from outbox.requests import MAX_PAYLOAD_BYTES
from tests import kinds
from tests.support import sessions_waiting_on_a_lock, until


def request(**changes: Any) -> ActionRequest:
    values: dict[str, Any] = {
        "kind": kinds.NOOP,
        "workspace_id": 7,
        "lane_key": "workspace:7",
        "idempotency_key": "welcome:7",
        "payload": {"account_id": 42},
    }
    values.update(changes)
    return ActionRequest(**values)


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one())


def test_the_action_exists_exactly_when_the_callers_change_commits(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE invoice (id int PRIMARY KEY)"))
        conn.commit()
        conn.execute(text("INSERT INTO invoice VALUES (1)"))
        outbox.enqueue(conn, request(idempotency_key="invoice:1"))
        conn.rollback()
    assert count(engine) == 0
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO invoice VALUES (1)"))
        action = outbox.enqueue(conn, request(idempotency_key="invoice:1"))
    assert count(engine) == 1
    assert action.state is ActionState.ADMITTED and action.attempt == 0 and action.epoch == 0
    assert action.payload == {"account_id": 42}


def test_enqueue_works_through_an_orm_session(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        action = outbox.enqueue(session, request())
    assert action.kind == kinds.NOOP.name and count(engine) == 1


async def test_enqueue_async_mirrors_enqueue(aengine: AsyncEngine) -> None:
    async with aengine.begin() as conn:
        first = await outbox.enqueue_async(conn, request())
        again = await outbox.enqueue_async(conn, request(payload={"other": True}))
    assert again == first


def test_a_repeated_idempotency_key_returns_the_first_action_and_changes_nothing(engine: Engine) -> None:
    with engine.begin() as conn:
        first = outbox.enqueue(conn, request())
    with engine.begin() as conn:
        again = outbox.enqueue(conn, request(payload={"different": 1}, lane_key="elsewhere", max_attempts=9))
    assert again == first
    assert count(engine) == 1


def test_two_transactions_racing_with_one_key_get_one_row_and_no_error(engine: Engine) -> None:
    results: list[outbox.Action] = []
    errors: list[BaseException] = []
    second_started = threading.Event()

    with engine.connect() as first:
        winner = outbox.enqueue(first, request(payload={"by": "first"}))

        def second_transaction() -> None:
            try:
                with engine.begin() as conn:
                    # show we are about to block on the first transaction's uncommitted key
                    second_started.set()
                    results.append(outbox.enqueue(conn, request(payload={"by": "second"})))
            except BaseException as error:  # reported to the main thread below
                errors.append(error)

        thread = threading.Thread(target=second_transaction)
        thread.start()
        assert second_started.wait(10)
        # the second insert now waits on our uncommitted key; see it wait before committing
        until(lambda: sessions_waiting_on_a_lock(engine) == 1, what="the second enqueue to wait")
        first.commit()
        thread.join(10)
    assert not errors
    assert results == [winner] and winner.payload == {"by": "first"}
    assert count(engine) == 1


def test_a_proposal_waits_until_admitted(engine: Engine) -> None:
    with engine.begin() as conn:
        proposal = outbox.enqueue(conn, request(proposed=True))
        assert proposal.state is ActionState.PROPOSED
        admitted = outbox.admit(conn, proposal.id)
    assert admitted.state is ActionState.ADMITTED


def test_a_refused_proposal_ends_cancelled(engine: Engine) -> None:
    with engine.begin() as conn:
        proposal = outbox.enqueue(conn, request(proposed=True))
        refused = outbox.refuse(conn, proposal.id)
        assert refused.state is ActionState.CANCELLED
        assert refused.stop_reason is StopReason.PROPOSAL_REFUSED
        assert refused.payload is None and refused.ended_at is not None
        with pytest.raises(outbox.TransitionRefused, match="is CANCELLED; it cannot become ADMITTED"):
            outbox.admit(conn, proposal.id)
        with pytest.raises(outbox.ActionNotFound, match="action 999999 does not exist"):
            outbox.refuse(conn, 999_999)


PAST = datetime.now(UTC) - timedelta(minutes=1)

BAD_INPUTS = [
    ({"kind": "SMOKE_SIGNAL"}, "kind", "unknown action kind 'SMOKE_SIGNAL'"),
    ({"kind": ActionKind("UNREGISTERED", False, True)}, "kind", "unknown action kind 'UNREGISTERED'"),
    ({"kind": kinds.READBACK, "workspace_id": 7}, "workspace_id", "instance-level; it takes no workspace_id"),
    ({"kind": kinds.NOOP, "workspace_id": None}, "workspace_id", "workspace_id is missing"),
    ({"workspace_id": -3}, "workspace_id", "positive 64-bit integer"),
    ({"lane_key": ""}, "lane_key", "non-empty string"),
    ({"lane_key": "   "}, "lane_key", "non-empty string"),
    ({"idempotency_key": ""}, "idempotency_key", "non-empty string"),
    ({"idempotency_key": "x" * 513}, "idempotency_key", "at most 512"),
    ({"max_attempts": 0}, "max_attempts", "at least 1"),
    ({"max_attempts": True}, "max_attempts", "at least 1"),
    ({"expires_at": PAST}, "expires_at", "has already passed"),
    ({"expires_at": datetime(2099, 1, 1)}, "expires_at", "timezone-aware"),
    ({"payload": {"when": datetime(2026, 1, 1)}}, "payload", "is not JSON"),
    ({"payload": float("nan")}, "payload", "is not JSON"),
    ({"payload": "x" * MAX_PAYLOAD_BYTES}, "payload", f"at most {MAX_PAYLOAD_BYTES} are allowed"),
    ({"payload": {"text": "a\x00b"}}, "payload", "NUL"),
]


@pytest.mark.parametrize(("changes", "field", "message"), BAD_INPUTS, ids=[b[1] + ":" + b[2] for b in BAD_INPUTS])
def test_bad_input_is_refused_by_name_before_anything_is_written(
    engine: Engine, changes: dict[str, Any], field: str, message: str
) -> None:
    with engine.connect() as conn:
        with pytest.raises(InvalidRequest, match=message) as refused:
            outbox.enqueue(conn, request(**changes))
        assert refused.value.field == field
        # the caller's transaction is still usable, and nothing was written
        good = outbox.enqueue(conn, request(idempotency_key="after-refusal"))
        conn.commit()
    assert count(engine) == 1 and good.idempotency_key == "after-refusal"


# -- a repeated idempotency key: the first action, and what this request asked otherwise


def test_an_enqueue_says_whether_it_created_the_action(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    with engine.begin() as conn:
        first = outbox.enqueue(conn, request())
        same_transaction = outbox.enqueue(conn, request())
    with engine.begin() as conn:
        later = outbox.enqueue(conn, request())
    assert (first.created, same_transaction.created, later.created) == (True, False, False)
    assert first.differing_fields == same_transaction.differing_fields == later.differing_fields == ()
    assert later == first  # the same row: the flags describe the call, not the action
    assert not [r for r in caplog.records if r.name.startswith("outbox")]
    assert count(engine) == 1


DIFFERENT_REQUESTS = [
    ({"kind": kinds.ONCE}, ("kind",)),
    ({"workspace_id": 8}, ("workspace_id",)),
    ({"lane_key": "elsewhere"}, ("lane_key",)),
    ({"payload": {"account_id": 43}}, ("payload",)),
    ({"payload": {"account_id": True}}, ("payload",)),
    ({"subject_account_id": 42}, ("subject_account_id",)),
    ({"lane_key": "elsewhere", "payload": None, "workspace_id": 9}, ("workspace_id", "lane_key", "payload")),
]


@pytest.mark.parametrize(("changes", "differing"), DIFFERENT_REQUESTS, ids=[str(d) for _, d in DIFFERENT_REQUESTS])
def test_a_reused_key_with_another_request_returns_the_first_action_warns_once_and_says_what_differs(
    engine: Engine, caplog: pytest.LogCaptureFixture, changes: dict[str, Any], differing: tuple[str, ...]
) -> None:
    caplog.set_level(logging.DEBUG, logger="outbox")
    payload = {"account_id": 42, "secret": "s3cr3t"}
    with engine.begin() as conn:
        first = outbox.enqueue(conn, request(payload=payload))
        caplog.clear()
        again = outbox.enqueue(conn, request(**({"payload": payload} | changes)))
    assert again == first
    assert (again.created, again.differing_fields) == (False, differing)
    assert again.payload == {"account_id": 42, "secret": "s3cr3t"} and count(engine) == 1
    [line] = [r for r in caplog.records if r.name.startswith("outbox")]
    assert line.levelno == logging.WARNING and line.name == "outbox.enqueue"
    message = line.getMessage()
    assert "'welcome:7'" in message and "kind TEST_NOOP" in message and ", ".join(differing) in message
    assert "s3cr3t" not in message and "43" not in message and "elsewhere" not in message


def test_the_delivery_options_of_a_reused_key_do_not_count_as_another_request(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with engine.begin() as conn:
        first = outbox.enqueue(conn, request(max_attempts=3, expires_at=datetime.now(UTC) + timedelta(hours=1)))
    with engine.begin() as conn:
        again = outbox.enqueue(
            conn, request(max_attempts=9, expires_at=datetime.now(UTC) + timedelta(hours=2), proposed=True)
        )
    assert again == first and again.differing_fields == () and again.max_attempts == 3
    assert not [r for r in caplog.records if r.name.startswith("outbox")]


def test_the_payload_of_an_ended_action_is_gone_so_it_is_not_compared(engine: Engine) -> None:
    with engine.begin() as conn:
        first = outbox.enqueue(conn, request(proposed=True))
        outbox.refuse(conn, first.id)
    with engine.begin() as conn:
        payload_only = outbox.enqueue(conn, request(payload={"other": 1}))
        lane_too = outbox.enqueue(conn, request(payload={"other": 1}, lane_key="elsewhere"))
    assert payload_only.state is ActionState.CANCELLED and payload_only.differing_fields == ()
    assert lane_too.differing_fields == ("lane_key",)


async def test_enqueue_async_says_whether_it_created_the_action(aengine: AsyncEngine) -> None:
    async with aengine.begin() as conn:
        first = await outbox.enqueue_async(conn, request())
        again = await outbox.enqueue_async(conn, request(lane_key="elsewhere"))
    assert (first.created, again.created, again.differing_fields) == (True, False, ("lane_key",))


def test_a_racing_duplicate_says_it_did_not_create_the_action(engine: Engine) -> None:
    results: list[outbox.Action] = []
    with engine.connect() as first:
        winner = outbox.enqueue(first, request())

        def second_transaction() -> None:
            with engine.begin() as conn:
                results.append(outbox.enqueue(conn, request(lane_key="elsewhere")))

        thread = threading.Thread(target=second_transaction)
        thread.start()
        until(lambda: sessions_waiting_on_a_lock(engine) == 1, what="the second enqueue to wait")
        first.commit()
        thread.join(10)
    assert winner.created is True
    assert [(r.id, r.created, r.differing_fields) for r in results] == [(winner.id, False, ("lane_key",))]


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([1e16, 1.5e300, -1e23, 5e-324, 0.1, -0.0]),
        TEXT,
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.lists(children, max_size=3).map(tuple), st.dictionaries(TEXT, children)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=JSON_VALUES)
def test_the_same_payload_again_never_counts_as_another(engine: Engine, payload: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
        outbox.enqueue(conn, request(payload=payload))
    with engine.begin() as conn:
        assert outbox.enqueue(conn, request(payload=payload)).differing_fields == ()
