"""Helpers for tests, ours and our users': the kinds the database declares, and test kinds added to it.

`declared_kinds` reads the three places step 2 of "Add a kind" edits (`ck_agent_action_kind`,
`ck_agent_action_workspace`, the at-most-once list in `guard_agent_action`). `install_kinds` applies that
step for kinds registered only by a test set-up, so test kinds never ship in a production migration.
`drain` runs an executor the way a test wants it: every waiting action made due, until none is due.
The scheduler is off in tests: nothing runs unless a test drains.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection, text

from outbox import store
from outbox.kinds import ActionKind

if TYPE_CHECKING:  # the executor loads with `drain`, not with `declared_kinds` (the operator commands use it)
    from sqlalchemy.ext.asyncio import AsyncEngine

    from outbox.executor import ActionAdapter, ExecutorConfig
    from outbox.executor.outcomes import Outcomes

_ANY_ARRAY = re.compile(r"ANY \(ARRAY\[(.*?)\]\)")
_GUARD_LIST = re.compile(r"(at_most_once_kinds CONSTANT text\[\] := )ARRAY\[(.*?)\](?:::text\[\])?;")


@dataclass(frozen=True)
class DeclaredKinds:
    kinds: frozenset[str]
    instance_level: frozenset[str]
    workspace_level: frozenset[str]
    at_most_once: frozenset[str]


def _names(sql_list: str) -> frozenset[str]:
    return frozenset(re.findall(r"'([A-Z0-9_]+)'", sql_list))


def declared_kinds(conn: Connection) -> DeclaredKinds:
    """The kinds as the database's constraints and trigger list them."""
    rows = conn.execute(
        text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname IN ('ck_agent_action_kind', 'ck_agent_action_workspace')"
        )
    )
    definitions: dict[str, str] = {name: definition for name, definition in rows}
    kind_lists = _ANY_ARRAY.findall(definitions["ck_agent_action_kind"])
    instance_list, workspace_list = _ANY_ARRAY.findall(definitions["ck_agent_action_workspace"])
    guard = conn.execute(text("SELECT prosrc FROM pg_proc WHERE proname = 'guard_agent_action'")).scalar_one()
    match = _GUARD_LIST.search(guard)
    if match is None:
        raise RuntimeError("guard_agent_action has no at_most_once_kinds list")
    return DeclaredKinds(
        kinds=_names(kind_lists[0]),
        instance_level=_names(instance_list),
        workspace_level=_names(workspace_list),
        at_most_once=_names(match.group(2)),
    )


def _array(names: Iterable[str]) -> str:
    quoted = ", ".join(f"'{name}'" for name in sorted(names))
    return f"ARRAY[{quoted}]::text[]"


def install_kinds(conn: Connection, kinds: Iterable[ActionKind] | None = None) -> None:
    """Step 2 of "Add a kind" for every registered kind (or `kinds`), applied to this database."""
    chosen = tuple(kinds) if kinds is not None else ActionKind.all()
    everything = _array(k.name for k in chosen)
    instance = _array(k.name for k in chosen if k.instance_level)
    workspace = _array(k.name for k in chosen if k.workspace_level)
    conn.execute(
        text(
            "ALTER TABLE agent_action DROP CONSTRAINT ck_agent_action_kind,"
            " DROP CONSTRAINT ck_agent_action_workspace,"
            f" ADD CONSTRAINT ck_agent_action_kind CHECK (kind = ANY ({everything})),"
            " ADD CONSTRAINT ck_agent_action_workspace CHECK ("
            f"(workspace_id IS NOT NULL OR kind = ANY ({instance}))"
            f" AND (workspace_id IS NULL OR kind = ANY ({workspace})))"
        )
    )
    definition = conn.execute(text("SELECT pg_get_functiondef('guard_agent_action'::regproc)")).scalar_one()
    at_most_once = _array(k.name for k in chosen if k.at_most_once)
    rewritten, count = _GUARD_LIST.subn(lambda m: f"{m.group(1)}{at_most_once};", definition)
    if count != 1:
        raise RuntimeError("guard_agent_action has no at_most_once_kinds list to rewrite")
    conn.execute(text(rewritten.replace(":", r"\:")))


async def drain(
    engine: AsyncEngine,
    adapters: Iterable[ActionAdapter],
    config: ExecutorConfig | None = None,
    *,
    max_rounds: int = 50,
) -> Outcomes:
    """Make every waiting action due and run the executor until none is due; return what it did.

    A retry's backoff or a deferral is cut short each round, so retries run to their last attempt.
    `max_rounds` bounds an adapter that defers forever. Leases are left alone: a test that wants one
    to expire says so in SQL.
    """
    from outbox.executor import Executor

    executor = Executor(engine, adapters, config, listen=False)
    for _ in range(max_rounds):
        async with engine.begin() as conn:
            made_due = (await conn.execute(store.MAKE_WAITING_DUE)).rowcount
        before = executor.outcomes.attempted
        await executor.run(until_idle=True)
        if made_due == 0 and executor.outcomes.attempted == before:
            break
    return executor.outcomes
