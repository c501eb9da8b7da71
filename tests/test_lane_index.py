"""Every lane's holder (`agent_action.lane_head`) stays exact after every write, whoever makes it: enqueues,
decisions, claims, fences, results of every kind, expiry, erasure and an operator's own SQL, in any order
(Hypothesis).

What the marks must be, recomputed from agent_action alone: for every lane with an action not ended, one
holder, its EXECUTING action or else its oldest PROPOSED or ADMITTED one; no mark on any other action.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

import outbox
from outbox._internal.connections.engines import conninfo
from outbox.executor.claimed import AttemptReport, FinishWrite
from outbox.executor.store import ExecutorStore, Write
from tests import kinds
from tests.support import waiting_on_a_lock

EXPECTED = text("""
SELECT DISTINCT ON (lane_key) lane_key, id FROM agent_action
 WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
 ORDER BY lane_key, state = 'EXECUTING' DESC, id
""")

LANES = st.sampled_from(["a", "b", "c"])
PICK = st.integers(min_value=0, max_value=20)
OPERATION = st.one_of(
    st.tuples(st.just("enqueue"), LANES, st.booleans(), st.sampled_from([None, 3600])),
    st.tuples(st.just("admit"), PICK),
    st.tuples(st.just("refuse"), PICK),
    st.tuples(st.just("cancel"), PICK),
    st.tuples(st.just("claim"), st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("fence"), PICK),
    st.tuples(st.just("finish"), PICK, st.sampled_from(["DONE", "RETRY_NOW", "RETRY_LATER", "FAILED", "DEFER"])),
    st.tuples(st.just("erase"), PICK),
    st.tuples(st.just("expire"), PICK),
    st.tuples(
        st.just("make_due"),
    ),
)


def lane_rows(engine: Engine) -> dict[str, list[int]]:
    """Every marked holder, by lane (a list, so two holders of one lane would show)."""
    with engine.connect() as conn:
        holders: dict[str, list[int]] = {}
        for r in conn.execute(text("SELECT lane_key, id FROM agent_action WHERE lane_head ORDER BY id")):
            holders.setdefault(r.lane_key, []).append(r.id)
        return holders


def expected_rows(engine: Engine) -> dict[str, list[int]]:
    with engine.connect() as conn:
        return {r.lane_key: [r.id] for r in conn.execute(EXPECTED)}


def ids(engine: Engine, states: tuple[str, ...]) -> list[int]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id FROM agent_action WHERE state = ANY (:s) ORDER BY id"), {"s": list(states)}
        )
        return list(found.scalars())


async def play(engine: Engine, operations: list[tuple[Any, ...]]) -> None:
    store = ExecutorStore(conninfo(engine))
    claimed: dict[int, Any] = {}
    try:
        for number, operation in enumerate(operations):
            await apply(engine, store, claimed, number, operation)
            assert lane_rows(engine) == expected_rows(engine), (number, operation)
    finally:
        await store.close()


async def apply(
    engine: Engine, store: ExecutorStore, claimed: dict[int, Any], number: int, op: tuple[Any, ...]
) -> None:
    def pick(states: tuple[str, ...], index: int) -> int | None:
        found = ids(engine, states)
        return found[index % len(found)] if found else None

    match op:
        case ("enqueue", lane, proposed, subject):
            with engine.begin() as conn:
                outbox.enqueue(
                    conn,
                    outbox.ActionRequest(
                        kind=kinds.NOOP, workspace_id=1, lane_key=lane, idempotency_key=f"k{number}",
                        payload={}, proposed=proposed, subject_account_id=subject,
                    ),
                )  # fmt: skip
        case ("admit" | "refuse" | "cancel") as decision, index:
            action_id = pick(("PROPOSED",) if decision != "cancel" else ("PROPOSED", "ADMITTED"), index)
            if action_id is not None:
                with engine.begin() as conn:
                    getattr(outbox, decision)(conn, action_id)
        case ("claim", limit):
            for action in await store.claim(limit, 300, [kinds.NOOP.name]):
                claimed[action.id] = action
        case ("fence", index):
            if claimed:
                action = claimed[sorted(claimed)[index % len(claimed)]]
                await store.commit([Write(action)], 60.0)
        case ("finish", index, result):
            if claimed:
                action = claimed.pop(sorted(claimed)[index % len(claimed)])
                write = {
                    "DONE": FinishWrite("DONE", "CONFIRMED"),
                    "RETRY_NOW": FinishWrite("ADMITTED", delay_seconds=0.0, fence="clear"),
                    "RETRY_LATER": FinishWrite("ADMITTED", delay_seconds=3600.0, fence="clear"),
                    "FAILED": FinishWrite("FAILED", "PROVIDER_REFUSED"),
                    "DEFER": FinishWrite("ADMITTED", delay_seconds=0.0, uncount=1, fence="restore"),
                }[result]
                report = AttemptReport(result.split("_")[0], 0.01, None)  # RETRY_NOW and RETRY_LATER are a RETRY
                await store.commit([Write(action, report, write)], 60.0)
        case ("erase", index):
            action_id = pick(("PROPOSED", "ADMITTED", "EXECUTING", "DONE"), index)
            if action_id is not None:
                with engine.begin() as conn:  # an operator's own SQL, as an erasure by account would
                    conn.execute(text("DELETE FROM agent_action WHERE id = :id"), {"id": action_id})
                claimed.pop(action_id, None)
        case ("expire", index):
            action_id = pick(("PROPOSED", "ADMITTED"), index)
            if action_id is not None:
                with engine.begin() as conn:
                    conn.execute(text("UPDATE agent_action SET expires_at = now() WHERE id = :id"), {"id": action_id})
                await store.sweep("lane-test", 0, 300, [kinds.NOOP.name], [])
        case ("make_due",):
            with engine.begin() as conn:  # an operator's own SQL: every waiting action due now
                conn.execute(text("UPDATE agent_action SET due_at = now() WHERE state = 'ADMITTED' AND due_at > now()"))


# a lane of three, claimed and ended one after another: each claim moves the head, each end keeps it
LANE_OF_THREE = [("enqueue", "a", False, None)] * 3 + [("claim", 1), ("fence", 0), ("finish", 0, "DONE")] * 3
# a proposed head that holds its lane until admitted, then a retry that comes back due
HELD_THEN_RETRIED = [
    ("enqueue", "b", True, None),
    ("enqueue", "b", False, None),
    ("claim", 3),
    ("admit", 0),
    ("claim", 3),
    ("finish", 0, "RETRY_NOW"),
    ("claim", 3),
    ("finish", 0, "FAILED"),
    ("claim", 3),
    ("finish", 0, "DONE"),
]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=st.lists(OPERATION, min_size=1, max_size=25))
@example(operations=LANE_OF_THREE)
@example(operations=HELD_THEN_RETRIED)
def test_lane_holders_are_exact_after_every_write(engine: Engine, operations: list[Any]) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
    asyncio.run(play(engine, operations))


def enqueue_in(conn: Any, key: str, lane: str = "shared") -> outbox.Action:
    request = outbox.ActionRequest(kind=kinds.NOOP, workspace_id=1, lane_key=lane, idempotency_key=key, payload={})
    return outbox.enqueue(conn, request)


@pytest.mark.parametrize("first_commits", [True, False])
def test_two_transactions_opening_one_lane_leave_it_exact(engine: Engine, first_commits: bool) -> None:
    """The first enqueue into an idle lane holds it; a second transaction enqueuing into the same lane waits for
    the lane's lock, then sees the first holder (first committed) or holds the lane itself (first rolled back)."""
    with engine.connect() as first:
        enqueue_in(first, "first")

        def second() -> None:
            with engine.begin() as conn:
                enqueue_in(conn, "second")

        with waiting_on_a_lock(engine, second, "the second enqueue to wait for the lane"):
            if first_commits:
                first.commit()
            else:
                first.rollback()
    assert lane_rows(engine) == expected_rows(engine)
    assert len(lane_rows(engine)) == 1


