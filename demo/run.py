"""`outbox demo`: the whole system on one machine, a realistic workload of effects, and what happened to it.

    embedded PostgreSQL (outbox's database `outbox`, made empty for each run, or OUTBOX_DATABASE_URL, kept
    as it is; and always the Prefect server's own database `prefect`, made afresh) ─ its URL printed,
    with the `outbox status` command that reads it ─ SMTP sink that fails a share of deliveries ─ webhook
    receiver that fails a share of the first ones ─ nats-server with the stream ACCOUNTS (when installed)
    ─ the local Slack, GitHub and GitLab APIs ─ Prefect server ─ deployments ─ metrics exporter ─ worker
    replicas ─ Prometheus with the shipped alert rules (when installed; else the command that starts one),
    each part said as it starts
    ─▶ the backlog: 2,000 workspace alerts over 200 workspaces, enqueued before any executor runs (so it is
       there to see, due), each one effect in turn: an email (through the example notices; the admins of a
       share of the workspaces unsubscribed), a signed webhook to the receiver, and an event to the stream
       (a third each; half emails and half webhooks without nats-server)
    ─▶ the posts (demo.posts): one application transaction raises an alert of that storm, with a Slack
       message, a comment on a pull request, a product-feedback issue and a GitLab note
    ─▶ one drain run per worker (saying what each one waits for), until every action of the backlog ended
    ─▶ the alert resolved: a reply in the Slack message's thread (its ts, from the message's action)
    ─▶ the pickup probe: 100 emails at 20 a second, each in a lane of its own, on the idle executors
    ─▶ summary (demo.summary: the posts as the local APIs stored them), URLs, the drain runs' pages
    ─▶ the drain runs hand back and end, each one's
       final state printed ─▶ every process stopped

One run per worker. Each worker takes runs from the pool's `default` queue (where the schedule puts its
ticks) and from a queue of its own, named after it. The demo puts one drain run in each worker's queue,
so each replica submits exactly one run (no two workers race for a run). The relay counts these runs as
any others; the schedule's first tick comes 300 s after the deployment.

What it shows while it works (demo.progress): on a terminal a spinner per step and a bar per count; sent
to a file or a pipe, a line per step and per news, and a count's line every few seconds.

The figures, on the database clock. The backlog's throughput counts from its first fence to the moment its
last action ended: no figure includes the start of a flow-run process. Its wait is from when an action
could be claimed (due, and the first fence made: executors running) to its fence: how long its actions
queued behind one another in their lanes and for the executors, retries' backoffs included.
The pickup is the probe's, per action that reached its fence in its first attempt: from when it was due
(its enqueue's commit) to its fence (the claim, the notice prepared, the fence). The summary says which actions each
figure counts, and the probe's outcomes stand beside the backlog's.

The database. Without OUTBOX_DATABASE_URL, outbox's database is `outbox` on the embedded PostgreSQL,
dropped and made empty at each run's start, so `outbox status` shows this run only; its URL carries no
password (the server listens on a socket in the data folder and trusts local connections), so the demo
prints it whole. A database given in OUTBOX_DATABASE_URL is the user's: the demo adds its actions and
keeps what it held, and prints its URL with the password hidden.

Stopping. The demo stops its stack (demo.stack): the drain runs hand back what they have not fenced and
end, then the workers, the exporter and the Prefect server stop by PID; the embedded PostgreSQL stops
when this process exits. Ctrl-C reaches this process only (every child runs in a session of its own)
and stops everything the same way; a second one kills what is left. `--keep-running` leaves the stack up
to explore until Ctrl-C.

It runs from a clone of the repository (the example application in `examples/`, the deployments in
`deploy/`) with the `demo` extra installed; `outbox demo` checks both before it runs `python -m demo`.
Only this process and the workers it starts register the example notices.
"""

from __future__ import annotations

import random
import shlex
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

from demo import posts, prometheus
from demo.commands import outbox_command
from demo.postgres import embedded_postgres_server, fresh_database
from demo.posts import Posts
from demo.progress import Count, counts, step
from demo.stack import Stack, flaky_script
from demo.summary import Ids, Workload, print_summary
from examples.accounts import events, notices, schema, webhooks
from outbox import migrate, ops
from outbox.db import sync_engine
from outbox.email import enqueue_email
from outbox.errors import OutboxError
from outbox.nats import enqueue_event
from outbox.settings import load_settings
from outbox.webhook import enqueue_webhook

console = Console()

