"""`outbox status|lanes|show|list`: what the outbox holds, read in one snapshot, as tables or `--json`.

Each command reads through `outbox.ops` (index-backed queries in `store_ops`), so it answers in
milliseconds on a table of millions of ended rows; nothing here writes. Every value from the database is
printed through `common.printable`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import typer

from outbox._internal.config.limits import MAX_PAGE
from outbox.cli.options import (
    ID_ARGUMENT,
    JSON_OPTION,
    MAX_BIGINT,
    AllCells,
    Database,
    database_options,
    duration,
    parse_duration,
    printable,
)

if TYPE_CHECKING:
    from outbox.action import Action


@database_options(all_cells=True)
def status(
    json_output: bool = JSON_OPTION,
    *,
    db: Database | AllCells,
) -> None:
    """Unended actions by state and kind, the oldest due action, lanes, leases, the destinations paused,
    broken or paced, UNCERTAIN in the last 24 h. With --all-cells: one line per cell."""
    from rich.table import Table

    from outbox import ops
    from outbox.cli.common import connect, format_age, out, print_json, print_table
    from outbox.cli.destinations import state_text

    if isinstance(db, AllCells):
        return _all_cells_status(db, json_output)
    with connect(db, read_only=True) as conn:
        report = ops.status(conn)
    if json_output:
        print_json(report)
        return
    table = Table(title="unended actions")
    for column in ("state", "kind", "actions"):
        table.add_column(column, justify="right" if column == "actions" else "left")
    for count in report.unended:
        table.add_row(printable(count.state), printable(count.kind), f"{count.actions:,}")
    print_table(table)
    out.print(
        f"due: {report.due:,} to claim now, the oldest due for {format_age(report.oldest_due_seconds)};"
        f" {report.waiting_for_lane:,} more due, waiting for their lane"
    )
    out.print(
        f"lanes: {report.lanes_with_backlog:,} with a backlog, {report.lanes_ready:,} ready,"
        f" {report.lanes_executing:,} executing"
    )
    out.print(
        f"leases: {report.executing:,} executing, {report.expired_leases:,} expired",
        style="red" if report.expired_leases else None,
    )
    for held in report.held_destinations:
        out.print(
            f"destination {printable(held.name)} ({printable(held.kind)}): {state_text(held)};"
            f" {held.waiting:,} waiting",
            style="red" if held.state in ("paused", "broken") else None,
        )
    uncertain = sum(c.actions for c in report.uncertain)
    window = f"{report.uncertain_window_seconds / 3600:g} h"
    if not uncertain:
        out.print(f"UNCERTAIN in the last {window}: 0")
        return
    table = Table(title=f"UNCERTAIN in the last {window}: {uncertain:,}", title_style="bold red")
    for column in ("kind", "stop reason", "actions"):
        table.add_column(column, justify="right" if column == "actions" else "left")
    for recent in report.uncertain:
        table.add_row(printable(recent.kind), printable(recent.stop_reason), f"{recent.actions:,}")
    print_table(table)


def _all_cells_status(cells: AllCells, json_output: bool) -> None:
    """`status --all-cells`: one line per cell; exit 1 after the lines when a cell could not be read."""
    from rich.table import Table

    from outbox.cli.all_cells import CellsFailed, summaries
    from outbox.cli.common import format_age, print_json, print_table

    lines = summaries(cells.connect_timeout, cells.statement_timeout)
    if json_output:
        print_json(lines)
    else:
        table = Table(title="cells")
        columns = ("cell", "revision", "backlog", "oldest due", "UNCERTAIN 24 h", "executors", "paused", "fault")
        for column in columns:
            figure = column in ("backlog", "UNCERTAIN 24 h", "executors", "paused")
            table.add_column(column, justify="right" if figure else "left")
        for line in lines:
            s = line.summary
            table.add_row(
                printable(line.cell),
                printable(line.revision or "-"),
                f"{s.backlog:,}" if s else "-",
                format_age(s.oldest_due_seconds) if s else "-",
                f"{s.uncertain:,}" if s else "-",
                f"{s.executors:,}" if s else "-",
                f"{s.destinations_paused:,}" if s else "-",
                printable(line.fault or ""),
            )
        print_table(table)
    failed = [line.cell for line in lines if line.fault]
    if failed:
        raise CellsFailed(f"{len(failed)} of {len(lines)} cells could not be read: {', '.join(failed)}")


@database_options()
def lanes(
    top: int = typer.Option(10, min=1, max=MAX_PAGE, help="How many lanes in each list."),
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """The deepest lanes (most actions not started) and the oldest (whose head came first)."""
    from rich.table import Table

    from outbox import ops
    from outbox.cli.common import connect, format_age, print_json, print_table

    with connect(db, read_only=True) as conn:
        report = ops.lanes(conn, top)
    if json_output:
        print_json(report)
        return
    for title, rows in (("deepest lanes", report.deepest), ("oldest lanes", report.oldest)):
        table = Table(title=title)
        for column in ("lane", "depth", "head id", "head state", "head age", "executing"):
            table.add_column(column, justify="right" if column in ("depth", "head id") else "left")
        for lane in rows:
            table.add_row(
                printable(lane.lane_key),
                f"{lane.depth:,}",
                str(lane.head_id),
                printable(lane.head_state),
                format_age(lane.head_age_seconds),
                "yes" if lane.executing else "",
            )
        print_table(table)


@database_options()
def show(
    action_id: int = ID_ARGUMENT,
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """One action in full: every time, what went wrong last, its readback reference (an event's stream and
    sequence), its trace (an email's notice and Message-ID, a webhook's webhook-id, an event's subject and
    Nats-Msg-Id, kept after it ends) and its payload only while it has one (an ended action keeps none)."""
    from rich.table import Table

    from outbox import ops
    from outbox.cli.common import connect, print_json, print_table

    with connect(db, read_only=True) as conn:
        action = ops.get_action(conn, action_id)
    if json_output:
        print_json(action)
        return
    table = Table(title=f"action {action.id}", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # a long value (a Message-ID, a key) wraps, never cut short
    for field, value in _fields(action):
        table.add_row(printable(field), printable(value))
    print_table(table)


# how `outbox show` labels the trace fields outbox's own adapters note (any other field shows by its name)
_TRACE_LABELS = {
    "notice": "notice",
    "message_id": "Message-ID",
    "webhook_id": "webhook-id",
    "event_type": "event type",
    "msg_id": "Nats-Msg-Id",
    "seq_floor": "stream sequence before the publish",
}


def _fields(action: Action) -> list[tuple[str, str]]:
    from outbox.cli.common import utc

    def when(value: datetime | None) -> str:
        return "-" if value is None else utc(value)

    fields = [
        ("state", action.state.value),
        ("stop reason", action.stop_reason or "-"),
        ("kind", action.kind),
        ("lane", action.lane_key),
        ("idempotency key", action.idempotency_key),
        ("workspace", str(action.workspace_id or "-")),
        ("subject account", str(action.subject_account_id or "-")),
        ("attempts", f"{action.attempt} of {action.max_attempts}"),
        ("epoch", str(action.epoch)),
        ("created", when(action.created_at)),
        ("due", when(action.due_at)),
        ("expires", when(action.expires_at)),
        ("lease expires", when(action.lease_expires_at)),
        ("write started", when(action.write_started_at)),
        ("ended", when(action.ended_at)),
        ("readback reference", action.readback_ref or "-"),
        ("last error", action.last_error or "-"),
    ]
    # what finds the action at its provider: an email's notice and Message-ID
    fields += [(_TRACE_LABELS.get(key, str(key)), str(value)) for key, value in (action.trace or {}).items()]
    if action.payload is not None:
        fields.append(("payload", str(action.payload)))
    return fields


@database_options()
def list_(
    state: str | None = typer.Option(None, help="Only this state (PROPOSED, ADMITTED, EXECUTING, DONE, ...)."),
    kind: str | None = typer.Option(None, help="Only this kind."),
    since: str = typer.Option(
        "24h", callback=duration("--since"), help="Created within this long: 30d, 24h, 15m, 90s (at most 36500d)."
    ),
    limit: int = typer.Option(50, min=1, max=MAX_PAGE, help="Actions per page."),
    before_id: int | None = typer.Option(
        None, min=1, max=MAX_BIGINT, help="The next page: the last id of the page before."
    ),
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """Actions newest first, paged by id."""
    from rich.table import Table

    from outbox import ops
    from outbox.cli.common import connect, out, parse_state, print_json, print_table, utc

    window = parse_duration("--since", since)
    wanted_state = parse_state(state) if state is not None else None
    with connect(db, read_only=True) as conn:
        page = ops.list_actions(
            conn,
            since=window,
            state=wanted_state,
            kind=kind.strip().upper() if kind is not None else None,
            limit=limit,
            before_id=before_id,
        )
    if json_output:
        print_json(page)
        return
    table = Table(title=f"actions created in the last {since.strip()}, newest first")
    for column in ("id", "created (UTC)", "state", "stop reason", "kind", "lane", "attempts"):
        table.add_column(column, no_wrap=column in ("id", "created (UTC)"), overflow="fold")
    for action in page.actions:
        table.add_row(
            str(action.id),
            utc(action.created_at),
            printable(action.state),
            printable(action.stop_reason or ""),
            printable(action.kind),
            printable(action.lane_key),
            f"{action.attempt}/{action.max_attempts}",
        )
    print_table(table)
    if page.next_before_id is not None:
        out.print(f"next page: --before-id {page.next_before_id}")