def test_an_action_with_an_earlier_id_takes_the_lane_from_a_later_one_not_started(engine: Engine) -> None:
    """An action whose id comes before the holder's (its transaction took the id first and committed later;
    here an operator's insert with an id of its own) holds the lane while the later holder has not started."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
        later = enqueue_in(conn, "later", lane="taken")
        conn.execute(
            text(
                "INSERT INTO agent_action (id, kind, workspace_id, lane_key, idempotency_key, payload,"
                " max_attempts, state) OVERRIDING SYSTEM VALUE"
                " VALUES (:id, :kind, 1, 'taken', 'earlier', '{}', 3, 'ADMITTED')"
            ),
            {"id": later.id - 1_000_000, "kind": kinds.NOOP.name},
        )
    assert lane_rows(engine) == expected_rows(engine) == {"taken": [later.id - 1_000_000]}
    with engine.begin() as conn:  # the same key again inserts nothing, and takes nothing
        conn.execute(
            text(
                "INSERT INTO agent_action (id, kind, workspace_id, lane_key, idempotency_key, payload,"
                " max_attempts, state) OVERRIDING SYSTEM VALUE"
                " VALUES (:id, :kind, 1, 'taken', 'earlier', '{}', 3, 'ADMITTED') ON CONFLICT DO NOTHING"
            ),
            {"id": later.id - 2_000_000, "kind": kinds.NOOP.name},
        )
    assert lane_rows(engine) == expected_rows(engine) == {"taken": [later.id - 1_000_000]}


def test_two_holders_of_one_lane_are_refused_by_the_database(engine: Engine) -> None:
    """Whatever a writer's isolation level lets it miss, ux_agent_action_lane_head refuses a second holder."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
        enqueue_in(conn, "one", lane="twice")
        second = enqueue_in(conn, "two", lane="twice")
    with pytest.raises(Exception, match="ux_agent_action_lane_head"), engine.begin() as conn:
        conn.execute(text("UPDATE agent_action SET lane_head = true WHERE id = :id"), {"id": second.id})


