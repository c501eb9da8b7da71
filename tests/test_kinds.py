"""The database and the Python registry agree on every kind: the checks of "Add a kind", step by step.

A kind is a row of agent_action_kind. The foreign key fk_agent_action_kind refuses an action of a kind
without a row, guard_agent_action refuses a workspace the kind's row does not allow, and reads the row's
at_most_once when an action whose write started is claimed again. Every case runs against the database.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from outbox import migrate
from outbox.kinds import ActionKind, is_kind_name
from outbox.migrate import PRODUCTION_KINDS
from outbox.testing import DeclaredKinds, declared_kinds, install_kinds
from tests import kinds

_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
settings.register_profile(
    "kinds-ci", derandomize=True, max_examples=200, deadline=None, database=None, suppress_health_check=_HEALTH
)
settings.register_profile("kinds-long", max_examples=5_000, deadline=None, suppress_health_check=_HEALTH)
PROFILE = settings.get_profile("kinds-long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "kinds-ci")

CHECK_VIOLATION = "23514"
_keys = itertools.count()


def assert_agrees(declared: DeclaredKinds, kinds: tuple[ActionKind, ...]) -> None:
    names = {k.name for k in kinds}
    for name in names - declared.kinds:
        pytest.fail(f"kind {name} has no row in agent_action_kind: do step 2 of 'Add a kind'")
    for name in declared.kinds - names:
        pytest.fail(f"agent_action_kind has a row for {name}, which ActionKind does not declare: do step 1")
    for flag in ("at_most_once", "instance_level", "workspace_level"):
        expected = {k.name for k in kinds if getattr(k, flag)}
        rows: frozenset[str] = getattr(declared, flag)
        if rows != expected:
            pytest.fail(
                f"the kinds whose row in agent_action_kind sets {flag} differ from ActionKind.{flag} "
                f"({sorted(rows)} != {sorted(expected)}): do step 2 of 'Add a kind'"
            )


@pytest.fixture
def conn(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn:
        yield conn


def insert_action(conn: Connection, kind: str, workspace_id: int | None, state: str = "ADMITTED") -> int:
    action_id: int = conn.execute(
        text(
            "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, max_attempts, state)"
            " VALUES (:kind, :workspace, :lane, :key, 5, :state) RETURNING id"
        ),
        {
            "kind": kind,
            "workspace": workspace_id,
            "lane": f"lane{next(_keys)}",
            "key": f"k{next(_keys)}",
            "state": state,
        },
    ).scalar_one()
    return action_id


def claim(conn: Connection, action_id: int) -> None:
    conn.execute(
        text(
            "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1,"
            " lease_expires_at = now() + interval '5 min' WHERE id = :id"
        ),
        {"id": action_id},
    )


@contextmanager
def rolled_back(conn: Connection) -> Iterator[None]:
    """One Hypothesis example's transaction, rolled back after it: the next example finds the table as it was."""
    transaction = conn.begin()
    try:
        yield
    finally:
        transaction.rollback()


def sqlstate(error: DBAPIError) -> str | None:
    return getattr(error.orig, "sqlstate", None)


# -- the registry and the rows agree


