"""The guard's WHEN condition changes nothing it decides: the executor's own moves skip its function, and every
update ends as the function alone would end it (Hypothesis, against the guard as revisions before 0012 ran it).

    guard_probe      ─ the triggers agent_action has now (pg_get_triggerdef), WHEN condition included
    guard_reference  ─ guard_agent_action() on every insert and update, no WHEN condition
    the same row in both ─ the same UPDATE on both ─▶ the same refusal, or the same row

The executor's claim, fence and results, through its own store on a connection that tracks PL/pgSQL calls,
enter no trigger function (the results' statement tallies its ends and hands its lanes over itself); an
operator's cancel and a stamp-less end still enter guard_agent_action() and after_agent_action_move().
"""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass, fields, replace
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

import outbox
from outbox._internal.connections.engines import conninfo
from outbox.executor.claimed import AttemptReport, FinishWrite
from outbox.executor.store import ExecutorStore, Write
from outbox.states import REASON_STATE, ActionState
from tests import kinds
from tests.support import until

S = ActionState
STATES = [s.value for s in S]
ENDED = [s.value for s in S if s.ended]
REASONS = [r.value for r in REASON_STATE]
REASON_OF = {s.value: next(r.value for r, t in REASON_STATE.items() if t is s) for s in S if s.ended}
TABLES = ("guard_probe", "guard_reference")
_ids = itertools.count(1)

COPY = """
CREATE TABLE guard_probe (LIKE agent_action INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
CREATE TABLE guard_reference (LIKE agent_action INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
CREATE TRIGGER guard_reference BEFORE INSERT OR UPDATE ON guard_reference
    FOR EACH ROW EXECUTE FUNCTION guard_agent_action();
"""
GUARD_TRIGGERS = text("""
SELECT pg_get_triggerdef(oid) FROM pg_trigger
 WHERE tgrelid = 'agent_action'::regclass AND tgname LIKE 'guard\\_agent\\_action%' ORDER BY tgname
""")
GUARD_CALLS = text("SELECT coalesce(pg_stat_get_xact_function_calls('guard_agent_action()'::regprocedure), 0)")
MOVE_CALLS = text("SELECT coalesce(pg_stat_get_xact_function_calls('after_agent_action_move()'::regprocedure), 0)")


@dataclass(frozen=True)
class Before:
    """A row as it may be found: any state, with what that state carries."""

    state: str
    kind: str
    attempt: int
    epoch: int
    lease: bool
    write_started: bool
    payload: bool


@dataclass(frozen=True)
class Change:
    """One UPDATE's SET list: each field None (kept) or the SQL expression it is set to."""

    state: str | None
    epoch: int | None  # added to epoch
    attempt: int | None  # added to attempt
    lease_expires_at: str | None
    write_started_at: str | None
    stop_reason: str | None
    ended_at: str | None
    payload: str | None
    kind: str | None
    lane_key: str | None

    def assignments(self) -> str:
        """The SET list; a change of nothing sets a column to itself (the trigger still fires)."""
        sets = [] if self.state is None else [f"state = '{self.state}'"]
        sets += [] if self.epoch is None else [f"epoch = epoch + {self.epoch}"]
        sets += [] if self.attempt is None else [f"attempt = attempt + {self.attempt}"]
        for column in (
            "lease_expires_at",
            "write_started_at",
            "stop_reason",
            "ended_at",
            "payload",
            "kind",
            "lane_key",
        ):
            value = getattr(self, column)
            sets += [] if value is None else [f"{column} = {value}"]
        return ", ".join(sets) or "readback_ref = readback_ref"


_COLUMNS = ("lease_expires_at", "write_started_at", "stop_reason", "ended_at", "payload", "kind", "lane_key")


def _quoted(value: str) -> str:
    return f"'{value}'"


