"""The database and the Python registry agree on every kind: the checks of "Add a kind", step by step."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from outbox import migrate
from outbox.kinds import PRODUCTION_KINDS, ActionKind
from outbox.testing import DeclaredKinds, declared_kinds


def assert_agrees(declared: DeclaredKinds, kinds: tuple[ActionKind, ...]) -> None:
    names = {k.name for k in kinds}
    for name in names - declared.kinds:
        pytest.fail(f"kind {name} is not in ck_agent_action_kind: do step 2 of 'Add a kind'")
    for name in declared.kinds - names:
        pytest.fail(f"ck_agent_action_kind lists {name}, which ActionKind does not declare: do step 1")
    expected_once = {k.name for k in kinds if k.at_most_once}
    assert declared.at_most_once == expected_once, (
        "the at-most-once kinds in guard_agent_action differ from ActionKind.at_most_once "
        f"({sorted(declared.at_most_once)} != {sorted(expected_once)}): do step 2 of 'Add a kind'"
    )
    expected_instance = {k.name for k in kinds if k.instance_level}
    assert declared.instance_level == expected_instance, (
        "the instance-level kinds in ck_agent_action_workspace differ from ActionKind.instance_level "
        f"({sorted(declared.instance_level)} != {sorted(expected_instance)}): do step 2 of 'Add a kind'"
    )
    expected_workspace = {k.name for k in kinds if k.workspace_level}
    assert declared.workspace_level == expected_workspace, (
        "the workspace kinds in ck_agent_action_workspace differ from ActionKind.workspace_level "
        f"({sorted(declared.workspace_level)} != {sorted(expected_workspace)}): do step 2 of 'Add a kind'"
    )


def test_the_production_migration_declares_the_production_kinds(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        declared = declared_kinds(conn)
    engine.dispose()
    production = tuple(k for k in ActionKind.all() if k.name in PRODUCTION_KINDS)
    assert_agrees(declared, production)


def test_the_test_database_declares_every_registered_kind(engine) -> None:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        assert_agrees(declared_kinds(conn), ActionKind.all())


def test_email_is_at_most_once_and_runs_with_or_without_a_workspace() -> None:
    assert ActionKind.EMAIL.at_most_once
    assert ActionKind.EMAIL.instance_level and ActionKind.EMAIL.workspace_level


def test_a_forgotten_step_is_named(engine) -> None:  # type: ignore[no-untyped-def]
    forgotten = ActionKind("NOT_MIGRATED", at_most_once=True, instance_level=False)
    with engine.connect() as conn, pytest.raises(pytest.fail.Exception, match="do step 2"):
        assert_agrees(declared_kinds(conn), (*ActionKind.all(), forgotten))


def test_a_kind_is_registered_once_with_one_declaration() -> None:
    with pytest.raises(ValueError, match="already registered"):
        ActionKind.register("EMAIL", at_most_once=False, instance_level=True)
    with pytest.raises(ValueError, match="upper case"):
        ActionKind.register("email", at_most_once=False, instance_level=True)