def test_the_production_migration_declares_the_production_kinds(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        declared = declared_kinds(conn)
    engine.dispose()
    production = tuple(k for k in ActionKind.all() if k.name in PRODUCTION_KINDS)
    assert_agrees(declared, production)


def test_the_test_database_declares_every_registered_kind(conn: Connection) -> None:
    installed = tuple(kind for kind in ActionKind.all() if kind is not kinds.ROWLESS)  # left out on purpose
    assert_agrees(declared_kinds(conn), installed)


def test_email_is_at_most_once_and_runs_with_or_without_a_workspace() -> None:
    assert ActionKind.EMAIL.at_most_once
    assert ActionKind.EMAIL.instance_level and ActionKind.EMAIL.workspace_level


def test_a_forgotten_step_is_named(conn: Connection) -> None:
    forgotten = ActionKind("NOT_MIGRATED", at_most_once=True, instance_level=False)
    with pytest.raises(pytest.fail.Exception, match="no row in agent_action_kind: do step 2"):
        assert_agrees(declared_kinds(conn), (*ActionKind.all(), forgotten))
    install_kinds(conn, [forgotten])
    with pytest.raises(pytest.fail.Exception, match="ActionKind does not declare: do step 1"):
        assert_agrees(declared_kinds(conn), kinds.ALL)


@pytest.mark.parametrize(
    "changed",
    [
        ActionKind(kinds.ONCE.name, at_most_once=False, instance_level=False),
        ActionKind(kinds.NOOP.name, at_most_once=False, instance_level=True),
        ActionKind(kinds.READBACK.name, at_most_once=False, instance_level=True, workspace_level=True),
    ],
    ids=["at_most_once", "instance_level", "workspace_level"],
)
def test_a_row_whose_flags_differ_from_the_registry_names_the_step(conn: Connection, changed: ActionKind) -> None:
    install_kinds(conn, [changed])  # the row now says what the registry does not
    with pytest.raises(pytest.fail.Exception, match="do step 2 of 'Add a kind'"):
        assert_agrees(declared_kinds(conn), ActionKind.all())
    install_kinds(conn)  # the upsert puts the registry's declaration back
    assert_agrees(declared_kinds(conn), ActionKind.all())


def test_a_kind_is_registered_once_with_one_declaration() -> None:
    with pytest.raises(ValueError, match="already registered"):
        ActionKind.register("EMAIL", at_most_once=False, instance_level=True)
    with pytest.raises(ValueError, match="upper case"):
        ActionKind.register("email", at_most_once=False, instance_level=True)


# -- the table's own rules

NAMES = st.one_of(
    st.text(),
    st.text(alphabet="AZaz09_ ÉéßÄ١²-\n", max_size=8),
    st.from_regex(r"[A-Z0-9_]{1,12}", fullmatch=True),
).filter(lambda name: "\x00" not in name)  # PostgreSQL's text holds no NUL


@PROFILE
@given(name=NAMES)
def test_the_table_takes_exactly_the_names_the_registry_takes(conn: Connection, name: str) -> None:
    if not is_kind_name(name):
        with pytest.raises(ValueError, match="upper case"):
            ActionKind.register(name, at_most_once=False, instance_level=True)
    with rolled_back(conn):
        try:
            install_kinds(conn, [ActionKind(name, at_most_once=False, instance_level=True)])
            taken = True
        except IntegrityError as refused:
            assert "ck_agent_action_kind_name" in str(refused.orig)
            taken = False
    assert taken == is_kind_name(name), name


def test_a_kind_runs_somewhere(conn: Connection) -> None:
    with pytest.raises(IntegrityError, match="ck_agent_action_kind_level"):
        conn.execute(text("INSERT INTO agent_action_kind VALUES ('NOWHERE', false, false, false)"))


def test_a_kind_with_actions_keeps_its_row(conn: Connection) -> None:
    insert_action(conn, kinds.NOOP.name, 1)
    with pytest.raises(IntegrityError, match="fk_agent_action_kind"):
        conn.execute(text("DELETE FROM agent_action_kind WHERE name = :name"), {"name": kinds.NOOP.name})


# -- the foreign key and the guard enforce the rows

REGISTERED = {k.name for k in ActionKind.all()}


@PROFILE
@given(name=st.from_regex(r"[A-Z0-9_]*[A-Z][A-Z0-9_]*", fullmatch=True).filter(lambda n: n not in REGISTERED))
def test_an_action_of_a_kind_without_a_row_is_refused_by_the_foreign_key(conn: Connection, name: str) -> None:
    with rolled_back(conn):
        for workspace in (None, 1):
            with pytest.raises(IntegrityError, match="fk_agent_action_kind"), conn.begin_nested():
                insert_action(conn, name, workspace)
        install_kinds(conn, [ActionKind(name, at_most_once=False, instance_level=True)])
        insert_action(conn, name, None)
        insert_action(conn, name, 1)


@pytest.mark.parametrize("kind", [ActionKind.EMAIL, kinds.NOOP, kinds.READBACK, kinds.ONCE], ids=str)
@pytest.mark.parametrize("workspace_id", [None, 7], ids=["no workspace", "a workspace"])
def test_the_guard_allows_a_workspace_exactly_where_the_kinds_row_does(
    conn: Connection, kind: ActionKind, workspace_id: int | None
) -> None:
    allowed = kind.instance_level if workspace_id is None else kind.workspace_level
    if allowed:
        insert_action(conn, kind.name, workspace_id)
        return
    rule = "not instance level" if workspace_id is None else "not workspace level"
    with pytest.raises(IntegrityError, match=f"{kind.name} is {rule}") as refused:
        insert_action(conn, kind.name, workspace_id)
    assert sqlstate(refused.value) == CHECK_VIOLATION


def test_an_upsert_changes_what_the_guard_allows_next(conn: Connection) -> None:
    moving = ActionKind("TEST_MOVING", at_most_once=False, instance_level=False)
    install_kinds(conn, [moving])
    kept = insert_action(conn, moving.name, 1)
    with pytest.raises(IntegrityError, match="TEST_MOVING is not instance level"), conn.begin_nested():
        insert_action(conn, moving.name, None)
    install_kinds(conn, [ActionKind("TEST_MOVING", at_most_once=False, instance_level=True, workspace_level=False)])
    insert_action(conn, moving.name, None)
    with pytest.raises(IntegrityError, match="TEST_MOVING is not workspace level"), conn.begin_nested():
        insert_action(conn, moving.name, 1)
    # an action already stored stays as it is: the row's flags are read when an action is inserted
    claim(conn, kept)


def test_an_at_most_once_kind_is_never_reclaimed_after_its_write_started_and_another_kind_is(
    conn: Connection,
) -> None:
    for kind, reclaimed in ((kinds.ONCE, False), (ActionKind.EMAIL, False), (kinds.NOOP, True)):
        action_id = insert_action(conn, kind.name, 1)
        claim(conn, action_id)
        conn.execute(text("UPDATE agent_action SET write_started_at = now() WHERE id = :id"), {"id": action_id})
        conn.commit()
        if reclaimed:
            claim(conn, action_id)
            conn.commit()
            assert conn.execute(text("SELECT epoch FROM agent_action WHERE id = :id"), {"id": action_id}).scalar() == 2
        else:
            with pytest.raises(DBAPIError, match="at most once and its write started") as refused:
                claim(conn, action_id)
            assert sqlstate(refused.value) == CHECK_VIOLATION
            conn.rollback()


def test_the_reclaim_reads_at_most_once_from_the_row(conn: Connection) -> None:
    """The guard reads the row when the reclaim happens: changing the flag changes the next reclaim."""
    flipping = ActionKind("TEST_FLIPPING", at_most_once=False, instance_level=False)
    install_kinds(conn, [flipping])
    action_id = insert_action(conn, flipping.name, 1)
    claim(conn, action_id)
    conn.execute(text("UPDATE agent_action SET write_started_at = now() WHERE id = :id"), {"id": action_id})
    conn.commit()
    install_kinds(conn, [ActionKind(flipping.name, at_most_once=True, instance_level=False)])
    with pytest.raises(DBAPIError, match="TEST_FLIPPING is at most once and its write started"):
        claim(conn, action_id)
    conn.rollback()
    install_kinds(conn, [flipping])
    claim(conn, action_id)
    # before its write started, even an at-most-once action is claimed again
    once = insert_action(conn, kinds.ONCE.name, 1)
    claim(conn, once)
    claim(conn, once)
    conn.commit()