befores = st.builds(
    Before,
    state=st.sampled_from(STATES),
    kind=st.sampled_from([kinds.NOOP.name, kinds.ONCE.name]),
    attempt=st.integers(0, 4),
    epoch=st.integers(0, 3),
    lease=st.booleans(),
    write_started=st.booleans(),
    payload=st.booleans(),
)
times = st.sampled_from(["NULL", "now()", "now() + interval '5 min'", "now() - interval '1 h'"])
anything = st.builds(
    Change,
    state=st.none() | st.sampled_from(STATES),
    epoch=st.none() | st.integers(-2, 2),
    attempt=st.none() | st.integers(-2, 2),
    lease_expires_at=st.none() | times,
    write_started_at=st.none() | times,
    stop_reason=st.none() | st.just("NULL") | st.sampled_from(REASONS).map(_quoted),
    ended_at=st.none() | times,
    payload=st.none() | st.sampled_from(["NULL", "'{\"n\": 2}'", "'null'"]),
    kind=st.none() | st.sampled_from([kinds.NOOP.name, kinds.ONCE.name]).map(_quoted),
    lane_key=st.none() | st.just("'elsewhere'"),
)


KEEP = Change(*[None] * len(fields(Change)))
# the claim and the end as the executor's statements write them
CLAIM = replace(KEEP, state="EXECUTING", epoch=1, attempt=1, lease_expires_at="now() + interval '5 min'")
END = replace(KEEP, state="DONE", stop_reason="'CONFIRMED'", ended_at="now()", payload="NULL", lease_expires_at="NULL")


@st.composite
def executor_moves(draw: st.DrawFn) -> tuple[Before, Change]:
    """The executor's four moves as its statements write them, mostly from the state each starts from,
    then perhaps one field changed."""
    shape = draw(st.sampled_from(["claim", "same", "retry", "end"]))
    start = draw(
        st.sampled_from(["ADMITTED", "EXECUTING"] if shape == "claim" else ["EXECUTING"]) | st.sampled_from(STATES)
    )
    before = replace(draw(befores), state=start)
    if shape == "claim":
        change = CLAIM
    elif shape == "same":
        change = replace(KEEP, write_started_at="now()")
    elif shape == "retry":
        change = replace(KEEP, state="ADMITTED", attempt=draw(st.sampled_from([None, -1])), lease_expires_at="NULL")
    else:
        state = draw(st.sampled_from(ENDED))
        change = replace(END, state=state, stop_reason=_quoted(REASON_OF[state]))
    if draw(st.booleans()):
        field = draw(st.sampled_from([f.name for f in fields(Change)]))
        change = replace(change, **{field: getattr(draw(anything), field)})
    return before, change


def _edge(start: str, action_kind: str, write_started: bool, change: Change) -> tuple[Before, Change]:
    """A row in `start`, and `change`."""
    before = Before(start, action_kind, attempt=2, epoch=2, lease=True, write_started=write_started, payload=True)
    return before, change


_EDGES = [
    # the reclaim of an at-most-once action whose write started, and of an at-least-once one
    _edge("EXECUTING", kinds.ONCE.name, True, CLAIM),
    _edge("EXECUTING", kinds.NOOP.name, True, CLAIM),
    # a claim that moves the lane, names another kind, or sets no lease
    _edge("ADMITTED", kinds.NOOP.name, False, replace(CLAIM, lane_key="'elsewhere'")),
    _edge("ADMITTED", kinds.NOOP.name, False, replace(CLAIM, kind=f"'{kinds.ONCE.name}'")),
    _edge("ADMITTED", kinds.NOOP.name, False, replace(CLAIM, lease_expires_at="NULL")),
    # a retry that gives back two attempts, or keeps its lease
    _edge("EXECUTING", kinds.NOOP.name, True, replace(KEEP, state="ADMITTED", attempt=-2, lease_expires_at="NULL")),
    _edge("EXECUTING", kinds.NOOP.name, True, replace(KEEP, state="ADMITTED")),
    # an end stamped in the past, with JSON's null for a payload, with its lease, without its reason
    _edge("EXECUTING", kinds.NOOP.name, True, replace(END, ended_at="now() - interval '1 h'")),
    _edge("EXECUTING", kinds.NOOP.name, True, replace(END, payload="'null'")),
    _edge("EXECUTING", kinds.NOOP.name, True, replace(END, payload=None)),
    _edge("EXECUTING", kinds.NOOP.name, True, replace(END, lease_expires_at=None)),
    _edge("EXECUTING", kinds.NOOP.name, True, replace(END, stop_reason=None)),
    # an ended row set to what it holds; a waiting row given a lease
    _edge("DONE", kinds.NOOP.name, True, KEEP),
    _edge("ADMITTED", kinds.NOOP.name, False, replace(KEEP, lease_expires_at="now()")),
]


