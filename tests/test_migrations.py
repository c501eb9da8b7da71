"""`outbox db upgrade` builds the whole store; `outbox db downgrade` removes every object it created. Revision
0007 turns the kinds into rows and keeps every kind a database declared; its downgrade gives the lists back."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import DBAPIError

from outbox import migrate
from outbox.kinds import ActionKind
from outbox.testing import DeclaredKinds, declared_kinds

_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def objects(conn: Connection) -> set[str]:
    rows = conn.execute(
        text("""
        SELECT 'table ' || relname FROM pg_class
         WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'i', 'S')
           AND relname NOT LIKE 'alembic_version%'
        UNION ALL SELECT 'function ' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
        UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal
        """)
    ).scalars()
    return set(rows)


def test_upgrade_creates_the_store_and_downgrade_removes_all_of_it(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        before = objects(conn)
        migrate.upgrade(conn)
        created = objects(conn) - before
    assert {
        "table agent_action",
        "table agent_action_kind",
        "table ux_agent_action_lane_executing",
        "table ux_agent_action_idempotency_key",
        "table ix_agent_action_ready",
        "table ux_agent_action_lane_head",
        "table ix_agent_action_lane_pending",
        "table ix_agent_action_ended",
        "table ix_agent_action_subject",
        "function guard_agent_action",
        "trigger guard_agent_action",
        "trigger after_agent_action_move",
    } <= created
    with engine.begin() as conn:
        migrate.downgrade(conn)
        assert objects(conn) == before
    with engine.begin() as conn:  # and up again: the downgrade left nothing in the way
        migrate.upgrade(conn)
        assert objects(conn) - before == created
    engine.dispose()


# -- 0007: the kinds become rows of agent_action_kind

KIND_CONSTRAINTS = text("""
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid = 'agent_action'::regclass AND conname IN ('ck_agent_action_kind', 'ck_agent_action_workspace')
 ORDER BY conname
""")
GUARD = text("SELECT pg_get_functiondef('guard_agent_action()'::regprocedure)")
GUARD_LIST = re.compile(r"at_most_once_kinds CONSTANT text\[\] := ARRAY\[(.*?)\]")


def _array(names: Iterable[str]) -> str:
    return "ARRAY[" + ", ".join(f"'{name}'" for name in sorted(names)) + "]::text[]"


def install_kinds_at_0006(conn: Connection, kinds: Iterable[ActionKind]) -> None:
    """Step 2 of "Add a kind" as it was at revision 0006: the two constraints and the guard's list rewritten."""
    chosen = tuple(kinds)
    conn.execute(
        text(
            "ALTER TABLE agent_action DROP CONSTRAINT ck_agent_action_kind,"
            " DROP CONSTRAINT ck_agent_action_workspace,"
            f" ADD CONSTRAINT ck_agent_action_kind CHECK (kind = ANY ({_array(k.name for k in chosen)})),"
            " ADD CONSTRAINT ck_agent_action_workspace CHECK ("
            f"(workspace_id IS NOT NULL OR kind = ANY ({_array(k.name for k in chosen if k.instance_level)}))"
            f" AND (workspace_id IS NULL OR kind = ANY ({_array(k.name for k in chosen if k.workspace_level)})))"
        )
    )
    guard = conn.execute(GUARD).scalar_one()
    once = _array(k.name for k in chosen if k.at_most_once)
    rewritten, count = GUARD_LIST.subn(f"at_most_once_kinds CONSTANT text[] := {once}", guard)
    assert count == 1
    conn.execute(text(rewritten.replace(":", r"\:")))


