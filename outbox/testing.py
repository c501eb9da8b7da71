"""Helpers for tests, ours and our users': the kinds the database declares, and test kinds added to it.

A kind is declared to the database by its row in `agent_action_kind` (step 2 of "Add a kind").
`declared_kinds` reads those rows; `install_kinds` upserts the rows of kinds registered only by a test
set-up, so test kinds never ship in a production migration.
`drain` runs an executor the way a test wants it: every waiting action made due, until none is due.
The scheduler is off in tests: nothing runs unless a test drains.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from outbox import migrate
from outbox._internal.checks import kind_rows
from outbox.kinds import ActionKind
from outbox.store import destinations as store_destinations
from outbox.store import executor as store_executor

if TYPE_CHECKING:  # the executor loads with `drain`, not with the kinds' helpers
    from sqlalchemy.ext.asyncio import AsyncEngine

    from outbox.executor import ActionAdapter, ExecutorConfig
    from outbox.executor.outcomes import Outcomes


@dataclass(frozen=True)
class DeclaredKinds:
    """The names of the kinds the database declares, and of those with each flag set."""

    kinds: frozenset[str]
    instance_level: frozenset[str]
    workspace_level: frozenset[str]
    at_most_once: frozenset[str]


def declared_kinds(conn: Connection) -> DeclaredKinds:
    """The kinds as the rows of `agent_action_kind` declare them."""
    rows = kind_rows.rows(conn)
    return DeclaredKinds(
        kinds=frozenset(rows),
        instance_level=frozenset(name for name, row in rows.items() if row.instance_level),
        workspace_level=frozenset(name for name, row in rows.items() if row.workspace_level),
        at_most_once=frozenset(name for name, row in rows.items() if row.at_most_once),
    )


def install_kinds(conn: Connection, kinds: Iterable[ActionKind] | None = None) -> None:
    """Step 2 of "Add a kind" for every registered kind (or `kinds`), applied to this database: each kind's
    row is inserted, or updated to the kind's declaration (`outbox.migrate.declare_kinds`). Kinds not given
    keep their rows."""
    migrate.declare_kinds(conn, ActionKind.all() if kinds is None else kinds)


async def drain(
    engine: AsyncEngine,
    adapters: Iterable[ActionAdapter],
    config: ExecutorConfig | None = None,
    *,
    max_rounds: int = 50,
) -> Outcomes:
    """Make every waiting action due and run the executor until none is due; return what it did.

    A retry's backoff or a deferral is cut short each round, so retries run to their last attempt; so are the
    pauses and paces a provider's slow-downs set (an operator's pause and a configured rate stay).
    `max_rounds` bounds an adapter that defers forever. Leases are left alone: a test that wants one
    to expire says so in SQL.
    """
    from outbox.executor import Executor

    executor = Executor(engine, adapters, config, listen=False)
    for _ in range(max_rounds):
        async with engine.begin() as conn:
            made_due = (await conn.execute(store_executor.MAKE_WAITING_DUE)).rowcount
            made_due += (await conn.execute(store_destinations.END_PROVIDER_PAUSES)).rowcount
        before = executor.outcomes.attempted
        await executor.run(until_idle=True)
        if made_due == 0 and executor.outcomes.attempted == before:
            break
    return executor.outcomes