# outbox's database and the Prefect server's on the embedded PostgreSQL, both made anew at each run
OUTBOX_DATABASE = "outbox"
PREFECT_DATABASE = "prefect"
# how long the drain runs get to start and claim
EXECUTORS_START_SECONDS = 180.0
# the pickup probe: this many emails, one per transaction, at this rate, once the backlog has drained
PROBE_EMAILS = 100
PROBE_RATE = 20
# what a drain run on its way to claiming is doing, by its state
WAITING_FOR = {
    "SCHEDULED": "waiting for a worker to poll (every {poll} s)",
    "PENDING": "process starting",
    "RUNNING": "executor starting",
}
# a drain run that reached one of these will never claim
ENDED_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def embedded_server(data_dir: Path) -> Any:
    """The embedded PostgreSQL under `data_dir`. Without XDG_RUNTIME_DIR it keeps its lock file in the
    private temporary folder platformdirs falls back to, which is what a demo needs: no warning about it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
        return embedded_postgres_server(data_dir)


def prefect_database(server: Any) -> str:
    """The Prefect server's database made anew on the embedded server; its URL for Prefect (asyncpg)."""
    url = make_url(fresh_database(server, PREFECT_DATABASE)).set(drivername="postgresql+asyncpg")
    return url.render_as_string(hide_password=False)