def kinds_at_0006(conn: Connection) -> DeclaredKinds:
    """What the constraints and the guard of revision 0006 declare, read the way 0006's tests read them."""
    definitions: dict[str, str] = {name: definition for name, definition in conn.execute(KIND_CONSTRAINTS)}
    lists = re.findall(r"ANY \((ARRAY\[.*?\]|'\{\}'::text\[\])", definitions["ck_agent_action_workspace"])
    match = GUARD_LIST.search(conn.execute(GUARD).scalar_one())
    assert match is not None and len(lists) == 2

    def names(sql: str) -> frozenset[str]:
        return frozenset(re.findall(r"'([A-Z0-9_]+)'", sql))

    return DeclaredKinds(
        kinds=names(definitions["ck_agent_action_kind"]),
        instance_level=names(lists[0]),
        workspace_level=names(lists[1]),
        at_most_once=names(match.group(1)),
    )


def declared(kinds: Iterable[ActionKind]) -> DeclaredKinds:
    chosen = tuple(kinds)
    return DeclaredKinds(
        kinds=frozenset(k.name for k in chosen),
        instance_level=frozenset(k.name for k in chosen if k.instance_level),
        workspace_level=frozenset(k.name for k in chosen if k.workspace_level),
        at_most_once=frozenset(k.name for k in chosen if k.at_most_once),
    )


def add_action(conn: Connection, kind: ActionKind, key: str) -> int:
    """An action of `kind` that has claimed and started its write: the reclaim is what at_most_once decides."""
    action_id: int = conn.execute(
        text(
            "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, max_attempts, state)"
            " VALUES (:kind, :workspace, :key, :key, 5, 'ADMITTED') RETURNING id"
        ),
        {"kind": kind.name, "workspace": None if kind.instance_level else 1, "key": key},
    ).scalar_one()
    conn.execute(
        text(
            "UPDATE agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
            " lease_expires_at = now() + interval '1 min' WHERE id = :id"
        ),
        {"id": action_id},
    )
    conn.execute(text("UPDATE agent_action SET write_started_at = now() WHERE id = :id"), {"id": action_id})
    return action_id


def reclaims(conn: Connection, action_id: int) -> bool:
    """Whether the guard lets the action be claimed again (undone either way)."""
    try:
        with conn.begin_nested():
            conn.execute(
                text(
                    "UPDATE agent_action SET epoch = epoch + 1, attempt = attempt + 1,"
                    " lease_expires_at = now() + interval '1 min' WHERE id = :id"
                ),
                {"id": action_id},
            )
            raise _Undo
    except _Undo:
        return True
    except DBAPIError as refused:
        assert "at most once and its write started" in str(refused.orig)
        return False


class _Undo(Exception):
    pass


LEVELS = st.sampled_from([(True, False), (False, True), (True, True)])
OLD_KINDS = st.dictionaries(
    st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True).filter(lambda name: name != "EMAIL"),
    st.tuples(st.booleans(), LEVELS),
    max_size=5,
).map(
    lambda found: tuple(
        ActionKind(name, at_most_once=once, instance_level=alone, workspace_level=in_workspace)
        for name, (once, (alone, in_workspace)) in sorted(found.items())
    )
)


@pytest.fixture
def empty_conn(empty_database_url: str) -> Iterator[Connection]:
    engine = create_engine(empty_database_url)
    with engine.connect() as conn:
        yield conn
    engine.dispose()


@settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=_HEALTH)
@given(extra=OLD_KINDS)
def test_an_upgrade_from_0006_keeps_every_kind_the_database_declared(
    empty_conn: Connection, extra: tuple[ActionKind, ...]
) -> None:
    """Kinds installed the old way at 0006, each with an action whose write started, become rows with their
    flags; the actions stay, keep their reclaim rule, and a downgrade gives the old lists back."""
    conn = empty_conn
    everything = (ActionKind.EMAIL, *extra)
    transaction = conn.begin()  # each example migrates inside one transaction, rolled back at its end
    try:
        migrate.upgrade(conn, "0006")
        install_kinds_at_0006(conn, everything)
        actions = {kind: add_action(conn, kind, f"k-{kind.name}") for kind in everything}
        migrate.upgrade(conn, "0010")  # the last revision before outbox declared kinds beyond EMAIL
        assert declared_kinds(conn) == declared(everything)
        for kind, action_id in actions.items():
            assert reclaims(conn, action_id) is not kind.at_most_once, kind
        migrate.downgrade(conn, "0006", force=True)
        assert kinds_at_0006(conn) == declared(everything)
        for kind, action_id in actions.items():
            assert reclaims(conn, action_id) is not kind.at_most_once, kind
    finally:
        transaction.rollback()


