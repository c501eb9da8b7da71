"""`outbox admit|refuse|cancel|erase-account|purge`: the operator commands that change the outbox.

admit, refuse, cancel and erase-account each run in one transaction through the library functions
(`outbox.admit`, `refuse`, `cancel`, `erase_account`); purge commits batch by batch (`outbox.retention`).
"""

from __future__ import annotations

import time
from typing import Literal

import typer

from outbox._internal.config.limits import PURGE_BATCH_SIZE
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

# rows per purge batch: each batch is one transaction and holds its row locks until it commits
MAX_PURGE_BATCH_SIZE = 100_000


def _decide(decision: Literal["admit", "refuse", "cancel"], action_id: int, json_output: bool, db: Database) -> None:
    """`decision` names the library function: admit, refuse or cancel."""
    import outbox
    from outbox.cli.common import connect, out, print_json

    with connect(db) as conn:
        action = getattr(outbox, decision)(conn, action_id)
    if json_output:
        print_json(action)
    else:
        reason = f" ({printable(action.stop_reason)})" if action.stop_reason else ""
        out.print(f"action {action.id} is {printable(action.state)}{reason}")


@database_options()
def admit(
    action_id: int = ID_ARGUMENT,
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """Admit a PROPOSED action: it waits its turn in its lane."""
    _decide("admit", action_id, json_output, db)


@database_options()
def refuse(
    action_id: int = ID_ARGUMENT,
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """Refuse a PROPOSED action: it ends CANCELLED (PROPOSAL_REFUSED)."""
    _decide("refuse", action_id, json_output, db)


@database_options()
def cancel(
    action_id: int = ID_ARGUMENT,
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """Cancel an action that has not started (PROPOSED or ADMITTED): it ends CANCELLED (OPERATOR_CANCELLED)."""
    _decide("cancel", action_id, json_output, db)


@database_options(all_cells=True)
def erase_account(
    account_id: int = typer.Argument(..., metavar="ACCOUNT_ID", min=1, max=MAX_BIGINT, help="The erased account's id."),
    json_output: bool = JSON_OPTION,
    *,
    db: Database | AllCells,
) -> None:
    """Delete every action whose subject is the account, in every state; a write past its fence still happens.
    With --all-cells: in every cell (the one that holds the account erases its actions)."""
    import outbox
    from outbox.cli.common import connect, out, print_json

    if isinstance(db, AllCells):
        return _erase_in_all_cells(account_id, db, json_output)

    with connect(db) as conn:
        erased = outbox.erase_account(conn, account_id)
    if json_output:
        print_json({"account_id": account_id, "erased": erased})
    else:
        out.print(f"erased {erased:,} actions of account {account_id}")


def _erase_in_all_cells(account_id: int, cells: AllCells, json_output: bool) -> None:
    from outbox.cli.all_cells import CellsFailed, erase_everywhere
    from outbox.cli.common import out, print_json

    lines = erase_everywhere(account_id, cells.connect_timeout, cells.statement_timeout)
    if json_output:
        print_json({"account_id": account_id, "cells": lines})
    else:
        for line in lines:
            done = f"erased {line.erased:,} actions of account {account_id}" if line.erased is not None else ""
            out.print(f"cell {line.cell}: {done or 'not erased: ' + printable(line.fault)}")
    failed = [line.cell for line in lines if line.fault]
    if failed:
        raise CellsFailed(
            f"account {account_id} is not erased in {', '.join(failed)}: run the erasure again once they answer"
        )


@database_options()
def purge(
    older_than: str = typer.Option(
        "30d",
        callback=duration("--older-than"),
        help="Delete actions that ended longer ago than this: 30d, 24h, 15m, 90s (at most 36500d).",
    ),
    batch_size: int = typer.Option(
        PURGE_BATCH_SIZE, min=1, max=MAX_PURGE_BATCH_SIZE, help="Rows per batch, each its own transaction."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing."),
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """Delete ended actions older than the retention window, in short batches (safe on several replicas)."""
    from outbox import retention
    from outbox.cli.common import connect, migrated_engine, out, print_json

    window = parse_duration("--older-than", older_than)
    shown = older_than.strip()
    if dry_run:
        with connect(db, read_only=True) as conn:
            count = retention.count_purgeable(conn, window)
        if json_output:
            print_json({"older_than_seconds": window.total_seconds(), "would_delete": count})
        else:
            out.print(f"would delete {count:,} actions that ended more than {shown} ago")
        return
    engine = migrated_engine(db)
    try:
        started = time.perf_counter()
        deleted = retention.purge_ended(engine, window, batch_size)
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    if json_output:
        print_json({"older_than_seconds": window.total_seconds(), "deleted": deleted, "seconds": round(seconds, 3)})
    else:
        out.print(f"deleted {deleted:,} actions that ended more than {shown} ago in {seconds:.1f} s")