def _edges(test: Any) -> Any:
    """The moves of _EDGES, tried on every run before Hypothesis draws its own."""
    for move in _EDGES:
        test = example(move=move)(test)
    return test


def insert_both(conn: Connection, before: Before) -> int:
    """The same row in both tables, written past their triggers (as if reached through allowed moves)."""
    action_id = next(_ids)
    ended = before.state in ENDED
    values = {
        "id": action_id, "kind": before.kind, "key": f"k{action_id}", "state": before.state,
        "attempt": before.attempt, "epoch": before.epoch, "lease": before.lease, "write": before.write_started,
        "payload": before.payload, "reason": REASON_OF.get(before.state), "ended": ended,
    }  # fmt: skip
    conn.execute(text("SET LOCAL session_replication_role = replica"))
    for table in TABLES:
        conn.execute(
            text(
                f"INSERT INTO {table} (id, kind, workspace_id, lane_key, idempotency_key, payload, max_attempts,"
                " state, attempt, epoch, lease_expires_at, write_started_at, stop_reason, ended_at, destination)"
                " VALUES (:id, :kind, 1, 'lane', :key, CASE WHEN :payload THEN '{\"n\": 1}'::jsonb END, 5,"
                " :state, :attempt, :epoch, CASE WHEN :lease THEN now() + interval '1 min' END,"
                " CASE WHEN :write THEN now() - interval '1 s' END, :reason,"
                " CASE WHEN :ended THEN now() - interval '1 h' END, lower(:kind))"
            ),
            values,
        )
    conn.execute(text("SET LOCAL session_replication_role = origin"))
    return action_id


def outcome(conn: Connection, table: str, action_id: int, change: Change) -> tuple[str, Any]:
    """What the UPDATE did: its refusal (SQLSTATE and message, the table's name taken out) or the row (and
    whether its payload is SQL's null: JSON's null reads as None too)."""
    savepoint = conn.begin_nested()
    try:
        conn.execute(text(f"UPDATE {table} SET {change.assignments()} WHERE id = :id"), {"id": action_id})
    except DBAPIError as error:
        savepoint.rollback()
        cause = error.orig
        assert isinstance(cause, psycopg.Error)
        message = re.sub(r"guard_(probe|reference)", "T", str(cause.diag.message_primary))
        return "refused", (cause.sqlstate, message)
    savepoint.commit()
    found = (
        conn.execute(text(f"SELECT *, payload IS NULL AS no_payload FROM {table} WHERE id = :id"), {"id": action_id})
        .mappings()
        .one()
    )
    return "written", dict(found)


def test_every_update_ends_as_the_guard_function_alone_ends_it(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(COPY))
        for definition in conn.execute(GUARD_TRIGGERS).scalars():
            conn.execute(text(definition.replace(" ON public.agent_action ", " ON public.guard_probe ")))
    seen = {"skipped": 0, "entered": 0}  # updates written without the function, and through it

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(move=st.tuples(befores, anything) | executor_moves())
    @_edges
    def same_outcome(move: tuple[Before, Change]) -> None:
        before, change = move
        with engine.connect() as conn:
            conn.execute(text("SET LOCAL track_functions = 'pl'"))
            action_id = insert_both(conn, before)
            calls = conn.execute(GUARD_CALLS).scalar_one()
            probed = outcome(conn, "guard_probe", action_id, change)
            # a function that raises is not counted: a refusal is neither
            if probed[0] == "written":
                seen["skipped" if conn.execute(GUARD_CALLS).scalar_one() == calls else "entered"] += 1
            assert probed == outcome(conn, "guard_reference", action_id, change), change.assignments()
            conn.rollback()

    same_outcome()
    # rows were written both ways through the trigger, so the comparison covered each
    assert seen["skipped"] >= 40 and seen["entered"] >= 5, seen