def test_a_downgrade_to_0006_restores_its_constraints_and_guard_exactly(empty_database_url: str) -> None:
    """0007 builds its guard and 0001's from one text: the downgrade giving 0001's back, character for
    character, shows that the new guard changed nothing but its kind parts."""
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0006")
        before = (conn.execute(KIND_CONSTRAINTS).all(), conn.execute(GUARD).scalar_one())
        migrate.upgrade(conn)
        assert conn.execute(KIND_CONSTRAINTS).all() == []
        migrate.downgrade(conn, "0006")
        assert (conn.execute(KIND_CONSTRAINTS).all(), conn.execute(GUARD).scalar_one()) == before
        assert conn.execute(text("SELECT to_regclass('agent_action_kind')")).scalar_one() is None
    engine.dispose()


def prebuild_statement(index: str) -> str:
    """The statement docs/operations.md gives a DBA to build a revision's index without blocking writes."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    found = re.search(rf"```sql\n(CREATE INDEX CONCURRENTLY[^`]*{index}[^`]*)```", docs)
    assert found, f"docs/operations.md no longer shows how to build {index} concurrently"
    return found[1]


INDEX_OID = text("SELECT to_regclass(:name)::oid")
INDEX_DEF = text("SELECT pg_get_indexdef(to_regclass(:name))")


@pytest.mark.parametrize("prebuilt", ["valid", "invalid"])
def test_revision_0014_keeps_the_index_a_dba_built_concurrently_unless_the_build_failed(
    empty_database_url: str, prebuilt: str
) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0013")
        fresh = conn.execute(INDEX_DEF, {"name": "ix_agent_action_state_created"}).scalar_one()
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text(prebuild_statement("ix_agent_action_state_created_0014"))
        )
        built = conn.execute(INDEX_OID, {"name": "ix_agent_action_state_created_0014"}).scalar_one()
        if prebuilt == "invalid":  # what a concurrent build that failed leaves behind
            conn.execute(text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = :oid"), {"oid": built})
    with engine.begin() as conn:
        migrate.upgrade(conn, "0014")
        kept = conn.execute(INDEX_OID, {"name": "ix_agent_action_state_created"}).scalar_one()
        assert (kept == built) is (prebuilt == "valid")
        assert conn.execute(text("SELECT indisvalid FROM pg_index WHERE indexrelid = :oid"), {"oid": kept}).scalar()
        assert conn.execute(INDEX_DEF, {"name": "ix_agent_action_state_created"}).scalar_one() == fresh.replace(
            "INCLUDE (kind)", "INCLUDE (kind) WHERE (state <> 'EXECUTING'::text)"
        )
        assert conn.execute(INDEX_OID, {"name": "ix_agent_action_created"}).scalar_one() is None
        migrate.downgrade(conn, "0013")
        assert conn.execute(INDEX_DEF, {"name": "ix_agent_action_state_created"}).scalar_one() == fresh
        assert conn.execute(INDEX_OID, {"name": "ix_agent_action_created"}).scalar_one() is not None
    engine.dispose()


LANE_ROWS_0014 = text("SELECT lane_key, head_id, executing, ready_at FROM agent_lane ORDER BY lane_key")
HOLDERS = text("SELECT lane_key, idempotency_key FROM agent_action WHERE lane_head ORDER BY lane_key")
FUNCTIONS = text(
    "SELECT proname, md5(prosrc) FROM pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY proname"
)
TRIGGERS = text("SELECT tgname, md5(pg_get_triggerdef(oid)) FROM pg_trigger WHERE NOT tgisinternal ORDER BY tgname")


def test_revision_0015_marks_each_lane_s_holder_and_its_downgrade_gives_the_lane_table_back(
    empty_database_url: str,
) -> None:
    """Lanes of every shape at 0014 (an executing action with two waiting behind it, a lone ADMITTED one, a
    lone PROPOSED one, one whose actions all ended): 0015 marks the rule's holder of each; down to 0014 (its
    actions unended, so forced) gives back the lane rows, functions and triggers 0014 had, exactly."""
    from outbox.testing import install_kinds
    from tests import kinds

    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0014")
        install_kinds(conn, [kinds.NOOP])
        for key, lane, state in [
            ("a1", "a", "ADMITTED"), ("a2", "a", "ADMITTED"), ("a3", "a", "PROPOSED"),
            ("b1", "b", "ADMITTED"), ("c1", "c", "PROPOSED"), ("d1", "d", "ADMITTED"),
        ]:  # fmt: skip
            conn.execute(
                text(
                    "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                    " max_attempts, state) VALUES ('TEST_NOOP', 1, :lane, :key, '{}', 3, :state)"
                ),
                {"key": key, "lane": lane, "state": state},
            )
        claim = (
            "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1,"
            " lease_expires_at = now() + interval '5 minutes' WHERE idempotency_key = :key"
        )
        conn.execute(text(claim), {"key": "a1"})
        conn.execute(text(claim), {"key": "d1"})
        conn.execute(
            text("UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED' WHERE idempotency_key = 'd1'")
        )
        lanes, functions, triggers = (conn.execute(q).all() for q in (LANE_ROWS_0014, FUNCTIONS, TRIGGERS))
        assert [r.lane_key for r in lanes] == ["a", "b", "c"]

        migrate.upgrade(conn, "0015")
        assert conn.execute(HOLDERS).all() == [("a", "a1"), ("b", "b1"), ("c", "c1")]
        assert conn.execute(text("SELECT to_regclass('agent_lane')")).scalar_one() is None

        migrate.downgrade(conn, "0014", force=True)
        assert conn.execute(LANE_ROWS_0014).all() == lanes
        assert conn.execute(FUNCTIONS).all() == functions
        assert conn.execute(TRIGGERS).all() == triggers

        migrate.upgrade(conn, "0015")  # and up again, the holders marked the same way
        assert conn.execute(HOLDERS).all() == [("a", "a1"), ("b", "b1"), ("c", "c1")]
    engine.dispose()


@pytest.mark.parametrize("prebuilt", ["valid", "invalid"])
def test_revision_0019_keeps_the_index_a_dba_built_concurrently_unless_the_build_failed(
    empty_database_url: str, prebuilt: str
) -> None:
    name = {"name": "ix_agent_action_ready_destination"}
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0019")
        fresh = conn.execute(INDEX_DEF, name).scalar_one()
        migrate.downgrade(conn, "0018")
        assert conn.execute(INDEX_OID, name).scalar_one() is None
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text(prebuild_statement(name["name"])))
        built = conn.execute(INDEX_OID, name).scalar_one()
        if prebuilt == "invalid":  # what a concurrent build that failed leaves behind
            conn.execute(text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = :oid"), {"oid": built})
    with engine.begin() as conn:
        migrate.upgrade(conn, "0019")
        kept = conn.execute(INDEX_OID, name).scalar_one()
        assert (kept == built) is (prebuilt == "valid")
        assert conn.execute(text("SELECT indisvalid FROM pg_index WHERE indexrelid = :oid"), {"oid": kept}).scalar()
        assert conn.execute(INDEX_DEF, name).scalar_one() == fresh
    engine.dispose()


ENDED_TALLY = text("SELECT kind, state, reason, sum(n)::int FROM agent_action_ended_tally GROUP BY 1, 2, 3 ORDER BY 2")
MOVE_CALLS = text("SELECT coalesce(pg_stat_get_xact_function_calls('after_agent_action_move()'::regprocedure), 0)")


def test_revision_0024_tallies_other_writers_ends_in_a_row_trigger_and_its_downgrade_gives_0023_back(
    empty_database_url: str,
) -> None:
    """At 0024 a claim enters no trigger function; an end that plain SQL writes is tallied and passes its lane
    to the next action, as at 0023, unless its transaction says it writes both itself (`outbox.own_ends`, as
    the executor's result statement does). Down to 0023 gives back its functions and triggers exactly."""
    from outbox.testing import install_kinds
    from tests import kinds

    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0023")
        functions, triggers = conn.execute(FUNCTIONS).all(), conn.execute(TRIGGERS).all()
        migrate.upgrade(conn, "0024")
        install_kinds(conn, [kinds.NOOP])
        for key, lane in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")]:
            conn.execute(
                text(
                    "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                    " max_attempts, state) VALUES ('TEST_NOOP', 1, :lane, :key, '{}', 3, 'ADMITTED')"
                ),
                {"key": key, "lane": lane},
            )
        conn.execute(text("SET LOCAL track_functions = 'pl'"))
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1,"
                " lease_expires_at = now() + interval '5 minutes' WHERE idempotency_key IN ('a1', 'b1')"
            )
        )
        assert conn.execute(MOVE_CALLS).scalar_one() == 0
        conn.execute(
            text("UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED' WHERE idempotency_key = 'a1'")
        )
        assert conn.execute(MOVE_CALLS).scalar_one() == 1
        assert conn.execute(HOLDERS).all() == [("a", "a2"), ("b", "b1")]
        assert conn.execute(ENDED_TALLY).all() == [("TEST_NOOP", "DONE", "CONFIRMED", 1)]
    with engine.begin() as conn:  # a transaction that writes its own ends' tally and hand-over
        conn.execute(text("SELECT set_config('outbox.own_ends', 'written', true)"))
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED', ended_at = now(),"
                " payload = NULL, lease_expires_at = NULL, lane_head = false WHERE idempotency_key = 'b1'"
            )
        )
        assert conn.execute(HOLDERS).all() == [("a", "a2")]
        assert conn.execute(ENDED_TALLY).all() == [("TEST_NOOP", "DONE", "CONFIRMED", 1)]
    with engine.begin() as conn:
        migrate.downgrade(conn, "0023", force=True)
        assert conn.execute(FUNCTIONS).all() == functions
        assert conn.execute(TRIGGERS).all() == triggers
        conn.execute(
            text("UPDATE agent_action SET state = 'CANCELLED', stop_reason = 'NOT_WANTED' WHERE idempotency_key = 'b2'")
        )
        assert conn.execute(ENDED_TALLY).all() == [
            ("TEST_NOOP", "CANCELLED", "NOT_WANTED", 1), ("TEST_NOOP", "DONE", "CONFIRMED", 1)
        ]  # fmt: skip
        migrate.upgrade(conn, "0024")  # and up again
        assert conn.execute(HOLDERS).all() == [("a", "a2")]
    engine.dispose()