def test_a_holder_s_end_waits_for_an_enqueue_behind_it_and_passes_it_the_lane(engine: Engine) -> None:
    """An enqueue behind an executing holder holds the holder's row (FOR KEY SHARE) until it commits: the
    holder's fence still goes through, its result is held and written once the enqueue committed, and the
    new action then holds the lane. An operator's end of a waiting holder waits for the enqueue the same way."""

    async def scenario() -> None:
        store = ExecutorStore(conninfo(engine))
        try:
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM agent_action"))
                enqueue_in(conn, "holder", lane="busy")
            [holder] = await store.claim(1, 300, [kinds.NOOP.name])
            with engine.connect() as behind:
                follower = enqueue_in(behind, "follower", lane="busy")
                [fenced] = await store.commit([Write(holder)], 60.0)
                assert fenced.outcome == "written"  # a fence never waits for an enqueue
                done = Write(holder, AttemptReport("DONE", 0.01, None), FinishWrite("DONE", "CONFIRMED"))
                [held] = await store.commit([done], 60.0)
                assert held.outcome == "held"
                behind.commit()
            [written] = await store.commit([done], 60.0)
            assert written.outcome == "written"
            assert lane_rows(engine) == expected_rows(engine) == {"busy": [follower.id]}
        finally:
            await store.close()

    asyncio.run(scenario())

    with engine.connect() as behind:
        later = enqueue_in(behind, "later", lane="busy")

        def cancel_the_holder() -> None:
            with engine.begin() as conn:
                held = conn.execute(text("SELECT id FROM agent_action WHERE lane_key = 'busy' AND lane_head"))
                outbox.cancel(conn, held.scalar_one())

        with waiting_on_a_lock(engine, cancel_the_holder, "the cancel to wait for the enqueue"):
            behind.commit()
    assert lane_rows(engine) == expected_rows(engine) == {"busy": [later.id]}


