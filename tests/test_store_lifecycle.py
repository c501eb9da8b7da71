"""The trigger guard_agent_action against the Python transition table (every allowed and refused transition).

Each move is written as raw SQL, so what is tested is the trigger, not the executor. A transition is a
change of state, or a claim (the epoch rises): entering EXECUTING raises epoch and attempt by one,
entering an ended state names a stop reason that belongs to it.
"""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from outbox.states import REASON_STATE, ActionState
from tests import kinds

S = ActionState
A_REASON = {state: next(r for r, s in REASON_STATE.items() if s is state) for state in S if state.ended}
_keys = itertools.count()


def insert(conn: Connection, state: ActionState, *, kind: str = kinds.NOOP.name, lane: str = "lane") -> int:
    """A row in `state`, reached through allowed transitions only."""
    first = S.PROPOSED if state is S.PROPOSED else S.ADMITTED
    action_id: int = conn.execute(
        text(
            "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
            " max_attempts, state)"
            " VALUES (:kind, 1, :lane, :key, '{\"n\": 1}', 5, :state) RETURNING id"
        ),
        {"kind": kind, "lane": lane, "key": f"k{next(_keys)}", "state": first},
    ).scalar_one()
    if state is S.CANCELLED:
        move(conn, action_id, S.CANCELLED)
    elif state not in (S.PROPOSED, S.ADMITTED):
        move(conn, action_id, S.EXECUTING)
        if state is not S.EXECUTING:
            move(conn, action_id, state)
    return action_id


def move(conn: Connection, action_id: int, to: ActionState, *, reenter: bool = False) -> None:
    """The transition into `to`, written as the executor or an operator writes it.

    Re-entering the same state is a transition only as a claim (the epoch rises), as in a reclaim.
    """
    if to is S.EXECUTING or to is S.PROPOSED or to is S.ADMITTED:
        claim = to is S.EXECUTING or reenter
        conn.execute(
            text(
                "UPDATE agent_action SET state = :to"
                + (
                    ", epoch = epoch + 1, attempt = attempt + 1, lease_expires_at = now() + interval '5 min'"
                    if claim
                    else ""
                )
                + " WHERE id = :id"
            ),
            {"to": to, "id": action_id},
        )
    else:
        conn.execute(
            text("UPDATE agent_action SET state = :to, stop_reason = :reason WHERE id = :id"),
            {"to": to, "reason": A_REASON[to], "id": action_id},
        )


def row(conn: Connection, action_id: int) -> dict[str, object]:
    return dict(conn.execute(text("SELECT * FROM agent_action WHERE id = :id"), {"id": action_id}).mappings().one())


@pytest.mark.parametrize(("source", "target"), list(itertools.product(S, S)), ids=lambda s: s.value)
def test_every_pair_of_states_is_allowed_exactly_when_the_transition_table_allows_it(
    engine: Engine, source: ActionState, target: ActionState
) -> None:
    with engine.connect() as conn:
        action_id = insert(conn, source)
        conn.commit()
        if source.may_become(target):
            move(conn, action_id, target, reenter=source is target)
            conn.commit()
            assert row(conn, action_id)["state"] == target
        else:
            with pytest.raises(DBAPIError, match=r"transition|never changes|claim"):
                move(conn, action_id, target, reenter=source is target)
            conn.rollback()
            assert row(conn, action_id)["state"] == source


def test_the_pairs_cover_all_49_and_the_seed_allows_eleven() -> None:
    pairs = [(a, b) for a in S for b in S if a.may_become(b)]
    assert len(list(itertools.product(S, S))) == 49
    assert len(pairs) == 2 + 2 + 6  # PROPOSED 2, ADMITTED 2, EXECUTING 6, ended 0


def test_an_ended_row_refuses_any_change(engine: Engine) -> None:
    with engine.connect() as conn:
        for state in (S.DONE, S.UNCERTAIN, S.FAILED, S.CANCELLED):
            action_id = insert(conn, state)
            conn.commit()
            with pytest.raises(DBAPIError, match="never changes"):
                conn.execute(text("UPDATE agent_action SET readback_ref = 'x' WHERE id = :id"), {"id": action_id})
            conn.rollback()


def test_ending_clears_payload_and_lease_and_stamps_ended_at(engine: Engine) -> None:
    with engine.connect() as conn:
        action_id = insert(conn, S.EXECUTING)
        before = row(conn, action_id)
        assert before["payload"] == {"n": 1} and before["lease_expires_at"] is not None
        assert before["ended_at"] is None
        move(conn, action_id, S.DONE)
        after = row(conn, action_id)
        assert after["payload"] is None and after["lease_expires_at"] is None
        assert after["ended_at"] is not None and after["stop_reason"] == "CONFIRMED"


