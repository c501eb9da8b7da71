"""Whether the database declares a kind as the code does: the two halves of "Add a kind" compared.

    ActionKind (registered in code) ─┐
                                     ├─ mismatch(kind, row) ─▶ None when they agree, else one line naming the step
    its row in agent_action_kind ────┘                          (no row: declare it; a row that differs: upsert it)
    differences(conn, kinds) ─▶ the lines of every kind whose row is missing or differs
    require_declared(engine, kinds) ─▶ KindsNotDeclared (those lines) before an executor starts

Enqueue refuses an action of such a kind before the database would (`InvalidRequest("kind", line)`), and
`outbox run` and the drain flow refuse to start with one line per kind, so neither the foreign key
`fk_agent_action_kind` nor the guard `guard_agent_action` is the first to notice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from outbox.errors import OutboxError
from outbox.kinds import ActionKind
from outbox.store import application as store

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

_FLAGS = ("at_most_once", "instance_level", "workspace_level")


@dataclass(frozen=True)
class KindRow:
    """A kind's row in `agent_action_kind`: the three facts the database checks."""

    at_most_once: bool
    instance_level: bool
    workspace_level: bool


def mismatch(kind: ActionKind, row: KindRow | None) -> str | None:
    """None when `row` declares `kind` as the code does; otherwise the line that names what to do."""
    if row is None:
        return (
            f"kind {kind.name} has no row in agent_action_kind: declare it in a migration that runs after"
            f" outbox's own, with outbox.migrate.declare_kinds(op, [{kind.name}])"
        )
    differing = [
        f"{flag}={str(getattr(row, flag)).lower()} (the code: {str(getattr(kind, flag)).lower()})"
        for flag in _FLAGS
        if getattr(row, flag) != getattr(kind, flag)
    ]
    if not differing:
        return None
    return (
        f"kind {kind.name}: its row in agent_action_kind declares {', '.join(differing)}; declare it again in"
        f" a new migration with outbox.migrate.declare_kinds(op, [{kind.name}]), or change the code to match"
    )


def rows(conn: Connection) -> dict[str, KindRow]:
    """Every kind's row, by name."""
    return {
        row.name: KindRow(row.at_most_once, row.instance_level, row.workspace_level)
        for row in conn.execute(store.SELECT_KINDS)
    }


def differences(conn: Connection, kinds: Iterable[ActionKind]) -> list[str]:
    """One line for each of `kinds` whose row is missing or declares it otherwise, in name order."""
    declared = rows(conn)
    lines = (mismatch(kind, declared.get(kind.name)) for kind in sorted(kinds, key=lambda k: k.name))
    return [line for line in lines if line is not None]


class KindsNotDeclared(OutboxError):
    """An executor's kinds that the database does not declare as the code does: it refuses to start (exit 1,
    like a schema that is behind). `lines` holds one line per kind."""

    exit_code = 1

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


async def require_declared(engine: AsyncEngine, kinds: Iterable[ActionKind]) -> None:
    """Raise KindsNotDeclared when a row of `kinds` is missing or declares its kind otherwise."""
    chosen = list(kinds)
    async with engine.connect() as conn:
        lines = await conn.run_sync(lambda sync: differences(sync, chosen))
    if lines:
        raise KindsNotDeclared(lines)
