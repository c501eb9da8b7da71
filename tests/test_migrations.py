"""`outbox db upgrade` builds the whole store; `outbox db downgrade` removes every object it created."""

from __future__ import annotations

from sqlalchemy import Connection, create_engine, text

from outbox import migrate


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
        "table agent_lane",
        "table ux_agent_action_lane_executing",
        "table ux_agent_action_idempotency_key",
        "table ix_agent_lane_ready",
        "table ix_agent_action_lane_pending",
        "table ix_agent_action_ended",
        "table ix_agent_action_subject",
        "function guard_agent_action",
        "trigger guard_agent_action",
        "trigger track_agent_lane_insert",
    } <= created
    with engine.begin() as conn:
        migrate.downgrade(conn)
        assert objects(conn) == before
    with engine.begin() as conn:  # and up again: the downgrade left nothing in the way
        migrate.upgrade(conn)
        assert objects(conn) - before == created
    engine.dispose()