def test_two_batches_opening_the_same_idle_lanes_leave_each_with_one_holder(engine: Engine) -> None:
    """Two enqueue_many into the same idle lanes, at once: the second waits for the first, inserts nothing
    for the lanes the first opened, and enqueues those actions again behind the first's."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
    lanes = ["x", "y", "z"]
    with engine.connect() as first:
        outbox.enqueue_many(first, [_noop(f"first-{lane}", lane) for lane in lanes])

        def second() -> None:
            with engine.begin() as conn:
                actions = outbox.enqueue_many(conn, [_noop(f"second-{lane}", lane) for lane in lanes])
                assert all(a.created for a in actions)

        with waiting_on_a_lock(engine, second, "the second batch to wait for the first"):
            first.commit()
    with engine.connect() as conn:
        holders = dict(conn.execute(text("SELECT lane_key, idempotency_key FROM agent_action WHERE lane_head")).all())
    assert holders == {lane: f"first-{lane}" for lane in lanes}
    assert lane_rows(engine) == expected_rows(engine)


def _noop(key: str, lane: str) -> outbox.ActionRequest:
    return outbox.ActionRequest(kind=kinds.NOOP, workspace_id=1, lane_key=lane, idempotency_key=key, payload={})


def test_an_executing_holder_and_a_waiting_one_are_refused_by_the_database(engine: Engine) -> None:
    """ux_agent_action_lane_head holds executing holders too: a second mark beside one refuses."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
        enqueue_in(conn, "one", lane="busy")
        second = enqueue_in(conn, "two", lane="busy")
        conn.execute(text(CLAIM_BY_HAND), {"key": "one"})
    with pytest.raises(Exception, match="ux_agent_action_lane_head"), engine.begin() as conn:
        conn.execute(text("UPDATE agent_action SET lane_head = true WHERE id = :id"), {"id": second.id})


# A claim of one action, as an operator's SQL writes it (the executor's claim takes the same values).
CLAIM_BY_HAND = """
UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1,
       lease_expires_at = now() + interval '5 min'
 WHERE idempotency_key = :key"""


def test_an_enqueue_that_finds_its_lane_s_holder_ended_never_makes_a_second_holder(engine: Engine) -> None:
    """An enqueue behind an executing holder waits for the holder's end (FOR UPDATE) and, when the end passed
    the lane to the next action and that action was claimed at once, finds no holder of its own snapshot: the
    database refuses it a mark beside the executing one, and it is enqueued behind it. Without that, the
    lane had two holders and the next claim of the new one failed on ux_agent_action_lane_executing, which
    stopped the executor making it."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM agent_action"))
        enqueue_in(conn, "holder", lane="busy")
        conn.execute(text(CLAIM_BY_HAND), {"key": "holder"})
    with engine.begin() as conn:
        enqueue_in(conn, "next", lane="busy")
    with engine.connect() as writer:
        # the holder ends (the row trigger passes the lane to "next") and "next" is claimed, in one transaction
        writer.execute(
            text("UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED' WHERE idempotency_key = 'holder'")
        )
        writer.execute(text(CLAIM_BY_HAND), {"key": "next"})

        def behind() -> None:
            with engine.begin() as conn:
                enqueue_in(conn, "behind", lane="busy")

        with waiting_on_a_lock(engine, behind, "the enqueue to wait for the holder's end"):
            writer.commit()
    assert lane_rows(engine) == expected_rows(engine)
    with engine.connect() as conn:
        holders = conn.execute(text("SELECT idempotency_key FROM agent_action WHERE lane_head")).scalars().all()
    assert holders == ["next"]