def tracked(engine: Engine) -> str:
    """The engine's database as libpq parameters, on a connection that counts its PL/pgSQL calls."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo(engine))
    params["options"] = f"{params.get('options') or ''} -c track_functions=pl".strip()
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def function_calls(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT funcname, calls FROM pg_stat_user_functions")).all())


def updates(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(text("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'agent_action'")).scalar_one()
        )


def test_the_executor_s_claims_fences_and_results_enter_no_trigger_function(engine: Engine) -> None:
    with engine.begin() as conn:
        for i in range(6):
            outbox.enqueue(
                conn,
                outbox.ActionRequest(
                    kind=kinds.NOOP, workspace_id=1, lane_key=f"lane-{i}", idempotency_key=f"k{i}", payload={"i": i}
                ),
            )
    results = [
        FinishWrite("DONE", "CONFIRMED", readback_ref="r"),
        FinishWrite("FAILED", "PROVIDER_REFUSED", last_error="no"),
        FinishWrite("UNCERTAIN", "PROVIDER_UNCERTAIN"),
        FinishWrite("CANCELLED", "NOT_WANTED"),
        FinishWrite("ADMITTED", delay_seconds=0.0, fence="clear"),
        FinishWrite("ADMITTED", delay_seconds=0.0, uncount=1, fence="restore"),
    ]

    async def work() -> int:
        store = ExecutorStore(tracked(engine))
        try:
            claimed = await store.claim(10, 300, [kinds.NOOP.name])
            assert len(claimed) == 6
            fenced = await store.commit([Write(a, trace={"noted": 1}) for a in claimed], 60.0)
            assert {o.outcome for o in fenced} == {"written"}
            report = AttemptReport("DONE", 0.001, 0.01)
            ended = await store.commit([Write(a, report, r) for a, r in zip(claimed, results, strict=True)], 60.0)
            assert {o.outcome for o in ended} == {"written"}
            again = await store.claim(10, 300, [kinds.NOOP.name])  # the two retries, claimed again
            return 6 + 6 + 6 + len(again)
        finally:
            await store.close()

    written = asyncio.run(work())
    # the store's session flushes its counts when it ends: the table's count and the functions it entered.
    # The results' statement hands its lanes over itself (one call for the six lanes) and tallies its ends:
    # no trigger function is entered by a claim, a fence or a result.
    until(lambda: updates(engine) == written, what="the store's session's counts")
    until(lambda: "hold_agent_lanes" in function_calls(engine), what="the results' hand-over")
    assert function_calls(engine) == {"hold_agent_lanes": 1}
    with engine.begin() as conn:
        tallied = conn.execute(text("SELECT state, sum(n) FROM agent_action_ended_tally GROUP BY state")).all()
        assert dict(tallied) == {"DONE": 1, "FAILED": 1, "UNCERTAIN": 1, "CANCELLED": 1}
    with engine.begin() as conn:
        rows = conn.execute(text("SELECT state, payload, ended_at, lease_expires_at FROM agent_action ORDER BY id"))
        for state, payload, ended_at, lease in rows:
            if state in ENDED:
                assert payload is None and ended_at is not None and lease is None
    # any other writer, and any other move, enters the function
    with engine.begin() as conn:
        waiting = outbox.enqueue(
            conn,
            outbox.ActionRequest(kind=kinds.NOOP, workspace_id=1, lane_key="new", idempotency_key="new", payload={}),
        )
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL track_functions = 'pl'"))
        conn.execute(
            text("UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED' WHERE lane_key = 'lane-4'")
        )
        outbox.cancel(conn, waiting.id)
        assert conn.execute(GUARD_CALLS).scalar_one() == 2
        assert conn.execute(MOVE_CALLS).scalar_one() == 2  # their ends are tallied by the row trigger
        ended_at, payload = conn.execute(
            text("SELECT ended_at, payload FROM agent_action WHERE lane_key = 'lane-4'")
        ).one()
        assert ended_at is not None and payload is None


@pytest.mark.parametrize("column", ["ended_at", "payload"])
def test_an_end_that_writes_other_stamps_gets_the_guard_s(engine: Engine, column: str) -> None:
    with engine.begin() as conn:
        outbox.enqueue(
            conn,
            outbox.ActionRequest(kind=kinds.NOOP, workspace_id=1, lane_key="l", idempotency_key="k", payload={}),
        )
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
                " lease_expires_at = now() + interval '1 min'"
            )
        )
        stamps = {"ended_at": "now()", "payload": "NULL"}
        stamps[column] = "now() - interval '1 day'" if column == "ended_at" else "'{\"kept\": true}'"
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED', lease_expires_at = NULL, "
                + ", ".join(f"{name} = {value}" for name, value in stamps.items())
            )
        )
        ended_at, payload, now = conn.execute(text("SELECT ended_at, payload, now() FROM agent_action")).one()
        assert ended_at == now and payload is None