def test_revision_0026_leaves_executing_holders_to_their_own_index_and_its_downgrade_gives_0025_back(
    empty_database_url: str,
) -> None:
    """0026 keeps every lane's holder; its holder index holds the waiting holders only, and an enqueue behind
    an executing holder still finds it (through ux_agent_action_lane_executing) and takes no mark; the lane
    passes on when it ends. Down to 0025 gives back its index, functions and triggers exactly."""
    from outbox.testing import install_kinds
    from tests import kinds

    enqueue = text(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)"
        " VALUES ('TEST_NOOP', 1, :lane, :key, '{}', 3, 'ADMITTED')"
    )
    holder_index = {"name": "ux_agent_action_lane_head"}
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0025")
        earlier = conn.execute(FUNCTIONS).all(), conn.execute(TRIGGERS).all(), conn.execute(INDEX_DEF, holder_index)
        functions, triggers, index = earlier[0], earlier[1], earlier[2].scalar_one()
        install_kinds(conn, [kinds.NOOP])
        for key, lane in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
            conn.execute(enqueue, {"key": key, "lane": lane})
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1,"
                " lease_expires_at = now() + interval '5 minutes' WHERE idempotency_key = 'a1'"
            )
        )
        migrate.upgrade(conn, "0026")
        assert conn.execute(HOLDERS).all() == [("a", "a1"), ("b", "b1")]
        assert (
            conn.execute(INDEX_DEF, holder_index)
            .scalar_one()
            .endswith("(lane_key) WHERE (lane_head AND (state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text])))")
        )
        conn.execute(enqueue, {"key": "a3", "lane": "a"})
        assert conn.execute(HOLDERS).all() == [("a", "a1"), ("b", "b1")]
        conn.execute(
            text("UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED' WHERE idempotency_key = 'a1'")
        )
        assert conn.execute(HOLDERS).all() == [("a", "a2"), ("b", "b1")]
        migrate.downgrade(conn, "0025", force=True)
        assert conn.execute(FUNCTIONS).all() == functions
        assert conn.execute(TRIGGERS).all() == triggers
        assert conn.execute(INDEX_DEF, holder_index).scalar_one() == index
        migrate.upgrade(conn, "0026")  # and up again
        assert conn.execute(HOLDERS).all() == [("a", "a2"), ("b", "b1")]
    engine.dispose()


