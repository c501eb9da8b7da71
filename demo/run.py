"""`outbox demo`: the whole system on one machine, a realistic workload of effects, and what happened to it.

    embedded PostgreSQL (outbox's tables, or OUTBOX_DATABASE_URL; and always the Prefect server's own
    database `prefect`, made afresh) ─ SMTP sink that fails a share of deliveries ─ webhook receiver that
    fails a share of the first ones ─ nats-server with the stream ACCOUNTS (when installed) ─ Prefect
    server ─ deployments ─ metrics exporter ─ worker replicas
    ─▶ one drain run per worker, waited for until every executor claims
    ─▶ the backlog: 2,000 workspace alerts over 200 workspaces, enqueued at once, each one effect in turn:
       an email (through the example notices; admins unsubscribing meanwhile), a signed webhook to the
       receiver, and an event to the stream (a third each; half emails and half webhooks without
       nats-server), until every one ended
    ─▶ the pickup probe: 100 emails at 20 a second, each in a lane of its own, on the idle executors
    ─▶ summary and URLs ─▶ the drain runs cancelled, every process stopped

One run per worker. Each worker takes runs from the pool's `default` queue (where the schedule puts its
ticks) and from a queue of its own, named after it. The demo puts one drain run in each worker's queue,
so each replica submits exactly one run (no two workers race for a run), and it waits until every run's
executor claims before it enqueues anything: no figure includes the start of a flow-run process. The
relay counts these runs as any others; the schedule's first tick comes 300 s after the deployment.

The figures. The backlog's progress bar and its throughput share one clock, from its first enqueue to
the moment its last action ended. Its wait (due to fence) is how long its actions queued behind one
another in their lanes and for the executors, retries' backoffs included. The pickup is the probe's,
per action that reached its fence in its first attempt: from when it was due (its enqueue's commit) to
its fence (the claim, the notice prepared, the fence), on the database clock.

Stopping. The demo cancels its drain runs as an operator would (a cancelled run hands back what it has
not fenced and is not replaced), waits until they ended, then stops the workers, the exporter and the
Prefect server by PID; the embedded PostgreSQL stops when this process exits. Ctrl-C reaches this
process only (every child runs in a session of its own) and stops everything the same way; a second one
kills what is left. `--keep-running` leaves the stack up to explore until Ctrl-C.

It runs from a clone of the repository (the example application in `examples/`, the deployments in
`deploy/`) with the `demo` extra installed; `outbox demo` checks both before it runs `python -m demo`.
Only this process and the workers it starts register the example notices.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from demo.postgres import embedded_postgres_server
from demo.stack import Stack, answers, flaky_script
from examples.accounts import events, notices, schema, webhooks
from outbox import migrate
from outbox.db import psycopg_url, sync_engine
from outbox.email import enqueue_email
from outbox.errors import OutboxError
from outbox.nats import enqueue_event
from outbox.settings import load_settings
from outbox.webhook import enqueue_webhook

console = Console()

# the Prefect server's database on the embedded PostgreSQL
PREFECT_DATABASE = "prefect"
# how long the drain runs get to start and claim
EXECUTORS_START_SECONDS = 180.0
# the pickup probe: this many emails, one per transaction, at this rate, once the backlog has drained
PROBE_EMAILS = 100
PROBE_RATE = 20
PROGRESS_COLUMNS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


@dataclass(frozen=True)
class Ids:
    """The actions a part of the workload enqueued: ids first..last (nothing else enqueues between)."""

    first: int
    last: int

    def params(self) -> dict[str, int]:
        return {"first": self.first, "last": self.last}


@dataclass(frozen=True)
class Workload:
    # the kinds of the backlog, in the turn its alerts take them
    kinds: tuple[str, ...]
    backlog: Ids
    probe: Ids
    # from the backlog's first enqueue to the moment its last action ended, by its progress bar
    seconds: float


def embedded_server(data_dir: Path) -> Any:
    """The embedded PostgreSQL under `data_dir`. Without XDG_RUNTIME_DIR it keeps its lock file in the
    private temporary folder platformdirs falls back to, which is what a demo needs: no warning about it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
        return embedded_postgres_server(data_dir)