def test_ending_without_a_stop_reason_is_refused(engine: Engine) -> None:
    with engine.connect() as conn:
        action_id = insert(conn, S.EXECUTING)
        conn.commit()
        with pytest.raises(DBAPIError, match="needs a stop_reason"):
            conn.execute(text("UPDATE agent_action SET state = 'DONE' WHERE id = :id"), {"id": action_id})
        conn.rollback()


def test_a_stop_reason_must_belong_to_the_state(engine: Engine) -> None:
    with engine.connect() as conn:
        action_id = insert(conn, S.EXECUTING)
        conn.commit()
        with pytest.raises(IntegrityError, match="ck_agent_action_stop_reason"):
            conn.execute(
                text("UPDATE agent_action SET state = 'DONE', stop_reason = 'EXPIRED' WHERE id = :id"),
                {"id": action_id},
            )
        conn.rollback()


@pytest.mark.parametrize(
    "assignment",
    [
        "epoch = epoch + 2, attempt = attempt + 1",
        "epoch = epoch + 1, attempt = attempt",
        "epoch = epoch, attempt = attempt + 1",
        "epoch = epoch + 1, attempt = attempt + 2",
    ],
)
def test_a_claim_must_raise_epoch_and_attempt_by_exactly_one(engine: Engine, assignment: str) -> None:
    with engine.connect() as conn:
        for source in (S.ADMITTED, S.EXECUTING):
            action_id = insert(conn, source)
            conn.commit()
            with pytest.raises(DBAPIError, match=r"exactly one|not an allowed transition"):
                conn.execute(
                    text(
                        f"UPDATE agent_action SET state = 'EXECUTING', {assignment},"
                        " lease_expires_at = now() + interval '1 min' WHERE id = :id"
                    ),
                    {"id": action_id},
                )
            conn.rollback()


def test_the_epoch_never_moves_outside_a_claim(engine: Engine) -> None:
    with engine.connect() as conn:
        action_id = insert(conn, S.EXECUTING)
        conn.commit()
        with pytest.raises(DBAPIError, match="not an allowed transition"):
            conn.execute(
                text("UPDATE agent_action SET state = 'ADMITTED', epoch = epoch + 1 WHERE id = :id"),
                {"id": action_id},
            )
        conn.rollback()


def test_an_at_most_once_action_is_never_reclaimed_after_its_write_started(engine: Engine) -> None:
    with engine.connect() as conn:
        action_id = insert(conn, S.EXECUTING, kind=kinds.ONCE.name)
        conn.execute(text("UPDATE agent_action SET write_started_at = now() WHERE id = :id"), {"id": action_id})
        conn.commit()
        with pytest.raises(DBAPIError, match="at most once and its write started"):
            move(conn, action_id, S.EXECUTING)
        conn.rollback()
        # an at-least-once kind may be taken again: it reads back before it writes
        readback = insert(conn, S.EXECUTING, lane="other")
        conn.execute(text("UPDATE agent_action SET write_started_at = now() WHERE id = :id"), {"id": readback})
        move(conn, readback, S.EXECUTING)
        assert row(conn, readback)["epoch"] == 2


def test_two_executing_actions_in_one_lane_are_refused_by_the_index(engine: Engine) -> None:
    with engine.connect() as conn:
        insert(conn, S.EXECUTING, lane="shared")
        conn.commit()
        second = insert(conn, S.ADMITTED, lane="shared")
        conn.commit()
        with pytest.raises(IntegrityError, match="ux_agent_action_lane_executing"):
            move(conn, second, S.EXECUTING)
        conn.rollback()


def test_a_new_action_starts_proposed_or_admitted_with_nothing_attempted(engine: Engine) -> None:
    with engine.connect() as conn:
        with pytest.raises(DBAPIError, match="PROPOSED or ADMITTED"):
            conn.execute(
                text(
                    "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key,"
                    " max_attempts, state) VALUES ('TEST_NOOP', 1, 'l', 'k', 1, 'EXECUTING')"
                )
            )
        conn.rollback()
        with pytest.raises(DBAPIError, match="no attempt"):
            conn.execute(
                text(
                    "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key,"
                    " max_attempts, state, epoch) VALUES ('TEST_NOOP', 1, 'l', 'k', 1, 'ADMITTED', 3)"
                )
            )
        conn.rollback()