def test_revision_0027_holds_executing_holders_again_mends_a_second_holder_and_its_downgrade_gives_0026_back(
    empty_database_url: str,
) -> None:
    """0027's holder index holds every holder: a lane that 0026 let get a waiting holder beside its executing
    one is mended at the upgrade (the waiting one lets go and takes the lane when the executing one ends), and a
    mark beside an executing holder is refused from then on. Down to 0026 gives back its narrower index."""
    from outbox.testing import install_kinds
    from tests import kinds

    enqueue = text(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)"
        " VALUES ('TEST_NOOP', 1, :lane, :key, '{}', 3, 'ADMITTED')"
    )
    claim = text(
        "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1,"
        " lease_expires_at = now() + interval '5 minutes' WHERE idempotency_key = :key"
    )
    mark_a2 = text("UPDATE agent_action SET lane_head = true WHERE idempotency_key = 'a2'")
    holder_index = {"name": "ux_agent_action_lane_head"}
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0026")
        narrower = conn.execute(INDEX_DEF, holder_index).scalar_one()
        install_kinds(conn, [kinds.NOOP])
        for key, lane in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
            conn.execute(enqueue, {"key": key, "lane": lane})
        conn.execute(claim, {"key": "a1"})
        conn.execute(mark_a2)  # the second holder 0026's index let through
        assert conn.execute(HOLDERS).all() == [("a", "a1"), ("a", "a2"), ("b", "b1")]
        migrate.upgrade(conn, "0027")
        assert conn.execute(HOLDERS).all() == [("a", "a1"), ("b", "b1")]
        assert conn.execute(INDEX_DEF, holder_index).scalar_one().endswith("(lane_key) WHERE lane_head")
        with pytest.raises(Exception, match="ux_agent_action_lane_head"), conn.begin_nested():
            conn.execute(mark_a2)
        conn.execute(
            text("UPDATE agent_action SET state = 'DONE', stop_reason = 'CONFIRMED' WHERE idempotency_key = 'a1'")
        )
        assert conn.execute(HOLDERS).all() == [("a", "a2"), ("b", "b1")]
        migrate.downgrade(conn, "0026", force=True)
        assert conn.execute(INDEX_DEF, holder_index).scalar_one() == narrower
        migrate.upgrade(conn, "0027")  # and up again
        assert conn.execute(HOLDERS).all() == [("a", "a2"), ("b", "b1")]
    engine.dispose()
