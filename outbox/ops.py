"""What an operator reads: the outbox's status, its deepest and oldest lanes, one action, a page of actions.

Each function runs `store_ops` statements on the caller's connection and returns frozen dataclasses, which
the CLI (`outbox.cli.ops`) prints as rich tables or JSON. Times are the database clock's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection, TextClause

from outbox._internal.checks import kind_rows
from outbox._internal.config.limits import MAX_PAGE
from outbox.action import Action
from outbox.destinations import Destination, destinations
from outbox.errors import ActionNotFound, InvalidRequest
from outbox.states import ActionState, StopReason
from outbox.store import application as store
from outbox.store import metrics as store_metrics
from outbox.store import operator as store_ops

# `outbox status` counts the UNCERTAIN actions that ended within this window.
UNCERTAIN_WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class StateKindCount:
    state: ActionState
    kind: str
    actions: int


@dataclass(frozen=True)
class UncertainCount:
    kind: str
    stop_reason: StopReason
    actions: int


@dataclass(frozen=True)
class Status:
    unended: tuple[StateKindCount, ...]
    # what an executor could claim now: due lane heads with nothing of their lane executing, and lost leases
    # it takes back (the figure of `outbox_due_actions`)
    due: int
    oldest_due_seconds: float | None
    # ADMITTED and due, but behind their lane's head or its executing action (`outbox_lane_waiting_actions`)
    waiting_for_lane: int
    lanes_with_backlog: int
    lanes_ready: int
    lanes_executing: int
    executing: int
    expired_leases: int
    uncertain_window_seconds: float
    uncertain: tuple[UncertainCount, ...]
    # the destinations held back: paused, broken or paced (`outbox destinations` lists them all)
    held_destinations: tuple[Destination, ...]


def status(conn: Connection) -> Status:
    """Unended actions by state and kind, what is due now and what waits for its lane, lanes, leases, recent
    UNCERTAIN actions, the destinations held back."""
    unended = tuple(
        StateKindCount(ActionState(row.state), row.kind, row.actions)
        for row in conn.execute(store_ops.COUNT_UNENDED_BY_STATE_AND_KIND)
    )
    claimable = conn.execute(store_metrics.CLAIMABLE_BY_KIND).all()
    due_admitted = sum(row.actions for row in conn.execute(store_metrics.DUE_ADMITTED_BY_KIND))
    ages = [row.oldest_due_seconds for row in claimable if row.actions > 0]
    lanes = conn.execute(store_ops.COUNT_LANES).one()
    window = UNCERTAIN_WINDOW.total_seconds()
    uncertain = tuple(
        UncertainCount(row.kind, StopReason(row.stop_reason), row.actions)
        for row in conn.execute(store_ops.COUNT_UNCERTAIN_SINCE, {"seconds": window})
    )
    return Status(
        unended=unended,
        due=sum(row.actions for row in claimable),
        oldest_due_seconds=max(ages, default=None),
        waiting_for_lane=due_admitted - sum(row.heads for row in claimable),
        lanes_with_backlog=lanes.with_backlog,
        lanes_ready=lanes.ready,
        lanes_executing=lanes.executing,
        executing=sum(c.actions for c in unended if c.state is ActionState.EXECUTING),
        expired_leases=conn.execute(store_ops.COUNT_EXPIRED_LEASES).scalar_one(),
        uncertain_window_seconds=window,
        uncertain=uncertain,
        held_destinations=tuple(d for d in destinations(conn) if not d.is_open),
    )


@dataclass(frozen=True)
class Lane:
    lane_key: str
    # actions not started (PROPOSED or ADMITTED)
    depth: int
    head_id: int
    head_state: ActionState
    head_age_seconds: float
    # an action of the lane is EXECUTING (the head waits for it)
    executing: bool


@dataclass(frozen=True)
class Lanes:
    deepest: tuple[Lane, ...]
    oldest: tuple[Lane, ...]


def lanes(conn: Connection, top: int = 10) -> Lanes:
    """The `top` lanes with the most actions not started, and the `top` whose head came first."""
    if top < 1:
        raise ValueError(f"--top must be at least 1, not {top}")

    def read(statement: TextClause) -> tuple[Lane, ...]:
        rows = conn.execute(statement, {"top": top})
        return tuple(
            Lane(r.lane_key, r.depth, r.head_id, ActionState(r.head_state), r.head_age_seconds, r.executing)
            for r in rows
        )

    return Lanes(deepest=read(store_ops.DEEPEST_LANES), oldest=read(store_ops.OLDEST_LANES))


def get_action(conn: Connection, action_id: int) -> Action:
    row = conn.execute(store.SELECT_ACTION, {"id": action_id}).mappings().first()
    if row is None:
        raise ActionNotFound(action_id)
    return Action.from_row(row)


@dataclass(frozen=True)
class Page:
    actions: tuple[Action, ...]
    # pass as before_id for the next page; None when this page is the last
    next_before_id: int | None


def list_actions(
    conn: Connection,
    *,
    since: timedelta,
    state: ActionState | None = None,
    kind: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
) -> Page:
    """Actions created within `since`, newest first, after the action `before_id` when given."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"--limit must be between 1 and {MAX_PAGE}, not {limit}")
    if kind is not None and kind not in (known := kind_rows.rows(conn).keys()):
        raise InvalidRequest(
            "--kind", f"unknown action kind {kind!r} (the database declares {', '.join(sorted(known))})"
        )
    params: dict[str, object] = {"since_seconds": since.total_seconds(), "state": state, "kind": kind, "limit": limit}
    if before_id is not None:
        position = conn.execute(store_ops.SELECT_ACTION_POSITION, {"id": before_id}).first()
        if position is None:
            raise ActionNotFound(before_id)
        params |= {"before_created_at": position.created_at, "before_id": before_id}
    statement = store_ops.list_actions(state=state is not None, kind=kind is not None, before=before_id is not None)
    actions = tuple(Action.from_row(row) for row in conn.execute(statement, params).mappings())
    return Page(actions, actions[-1].id if len(actions) == limit else None)


@dataclass(frozen=True)
class CellSummary:
    """One cell's line of `outbox status --all-cells`."""

    # due now, and due but waiting behind their lane's head
    backlog: int
    oldest_due_seconds: float | None
    uncertain: int
    # executors that beat within the exporter's silence window
    executors: int
    destinations_paused: int


def cell_summary(conn: Connection) -> CellSummary:
    """The figures an operator of several cells compares, from one database's `status`."""
    report = status(conn)
    silence = {"seconds": store_metrics.EXECUTOR_SILENCE_SECONDS}
    return CellSummary(
        backlog=report.due + report.waiting_for_lane,
        oldest_due_seconds=report.oldest_due_seconds,
        uncertain=sum(count.actions for count in report.uncertain),
        executors=conn.execute(store_metrics.LIVE_EXECUTORS, silence).scalar_one(),
        destinations_paused=sum(1 for held in report.held_destinations if held.state in ("paused", "broken")),
    )
