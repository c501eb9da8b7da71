"""The README's examples run as written, so they never rot."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

README = Path(__file__).resolve().parent.parent / "README.md"


def example(name: str) -> str:
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, f"README has no example named {name}"
    return match.group(1)


def test_the_enqueue_example_runs(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE account (id int PRIMARY KEY, email_verified boolean)"))
        conn.execute(text("INSERT INTO account VALUES (42, true)"))
    exec(compile(example("enqueue"), "README.md", "exec"), {"engine": engine})
    with engine.connect() as conn:
        assert conn.execute(text("SELECT kind, state FROM agent_action")).one() == ("EMAIL", "ADMITTED")
        assert conn.execute(text("SELECT email_verified FROM account")).scalar_one() is False


async def test_the_adapter_example_runs(engine: Engine, aengine: AsyncEngine) -> None:
    import outbox
    from tests import kinds

    with engine.begin() as conn:
        action = outbox.enqueue(
            conn,
            outbox.ActionRequest(kind=kinds.NOOP, workspace_id=1, lane_key="l", idempotency_key="ping", payload={}),
        )
    namespace: dict[str, object] = {"kinds": kinds}
    exec(compile(example("adapter"), "README.md", "exec"), namespace)
    adapter = await namespace["deliver_all"](aengine)  # type: ignore[operator]
    assert adapter.sent == [action.id]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state, readback_ref FROM agent_action")).one() == ("DONE", f"ping-{action.id}")


def test_the_email_example_runs(engine: Engine) -> None:
    from examples.accounts import schema

    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(text("INSERT INTO app_account VALUES (1, 'Alice', 'alice@example.com', true)"))
        conn.execute(text("INSERT INTO app_workspace VALUES (10, 'Research')"))
        conn.execute(text("INSERT INTO app_membership VALUES (10, 1, 'admin')"))
    exec(compile(example("email"), "README.md", "exec"), {"engine": engine})
    with engine.connect() as conn:
        assert conn.execute(text("SELECT kind, payload FROM agent_action")).one() == (
            "EMAIL",
            {"notice": "workspace_alert", "event": {"workspace_id": 10, "alert_id": 101}},
        )


def test_the_retention_example_runs(engine: Engine) -> None:
    from datetime import timedelta

    import outbox
    from tests.support import insert_ended

    with engine.begin() as conn:
        request = outbox.ActionRequest(
            kind=outbox.ActionKind.EMAIL,
            lane_key="account:42",
            idempotency_key="welcome:42",
            payload={},
            subject_account_id=42,
        )
        outbox.enqueue(conn, request)
    insert_ended(engine, ended_ago=timedelta(days=31), count=2)
    kept = insert_ended(engine, ended_ago=timedelta(days=29))
    namespace: dict[str, object] = {"engine": engine}
    exec(compile(example("retention"), "README.md", "exec"), namespace)
    assert (namespace["erased"], namespace["deleted"]) == (1, 2)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM agent_action")).scalars().all() == kept
