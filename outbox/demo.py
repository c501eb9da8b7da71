"""`outbox demo`: the whole system on one machine, a realistic email workload, and what happened to it.

    embedded PostgreSQL ─ SMTP sink that fails a share of deliveries ─ Prefect server ─ deployments
    ─ metrics exporter ─ worker replicas ─▶ 2,000 emails over 200 lanes through the example notices
    (admins unsubscribing meanwhile) ─▶ progress until every action ended ─▶ summary and URLs

Ctrl-C stops everything the demo started, by PID; `--keep-running` leaves the stack up to explore.
It runs from a clone of the repository (the example application in `examples/`, the deployments in
`deploy/`) with the `demo` extra installed; `outbox.cli.demo` checks both before it imports this module.
Only this process and the workers it starts register the example notices.
"""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Engine, text

from examples.accounts import notices, schema
from outbox import migrate
from outbox.db import start_embedded_postgres, sync_engine
from outbox.email import enqueue_email
from outbox.errors import OutboxError
from outbox.settings import load_settings
from outbox.stack import Stack, answers

console = Console()


def database_url(given: str | None) -> str:
    """The database the operator gave, or an embedded PostgreSQL under OUTBOX_DATA_DIR (the demo only)."""
    if given:
        return given
    data_dir = load_settings().data_dir
    url = start_embedded_postgres(data_dir)
    console.print(f"[dim]no --database-url: using an embedded PostgreSQL in {data_dir / 'pg'}[/dim]")
    return url