def say(text: str) -> None:
    """One line as it is: never cut into two (a URL stays whole), never read as markup."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def show_database(url: str, given: bool, outbox: str) -> None:
    """Which database outbox uses, whether it was made empty, and the command that points the CLI at it
    (`outbox` as it runs here: outbox_command)."""
    if given:
        say(f"outbox's database: {make_url(url).render_as_string(hide_password=True)} (the one given)")
        say("  kept as it was: the demo adds its actions, `outbox status` counts the earlier ones too")
        say(f"  look at it: {outbox} status --database-url <that URL>")
        return
    say(f"outbox's database: {url}")
    say("  made empty for this run, on the demo's own PostgreSQL (local connections only, no password)")
    say(f"  look at it while the demo runs: {outbox} status --database-url {shlex.quote(url)}")


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
    url = given_url or fresh_database(server, OUTBOX_DATABASE)
    engine = sync_engine(url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        schema.create(conn)
    outbox = outbox_command()
    show_database(url, given_url is not None, outbox)
    workdir = data_dir / "demo"
    shutil.rmtree(workdir / "prefect", ignore_errors=True)
    stack = Stack(
        database_url=url,
        workdir=workdir,
        workers=workers,
        flaky=flaky,
        prefect_database_url=prefect_database(server),
        adapters=posts.ADAPTERS,
    )
    try:
        with step(console, "starting the local stack (every part on 127.0.0.1, logs in the demo's folder)") as news:
            stack.start(news)
        posts.register(stack.apis.urls())
        say(f"Prefect UI: {stack.prefect_url}")
        show_prometheus(stack, stack.start_prometheus())
        kinds = ("EMAIL", "WEBHOOK", "NATS_EVENT") if stack.nats is not None else ("EMAIL", "WEBHOOK")
        if stack.nats is None:
            say("nats-server is not installed: the backlog holds emails and webhooks only")
        # the backlog's first pass meets the receiver's faults; a failed webhook is sent again 5 s later and
        # then kept (the receiver fails first deliveries only: a second failure would wait 5 minutes)
        assert stack.receiver is not None
        stack.receiver.script.extend(flaky_script(flaky, -(-actions // len(kinds))))
        workload = run_workload(engine, stack, Backlog(actions, lanes, kinds, unsubscribe), timeout)
        print_summary(console, engine, workload, stack)
        show_urls(stack, url if given_url is None else None, outbox)
        show_runs(stack, "drain runs now", pages=True)
        if keep_running:
            say("--keep-running: the stack stays up; Ctrl-C stops it.")
            while True:
                time.sleep(3600)
        if given_url is None:
            say(
                "outbox's database stops with the demo; `make demo ARGS=--keep-running`"
                f" (or `{outbox} demo --keep-running`) keeps it up to look at."
            )
    except KeyboardInterrupt:
        say("stopping")
    finally:
        with step(console, "the drain runs hand back what they hold and end"):
            stack.stop_drain()
        show_runs(stack, "drain runs, as they ended (their pages stop with the Prefect server)", pages=False)
        with step(console, "stopping every process the demo started"):
            stack.stop()
        engine.dispose()


def show_prometheus(stack: Stack, command: list[str] | None) -> None:
    """Where the shipped alert rules evaluate, or the command that starts a Prometheus to evaluate them."""
    if command is None:
        say(f"Prometheus: {stack.prometheus_url}/alerts (the shipped alert rules, evaluated every minute)")
        return
    say("Prometheus is not installed (Debian: apt-get install prometheus; `make test` installs it). To watch the")
    say(f"  shipped alert rules evaluate against this demo: {shlex.join(command)}")
    say(f"  then open http://127.0.0.1:{prometheus.PORT}/alerts")


def show_runs(stack: Stack, title: str, *, pages: bool) -> None:
    """Every drain run of this demo and its state, with its pages when `pages` (the run's, its log under
    Logs, and its live view): once the summary is out, and as they ended (the Prefect server stops next)."""
    try:
        runs = stack.drain_runs()
    except Exception:  # the Prefect server never started or already stopped: nothing to show
        return
    say(f"{title} ({len(runs)}; their logs are also in the workers' files in {stack.workdir}):")
    for run in sorted(runs, key=lambda run: run["name"]):
        page = f", {stack.run_url(run['id'])}" if pages else ""
        say(f"  {run['name']}: {run['state_name']}, queue {run['work_queue_name']}{page}")
        live = stack.live_view_url(run["id"]) if pages else None
        if live is not None:
            say(f"    its live view: {live}")


def show_urls(stack: Stack, embedded_url: str | None, outbox: str) -> None:
    """Where to look next, one address a line (never cut: each can be copied as it is)."""
    say(f"Prefect UI: {stack.prefect_url} (each drain run's page: its live view under Artifacts)")
    say(f"metrics:    {stack.metrics_url}")
    if stack.prometheus_url:
        say(f"alerts:     {stack.prometheus_url}/alerts")
    say(f"mailbox:    {stack.mailbox_url} (every email the SMTP sink kept, as JSON)")
    say(f"logs:       {stack.workdir} (one file per process, started afresh by each demo)")
    if embedded_url is not None:
        say(f"database:   {outbox} status --database-url {shlex.quote(embedded_url)}")


def start_executors(stack: Stack) -> float:
    """One drain run per worker, in the worker's own queue; wait until each one's executor claims (its
    run is Running and tagged kind:...), saying what the runs wait for. Returns when the first one was seen
    claiming (time.monotonic())."""
    runs = list(stack.start_drain_per_worker().values())
    started = time.monotonic()
    first: float | None = None
    poll = stack.env().get("PREFECT_WORKER_QUERY_SECONDS", "10")
    with step(console, f"{len(runs)} drain runs created, one per worker; waiting until each one claims") as news:
        while not all(map(claiming, found := stack.flow_runs(runs))):
            if first is None and any(map(claiming, found)):
                first = time.monotonic()
            refuse_stuck_runs(found, time.monotonic() - started, stack.workdir)
            news(waiting_for(found, poll))
            time.sleep(0.5)
    last = time.monotonic()
    first = last if first is None else first
    say(
        f"{len(runs)} executors claiming: the first {first - started:.0f} s after their runs were created,"
        f" the last {last - first:.0f} s after it (a run starts a process that imports Prefect and outbox)"
    )
    return first


def refuse_stuck_runs(runs: list[dict[str, Any]], waited: float, logs: Path) -> None:
    """OutboxError when a run ended without claiming, or the runs had EXECUTORS_START_SECONDS to claim."""
    ended = [run["name"] for run in runs if run["state_type"] in ENDED_STATES]
    if ended:
        raise OutboxError(f"the drain runs {', '.join(ended)} ended before claiming; see the worker logs in {logs}")
    if waited > EXECUTORS_START_SECONDS:
        waiting = [run["name"] for run in runs if not claiming(run)]
        raise OutboxError(
            f"the drain runs {', '.join(waiting)} did not claim within {EXECUTORS_START_SECONDS:.0f} s;"
            f" see the worker logs in {logs}"
        )


def claiming(run: dict[str, Any]) -> bool:
    """A drain run whose executor claims: Running, and tagged with the kinds it carries out."""
    return bool(run["state_type"] == "RUNNING" and any(tag.startswith("kind:") for tag in run["tags"]))


def waiting_for(runs: list[dict[str, Any]], poll: str) -> str:
    """What the drain runs are doing, by how many: `drain runs: 1 claiming, 2 executor starting`."""
    phases = Counter("claiming" if claiming(run) else run["state_type"] for run in runs)
    said = [f"{phases.pop('claiming')} claiming"] if "claiming" in phases else []
    said += [f"{n} {WAITING_FOR.get(state, state.lower()).format(poll=poll)}" for state, n in phases.items()]
    return "drain runs: " + ", ".join(said)


@dataclass(frozen=True)
class Backlog:
    """The backlog asked for: `actions` alerts over `lanes` workspaces, taking `kinds` in turn, and the share
    of workspaces whose admins unsubscribe."""

    actions: int
    lanes: int
    kinds: tuple[str, ...]
    unsubscribe: float


def run_workload(engine: Engine, stack: Stack, asked: Backlog, timeout: float) -> Workload:
    """The backlog, enqueued whole before any executor runs (so it is there to see, due, in `outbox status`
    and the live views), admins of some workspaces unsubscribing, and the alert of that storm with its posts;
    then one drain run per worker, until every action of the backlog ended; then the alert resolved (a reply in
    its Slack message's thread) and the pickup probe (PROBE_EMAILS at PROBE_RATE a second, on idle executors)
    until those ended, each with its count."""
    alerts = make_alerts(engine, asked.actions, asked.lanes)
    probe_alerts = make_alerts(engine, PROBE_EMAILS, PROBE_EMAILS)  # each alone in a lane of its own
    with counts(console) as stage:
        enqueued = stage.count("backlog: actions enqueued (no executor runs yet)", asked.actions)
        backlog = enqueue(engine, alerts, asked.kinds, enqueued.update)
        enqueued.finish()
    say_unsubscribed(engine, backlog, unsubscribe_some(engine, backlog, asked.unsubscribe), asked.unsubscribe)
    storm = f"{asked.actions:,} workspace alerts over {asked.lanes:,} workspaces"
    raised = posts.raise_alert(
        engine, alerts[0][1], f"Alert storm: {storm}", f"{storm}, each an email, a webhook or an event."
    )
    say(
        f"alert {raised.alert} raised, and in its transaction its posts: a Slack message in {posts.CHANNEL},"
        f" a comment on {posts.PULL_REPO}#{posts.PULL}, an issue in {posts.FEEDBACK_REPO}, a note on"
        f" {posts.PROJECT}!{posts.MERGE_REQUEST}"
    )
    first_claim = start_executors(stack)
    with counts(console) as stage:
        count = stage.count("backlog: actions ended since the first executor claimed", asked.actions, first_claim)
        seconds = wait_for_the_end(count, engine, backlog, timeout)
        resolved = resolve(engine, raised, f"Resolved: the {storm} ended in {seconds:.1f} s.", timeout)
        probe_count = stage.count(f"pickup probe: emails enqueued at {PROBE_RATE}/s, ended", PROBE_EMAILS)
        probe = enqueue_paced(engine, probe_alerts, PROBE_RATE, lambda ids: probe_count.update(ended(engine, ids)))
        wait_for_the_end(probe_count, engine, probe, timeout)
        made = Ids(resolved.message, resolved.reply or resolved.note)
        posted = stage.count("posts: to Slack, GitHub and GitLab, ended", actions(engine, made))
        wait_for_the_end(posted, engine, made, timeout)
    return Workload(asked.kinds, backlog, made, resolved, probe, PROBE_RATE)


def resolve(engine: Engine, raised: Posts, resolution: str, timeout: float) -> Posts:
    """Once the alert's Slack message ended (it is posted alongside the backlog), its reply in the message's
    thread; a message that did not end DONE has no thread to reply in, and the demo says so."""
    deadline = time.monotonic() + timeout
    while ended(engine, Ids(raised.message, raised.message)) == 0:
        if time.monotonic() > deadline:
            raise OutboxError(f"the alert's Slack message (action {raised.message}) did not end within {timeout:.0f} s")
        time.sleep(0.2)
    with engine.connect() as conn:
        message = ops.get_action(conn, raised.message)
    thread = posts.slack_ts(message)
    if thread is None:
        say(f"the alert's Slack message ended {message.state.value}: no thread to reply in")
        return raised
    resolved = posts.resolve_alert(engine, raised, thread, resolution)
    say(f"alert {raised.alert} resolved: a reply in its Slack message's thread enqueued")
    return resolved


def say_unsubscribed(engine: Engine, backlog: Ids, workspaces: list[int], share: float) -> None:
    """How many workspaces' admins unsubscribed, and the share of the backlog's emails that makes."""
    with engine.connect() as conn:
        emails, theirs = conn.execute(EMAILS_OF, {**backlog.params(), "workspaces": workspaces}).one()
    say(
        f"admins of {len(workspaces):,} of the workspaces unsubscribed (--unsubscribe {share:g} draws whole"
        f" workspaces): {theirs:,} of the {emails:,} alert emails will end CANCELLED / NOT_WANTED"
    )


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


def enqueue(
    engine: Engine,
    alerts: list[tuple[int, int]],
    kinds: tuple[str, ...] = ("EMAIL",),
    enqueued: Callable[[int], None] = lambda _: None,
) -> Ids:
    """One effect per alert, of `kinds` in turn, in transactions of 100, as an application would; after
    each transaction, `enqueued` is given how many are enqueued so far."""
    ids: list[int] = []
    for start in range(0, len(alerts), 100):
        with engine.begin() as conn:
            ids += [
                enqueue_alert(conn, alert, kinds[(start + n) % len(kinds)])
                for n, alert in enumerate(alerts[start : start + 100])
            ]
        enqueued(len(ids))
    return Ids(ids[0], ids[-1])


def enqueue_workload(engine: Engine, emails: int, lanes: int) -> int:
    """`emails` workspace alerts over `lanes` new workspaces, enqueued as an application would; returns the
    first action's id. The stack tests and the soak bench use it."""
    return enqueue(engine, make_alerts(engine, emails, lanes)).first


def enqueue_paced(
    engine: Engine, alerts: list[tuple[int, int]], per_second: int, each_second: Callable[[Ids], None]
) -> Ids:
    """One alert email per transaction, `per_second` of them a second, on a steady schedule; once a second,
    `each_second` is given the ids enqueued so far."""
    ids: list[int] = []
    started = time.monotonic()
    for n, alert in enumerate(alerts, 1):
        time.sleep(max(0.0, started + (n - 1) / per_second - time.monotonic()))
        with engine.begin() as conn:
            ids.append(enqueue_alert(conn, alert))
        if n % per_second == 0:
            each_second(Ids(ids[0], ids[-1]))
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


def unsubscribe_some(engine: Engine, backlog: Ids, share: float) -> list[int]:
    """Both admins of a share of the backlog's workspaces unsubscribe: their alerts that have not gone out
    yet end CANCELLED / NOT_WANTED at their next attempt. The workspaces chosen."""
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
    return chosen


def wait_for_the_end(count: Count, engine: Engine, ids: Ids, timeout: float) -> float:
    """Until every action of `ids` ended, `count` showing how many did; the count's seconds. The actions are
    counted, not their ids: ids leave gaps (an enqueue that met another at an idle lane's first place
    inserted nothing and took an id again)."""
    total = actions(engine, ids)
    deadline = time.monotonic() + timeout
    while (done := ended(engine, ids)) < total:
        count.update(done, lambda: retrying(engine, ids))
        if time.monotonic() > deadline:
            raise OutboxError(f"only {done} of {total} actions ended within {timeout:.0f} s")
        time.sleep(0.2)
    return count.finish()


def retrying(engine: Engine, ids: Ids) -> str:
    """What the unended actions of `ids` wait for when none ended lately: their retries' backoff."""
    with engine.connect() as conn:
        waiting, next_in = conn.execute(RETRYING, ids.params()).one()
    return f"{waiting:,} wait for a retry, the next in {next_in:.0f} s" if waiting else ""


def actions(engine: Engine, ids: Ids) -> int:
    with engine.connect() as conn:
        return int(conn.execute(ACTIONS, ids.params()).scalar_one())


def ended(engine: Engine, ids: Ids) -> int:
    with engine.connect() as conn:
        return int(conn.execute(ENDED, ids.params()).scalar_one())


WORKSPACES = text("SELECT DISTINCT workspace_id FROM agent_action WHERE id BETWEEN :first AND :last")
ACTIONS = text("SELECT count(*) FROM agent_action WHERE id BETWEEN :first AND :last")
RETRYING = text(
    "SELECT count(*), extract(epoch FROM min(due_at) - now())::float8 FROM agent_action"
    " WHERE id BETWEEN :first AND :last AND ended_at IS NULL AND due_at > now()"
)
EMAILS_OF = text(
    "SELECT count(*), count(*) FILTER (WHERE workspace_id = ANY (:workspaces)) FROM agent_action"
    " WHERE id BETWEEN :first AND :last AND kind = 'EMAIL'"
)
ENDED = text("SELECT count(*) FROM agent_action WHERE id BETWEEN :first AND :last AND ended_at IS NOT NULL")