def fresh_prefect_database(server: Any) -> str:
    """Make the Prefect server's database anew on the embedded server; its URL for Prefect (asyncpg,
    through the server's Unix socket)."""
    admin = create_engine(psycopg_url(server.get_uri()), isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{PREFECT_DATABASE}"'))
            conn.execute(text(f'CREATE DATABASE "{PREFECT_DATABASE}"'))
    except OperationalError as error:
        raise OutboxError(
            f"cannot make the Prefect server's database anew ({error.orig}): is another outbox demo running"
            " on this data folder? Stop it first."
        ) from None
    finally:
        admin.dispose()
    url = make_url(server.get_uri(PREFECT_DATABASE)).set(drivername="postgresql+asyncpg")
    return url.render_as_string(hide_password=False)


def run_demo(
    *,
    actions: int,
    lanes: int,
    workers: int,
    flaky: float,
    unsubscribe: float,
    timeout: float,
    keep_running: bool,
    given_url: str | None,
) -> None:
    """Run outbox for real on this machine: every component started here, a workload, a summary."""
    data_dir = load_settings().data_dir
    server = embedded_server(data_dir)
    url = given_url or psycopg_url(server.get_uri())
    if not given_url:
        console.print(f"[dim]no --database-url: using an embedded PostgreSQL in {data_dir / 'pg'}[/dim]")
    engine = sync_engine(url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        schema.create(conn)
    workdir = data_dir / "demo"
    shutil.rmtree(workdir / "prefect", ignore_errors=True)
    stack = Stack(
        database_url=url,
        workdir=workdir,
        workers=workers,
        flaky=flaky,
        prefect_database_url=fresh_prefect_database(server),
    )
    try:
        with console.status("starting the SMTP sink, Prefect server, deployments, exporter and workers"):
            stack.start()
        console.print(f"Prefect UI: {stack.prefect_url}   metrics: {stack.metrics_url}   mailbox: {stack.mailbox_url}")
        with console.status("starting one drain run per worker; waiting until every executor claims"):
            runs, waited = start_executors(stack)
        console.print(f"{len(runs)} executors claiming ({waited:.0f} s after their runs were created); enqueuing")
        kinds = ("EMAIL", "WEBHOOK", "NATS_EVENT") if stack.nats is not None else ("EMAIL", "WEBHOOK")
        if stack.nats is None:
            console.print("[dim]nats-server is not installed: the backlog holds emails and webhooks only[/dim]")
        # the backlog's first pass meets the receiver's faults; a failed webhook is sent again 5 s later and
        # then kept (the receiver fails first deliveries only: a second failure would wait 5 minutes)
        assert stack.receiver is not None
        stack.receiver.script.extend(flaky_script(flaky, -(-actions // len(kinds))))
        workload = run_workload(engine, actions, lanes, kinds, unsubscribe, timeout)
        console.print(summary_table(engine, workload, stack, runs))
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
        with console.status("the drain runs hand back and end; stopping every process the demo started"):
            stack.stop()
        engine.dispose()


def start_executors(stack: Stack) -> tuple[list[str], float]:
    """One drain run per worker, in the worker's own queue; wait until each one's executor claims (its
    run is Running and tagged kind:...). Returns the run ids and the seconds waited."""
    runs = stack.start_drain_per_worker()
    started = time.monotonic()
    while not all(claiming(run) for run in stack.flow_runs(list(runs.values()))):
        if time.monotonic() - started > EXECUTORS_START_SECONDS:
            waiting = [run["name"] for run in stack.flow_runs(list(runs.values())) if not claiming(run)]
            raise OutboxError(
                f"the drain runs {', '.join(waiting)} did not claim within {EXECUTORS_START_SECONDS:.0f} s;"
                f" see the worker logs in {stack.workdir}"
            )
        time.sleep(0.5)
    return list(runs.values()), time.monotonic() - started


def claiming(run: dict[str, Any]) -> bool:
    """A drain run whose executor claims: Running, and tagged with the kinds it carries out."""
    return bool(run["state_type"] == "RUNNING" and any(tag.startswith("kind:") for tag in run["tags"]))


def run_workload(
    engine: Engine, actions: int, lanes: int, kinds: tuple[str, ...], unsubscribe: float, timeout: float
) -> Workload:
    """The backlog (every action enqueued at once, the alerts taking `kinds` in turn, admins unsubscribing
    meanwhile) until every action ended, then the pickup probe (PROBE_EMAILS at PROBE_RATE a second, on idle
    executors) until those ended, each with its progress bar. The throughput takes its seconds from the
    backlog's bar."""
    alerts = make_alerts(engine, actions, lanes)
    probe_alerts = make_alerts(engine, PROBE_EMAILS, PROBE_EMAILS)  # each alone in a lane of its own
    with Progress(*PROGRESS_COLUMNS, console=console) as progress:
        bar = progress.add_task("backlog: actions ended since the first enqueue", total=actions)  # its clock starts
        backlog = enqueue(engine, alerts, kinds)
        unsubscribe_some(engine, backlog, unsubscribe)
        wait_for_the_end(progress, bar, engine, backlog, timeout)
        probe_bar = progress.add_task(f"pickup probe: emails enqueued at {PROBE_RATE}/s, ended", total=PROBE_EMAILS)
        probe = enqueue_paced(engine, probe_alerts, PROBE_RATE)
        wait_for_the_end(progress, probe_bar, engine, probe, timeout)
    seconds = progress.tasks[bar].finished_time
    assert seconds is not None  # the bar is complete
    return Workload(kinds, backlog, probe, seconds)


WORKLOAD_TABLES = (
    "INSERT INTO app_workspace SELECT :base + w, 'Workspace ' || (:base + w) FROM generate_series(1, :lanes) w",
    """INSERT INTO app_account SELECT (:base + w) * 10 + a, 'Admin ' || a,
              'admin' || a || '.ws' || (:base + w) || '@example.com', true
         FROM generate_series(1, :lanes) w, generate_series(1, 2) a""",
    """INSERT INTO app_membership SELECT :base + w, (:base + w) * 10 + a, 'admin'
         FROM generate_series(1, :lanes) w, generate_series(1, 2) a""",
    """INSERT INTO app_alert SELECT (:base * 1000) + g + 1, :base + 1 + (g % :lanes), 'Alert ' || g, 'Details'
         FROM generate_series(0, :alerts - 1) g""",
)


def make_alerts(engine: Engine, count: int, lanes: int) -> list[tuple[int, int]]:
    """`lanes` workspaces with two verified admins each, and `count` alerts spread over them in turn:
    (alert id, workspace id) in order."""
    with engine.begin() as conn:
        base = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM app_workspace")).scalar_one())
        params = {"base": base, "lanes": lanes, "alerts": count}
        for statement in WORKLOAD_TABLES:
            conn.execute(text(statement), params)
        rows = conn.execute(
            text("SELECT id, workspace_id FROM app_alert WHERE id > :first ORDER BY id"), {"first": base * 1000}
        ).all()
    return [(alert_id, workspace_id) for alert_id, workspace_id in rows]


def enqueue(engine: Engine, alerts: list[tuple[int, int]], kinds: tuple[str, ...] = ("EMAIL",)) -> Ids:
    """One effect per alert, of `kinds` in turn, in transactions of 100, as an application would."""
    ids: list[int] = []
    for start in range(0, len(alerts), 100):
        with engine.begin() as conn:
            ids += [
                enqueue_alert(conn, alert, kinds[(start + n) % len(kinds)])
                for n, alert in enumerate(alerts[start : start + 100])
            ]
    return Ids(ids[0], ids[-1])


def enqueue_workload(engine: Engine, emails: int, lanes: int) -> int:
    """`emails` workspace alerts over `lanes` new workspaces, enqueued as an application would; returns the
    first action's id. The stack tests and the soak bench use it."""
    return enqueue(engine, make_alerts(engine, emails, lanes)).first


def enqueue_paced(engine: Engine, alerts: list[tuple[int, int]], per_second: float) -> Ids:
    """One alert email per transaction, `per_second` of them a second, on a steady schedule."""
    ids: list[int] = []
    started = time.monotonic()
    for n, alert in enumerate(alerts):
        time.sleep(max(0.0, started + n / per_second - time.monotonic()))
        with engine.begin() as conn:
            ids.append(enqueue_alert(conn, alert))
    return Ids(ids[0], ids[-1])


def enqueue_alert(conn: Connection, alert: tuple[int, int], kind: str = "EMAIL") -> int:
    """The alert's email to the workspace's admins, its webhook to the workspace's integration, or its event."""
    alert_id, workspace_id = alert
    event = {"workspace_id": workspace_id, "alert_id": alert_id}
    if kind == "WEBHOOK":
        return enqueue_webhook(conn, webhooks.ALERT_RAISED, event).id
    if kind == "NATS_EVENT":
        return enqueue_event(conn, events.ALERT_EVENT, event).id
    return enqueue_email(conn, notices.WORKSPACE_ALERT, event).id


def unsubscribe_some(engine: Engine, backlog: Ids, share: float) -> None:
    """While the emails go out, both admins of a share of the workspaces unsubscribe: their alerts that
    have not gone out yet end CANCELLED / NOT_WANTED at their next attempt."""
    rng = random.Random(42)
    with engine.begin() as conn:
        workspaces = conn.execute(WORKSPACES, backlog.params()).scalars().all()
        chosen = [w for w in workspaces if rng.random() < share]
        conn.execute(
            text(
                "INSERT INTO app_unsubscription SELECT account_id, 'workspace_alert' FROM app_membership"
                " WHERE workspace_id = ANY (:chosen) ON CONFLICT DO NOTHING"
            ),
            {"chosen": chosen},
        )


def wait_for_the_end(progress: Progress, bar: TaskID, engine: Engine, ids: Ids, timeout: float) -> None:
    total = ids.last - ids.first + 1
    deadline = time.monotonic() + timeout
    while (done := ended(engine, ids)) < total:
        progress.update(bar, completed=done)
        if time.monotonic() > deadline:
            raise OutboxError(f"only {done} of {total} actions ended within {timeout:.0f} s")
        time.sleep(0.2)
    progress.update(bar, completed=total)


def ended(engine: Engine, ids: Ids) -> int:
    with engine.connect() as conn:
        return int(conn.execute(ENDED, ids.params()).scalar_one())


WORKSPACES = text("SELECT DISTINCT workspace_id FROM agent_action WHERE id BETWEEN :first AND :last")
ENDED = text("SELECT count(*) FROM agent_action WHERE id BETWEEN :first AND :last AND ended_at IS NOT NULL")
OUTCOMES = text(
    "SELECT kind, state, stop_reason, count(*) FROM agent_action WHERE id BETWEEN :first AND :last"
    " GROUP BY 1, 2, 3 ORDER BY 1, 4 DESC"
)
# the backlog's wait: from when each action was due (enqueued, or its retry's time) to its fence
BACKLOG_WAIT = text("""
    SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
               (ORDER BY extract(epoch FROM write_started_at - due_at)),
           count(*)
      FROM agent_action
     WHERE id BETWEEN :first AND :last AND write_started_at IS NOT NULL
""")
# the pickup: the probe's actions that reached their fence in their first attempt, from when each was
# due (enqueued) to its fence (the claim, the notice prepared, the fence); a retried one waited for its
# backoff and the executor's next look, not for a pickup
PICKUP = text("""
    SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
               (ORDER BY extract(epoch FROM write_started_at - due_at)),
           count(*)
      FROM agent_action
     WHERE id BETWEEN :first AND :last AND write_started_at IS NOT NULL AND attempt = 1
""")


def summary_table(engine: Engine, workload: Workload, stack: Stack, runs: list[str]) -> Table:
    with engine.connect() as conn:
        outcomes = conn.execute(OUTCOMES, workload.backlog.params()).all()
        backlog_wait = conn.execute(BACKLOG_WAIT, workload.backlog.params()).one()
        pickup = conn.execute(PICKUP, workload.probe.params()).one()
    assert stack.sink is not None and stack.receiver is not None
    duplicates = sum(1 for count in Counter(r.message_id for r in stack.sink.received).values() if count > 1)
    total = sum(n for _, _, _, n in outcomes)
    table = Table(title="outbox demo", show_header=False)
    for kind, state, reason, count in outcomes:
        table.add_row(f"backlog: {kind} {state} {reason}", str(count))
    rate = f"{total / workload.seconds:,.0f} actions/s ({total} in {workload.seconds:.1f} s)"
    table.add_row("backlog: throughput, first enqueue to last end", rate)
    table.add_row("backlog: wait p50 / p95 / p99 (due to fence)", _quantiles(backlog_wait))
    table.add_row(f"pickup at {PROBE_RATE}/s p50 / p95 / p99 (due to fence)", _quantiles(pickup))
    table.add_row("drain runs (one per worker)", "\n".join(sorted(run["name"] for run in stack.flow_runs(runs))))
    table.add_row("messages at the sink", str(len(stack.sink.received)))
    table.add_row("duplicates at the sink", str(duplicates))
    deliveries = stack.receiver.deliveries()
    table.add_row("webhooks at the receiver: effects / deliveries", f"{len(deliveries)} / {sum(deliveries.values())}")
    if stack.nats is not None:
        held = asyncio.run(stream_messages(stack.nats.url, events.STREAM))
        table.add_row("events in the stream / distinct Nats-Msg-Id", f"{sum(held.values())} / {len(held)}")
    for name, url in (
        ("Prefect UI", stack.prefect_url),
        ("metrics", stack.metrics_url),
        ("mailbox", stack.mailbox_url),
    ):
        table.add_row(f"{name} answers", "yes" if answers(url) else "NO")
    return table


async def stream_messages(url: str, stream: str) -> Counter[str]:
    """How many messages of `stream` carry each Nats-Msg-Id, read one by one by sequence."""
    client = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        js = client.jetstream()
        state = (await js.stream_info(stream)).state
        held: Counter[str] = Counter()
        for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
            message = await js.get_msg(stream, seq)
            held[(message.headers or {}).get("Nats-Msg-Id", "")] += 1
        return held
    finally:
        await client.close()


def _quantiles(row: Any) -> str:
    quantiles, count = row
    if not count:
        return "-"
    return " / ".join(f"{1000 * q:,.1f} ms" for q in quantiles) + f" over {count:,} actions"