def run_demo(
    *,
    emails: int,
    lanes: int,
    workers: int,
    flaky: float,
    unsubscribe: float,
    timeout: float,
    keep_running: bool,
    given_url: str | None,
) -> None:
    """Run outbox for real on this machine: every component started here, a workload, a summary."""
    url = database_url(given_url)
    engine = sync_engine(url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        schema.create(conn)
    workdir = load_settings().data_dir / "demo"
    shutil.rmtree(workdir / "prefect", ignore_errors=True)
    stack = Stack(database_url=url, workdir=workdir, workers=workers, flaky=flaky)
    try:
        with console.status("starting the SMTP sink, Prefect server, deployments, exporter and workers"):
            stack.start()
        console.print(f"Prefect UI: {stack.prefect_url}   metrics: {stack.metrics_url}   mailbox: {stack.mailbox_url}")
        first_id, started = enqueue_workload(engine, emails, lanes), time.monotonic()
        stack.run_drain_now()  # one run per worker now: the first scheduled tick may be 300 s away
        unsubscribe_some(engine, first_id, unsubscribe)
        wait_for_the_end(engine, first_id, emails, timeout)
        elapsed = time.monotonic() - started
        console.print(summary_table(engine, first_id, elapsed, stack))
        console.print(
            f"Prefect UI: {stack.prefect_url}\nmetrics:    {stack.metrics_url}\n"
            f"mailbox:    {stack.mailbox_url}\nlogs:       {workdir}"
        )
        if keep_running:
            console.print("[bold]--keep-running:[/bold] the stack stays up; Ctrl-C stops it.")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        with console.status("stopping every process the demo started"):
            stack.stop()
        engine.dispose()


WORKLOAD_TABLES = (
    "INSERT INTO app_workspace SELECT :base + w, 'Workspace ' || (:base + w) FROM generate_series(1, :lanes) w",
    """INSERT INTO app_account SELECT (:base + w) * 10 + a, 'Admin ' || a,
              'admin' || a || '.ws' || (:base + w) || '@example.com', true
         FROM generate_series(1, :lanes) w, generate_series(1, 2) a""",
    """INSERT INTO app_membership SELECT :base + w, (:base + w) * 10 + a, 'admin'
         FROM generate_series(1, :lanes) w, generate_series(1, 2) a""",
    """INSERT INTO app_alert SELECT (:base * 1000) + g + 1, :base + 1 + (g % :lanes), 'Alert ' || g, 'Details'
         FROM generate_series(0, :emails - 1) g""",
)


def enqueue_workload(engine: Engine, emails: int, lanes: int) -> int:
    """Workspaces with two verified admins each, and `emails` alerts spread over them; returns the first id."""
    with engine.begin() as conn:
        base = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM app_workspace")).scalar_one())
        params = {"base": base, "lanes": lanes, "emails": emails}
        for statement in WORKLOAD_TABLES:
            conn.execute(text(statement), params)
        alerts = conn.execute(
            text("SELECT id, workspace_id FROM app_alert WHERE id > :first ORDER BY id"), {"first": base * 1000}
        ).all()
    first_id: int | None = None
    for start in range(0, len(alerts), 100):  # enqueued in transactions of 100, as an application would
        with engine.begin() as conn:
            for alert_id, workspace_id in alerts[start : start + 100]:
                action = enqueue_email(
                    conn, notices.WORKSPACE_ALERT, {"workspace_id": workspace_id, "alert_id": alert_id}
                )
                first_id = action.id if first_id is None else first_id
    assert first_id is not None
    return first_id


def unsubscribe_some(engine: Engine, first_id: int, share: float) -> None:
    """While the emails go out, both admins of a share of the workspaces unsubscribe: their alerts that
    have not gone out yet end CANCELLED / NOT_WANTED at their next attempt."""
    rng = random.Random(42)
    with engine.begin() as conn:
        workspaces = (
            conn.execute(text("SELECT DISTINCT workspace_id FROM agent_action WHERE id >= :first"), {"first": first_id})
            .scalars()
            .all()
        )
        chosen = [w for w in workspaces if rng.random() < share]
        conn.execute(
            text(
                "INSERT INTO app_unsubscription SELECT account_id, 'workspace_alert' FROM app_membership"
                " WHERE workspace_id = ANY (:chosen) ON CONFLICT DO NOTHING"
            ),
            {"chosen": chosen},
        )


def wait_for_the_end(engine: Engine, first_id: int, total: int, timeout: float) -> None:
    columns = (TextColumn("emails ended"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("ended", total=total)
        deadline = time.monotonic() + timeout
        while (done := ended(engine, first_id)) < total:
            progress.update(bar, completed=done)
            if time.monotonic() > deadline:
                raise OutboxError(f"only {done} of {total} emails ended within {timeout:.0f} s")
            time.sleep(0.5)
        progress.update(bar, completed=total)


def ended(engine: Engine, first_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM agent_action WHERE id >= :first AND ended_at IS NOT NULL"),
                {"first": first_id},
            ).scalar_one()
        )


def summary_table(engine: Engine, first_id: int, elapsed: float, stack: Stack) -> Table:
    with engine.connect() as conn:
        outcomes = conn.execute(
            text(
                "SELECT state, stop_reason, count(*) FROM agent_action WHERE id >= :first GROUP BY 1, 2 ORDER BY 3 DESC"
            ),
            {"first": first_id},
        ).all()
        # per action, on the database clock: from when it was due to its fence (the claim, then the notice
        # prepared, then the fence) in its last attempt; actions that never reached a fence have no pickup
        pickup = conn.execute(
            text(
                "SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP"
                " (ORDER BY extract(epoch FROM write_started_at - due_at)), count(*)"
                " FROM agent_action WHERE id >= :first AND write_started_at IS NOT NULL"
            ),
            {"first": first_id},
        ).one()
    assert stack.sink is not None
    duplicates = sum(1 for count in Counter(r.message_id for r in stack.sink.received).values() if count > 1)
    total = sum(n for _, _, n in outcomes)
    table = Table(title="outbox demo", show_header=False)
    for state, reason, count in outcomes:
        table.add_row(f"{state} {reason}", str(count))
    table.add_row("throughput", f"{total / elapsed:,.0f} emails/s ({total} in {elapsed:.1f} s)")
    table.add_row("pickup p50 / p95 / p99 (due to fence)", _pickup(pickup))
    table.add_row("messages at the sink", str(len(stack.sink.received)))
    table.add_row("duplicates at the sink", str(duplicates))
    for name, url in (
        ("Prefect UI", stack.prefect_url),
        ("metrics", stack.metrics_url),
        ("mailbox", stack.mailbox_url),
    ):
        table.add_row(f"{name} answers", "yes" if answers(url) else "NO")
    return table


def _pickup(row: Any) -> str:
    quantiles, count = row
    if not count:
        return "-"
    return " / ".join(f"{1000 * q:,.0f} ms" for q in quantiles) + f" over {count:,} actions"
