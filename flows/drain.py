"""outbox-drain: one executor per flow run, relayed from run to run so the history stays small.

    scheduled run ──▶ Executor.run() until it hands over, is stopped, or spends a given budget
                  ├─ once claiming: tag the run kind:<KIND>, env:<environment> and worker:<its worker>
                  ├─ every 2 s: the deployment's claiming runs and the pool's ONLINE workers; a run that is
                  │  not among those the relay keeps (one per worker) hands over (stops its executor)
                  ├─ once claiming, then every 30 s: the live view (flows.live): the attempts so far, the
                  │  backlog and the deepest lanes, in an artifact updated in place and a log line a minute
                  ├─ each action ended UNCERTAIN or FAILED, of any kind ──▶ one Prefect event
                  ├─ each destination its executor paused, broke, mended or saw resume ──▶ one Prefect event
                  └─▶ one INFO summary line; a table artifact only when the run attempted something

The relay. The deployment starts one run per schedule tick (every 300 s by default: 288 runs a day). A run
tags itself (`kind:<KIND>`, `env:<environment>`, `worker:<name>`) once its executor claims. The relay keeps
as many claiming runs as the pool has ONLINE workers: each worker's newest run first (the newest of those
first), then each worker's second newest, and so on; every other run stops claiming and ends. Which worker
takes a tick is Prefect's choice (the first to poll): a worker that takes a new run while it holds one
hands its older run over, whichever run is oldest overall, so the runs stay one per worker instead of
piling onto one. With N workers, N runs (so N executors) are Running in steady state. A handover starts
only once the successor's executor claims, and overlaps it by at most one check (2 s) plus the hand-back,
so the count of executors never drops at a handover.

Cells. With `cell` given (a name in the cells file, OUTBOX_CELLS_FILE: outbox.cells), the run drains that
cell's database; without it, the one database of OUTBOX_DATABASE_URL, as always. A cell whose URL variable
is unset on the worker is read from the Prefect Secret block `outbox-cell-<name>`. Each cell is a deployment
of its own (`outbox-drain-<cell>`, written by `outbox prefect files DIR --cells`), all on one work pool: the
relay counts the runs of its own deployment, so of its own cell, and keeps one run per ONLINE worker in
every cell (a worker added serves every cell; a cell added needs no worker). The run's name, its tags
(`cell:<name>`), its live view and summary artifacts (keys ending in `-<cell>`), its start line and every
event (`outbox.cell`, and the cell in the resource's id: action ids repeat across cells) say the cell. A
cell's database that cannot be reached when a run starts ends that run Failed in one line; the schedule's
next tick tries again, and the other cells' runs are not touched. An outage while a run drains is its
executor's own: it asks again until the database answers.

Webhook secrets. Before its adapters are built, a run reads the Prefect Secret block `outbox-webhook-<name>`
for each registered webhook endpoint whose secret neither the code nor `OUTBOX_WEBHOOK_SECRET_<NAME>` gives.
An endpoint with none of them ends the run Failed before it claims, in one line naming the variable and
the block (no traceback), as do NATS settings that are missing or wrong (OUTBOX_NATS_URL). A GitLab host's token
is read the same way from the block `outbox-gitlab-<name>` when neither the code nor
`OUTBOX_GITLAB_TOKEN_<NAME>` gives it, and a GitHub account's token or App private key from `outbox-github-<name>`
when neither the code nor `OUTBOX_GITHUB_TOKEN_<NAME>` / `OUTBOX_GITHUB_PRIVATE_KEY_<NAME>` gives it.

No Prefect task per action: an action is plain Python inside the run, so Prefect's retries and state
records never fight the outbox's own attempts. SIGTERM (from `outbox worker` when its replica stops, or
from a cancellation) stops the executor the outbox way: claimed actions that have not fenced go back to
their lanes, fenced ones finish inside their window, and the run ends Completed. A run whose replica
stops (not a cancelled one) first starts a run to take its place and, when another worker of its pool is
ONLINE to take that run, keeps its executor until that run claims (at most 30 s), so a restart never leaves
the executors short by the runs it held. With no other worker ONLINE it stops at once: its replacement waits
for the next worker to start. While the deployment is paused (how the whole drain is stopped: no tick starts a
run), a stopped run is not replaced. Each run is a fresh subprocess, which is why the metrics live in the database.

Log lines. From its start, every log record of the run's process has each URL's query and the secret of its
user information as *** (`hide_secrets_in_logs`), whichever library logs it: httpx's line per webhook request
among them, before Prefect's run logger ships a line to the Prefect server.

Events: `outbox.action.uncertain` and `outbox.action.failed`, one rule for every kind (an email, a webhook, an
event). The resource is the action (`outbox.action.<id>`) with its kind, state and reason, and one label
`outbox.trace.<field>` per field of the trace its adapter noted (an email's notice and Message-ID, a webhook's
webhook-id, an event's Nats-Msg-Id); never a recipient or payload. And `outbox.destination.paused`, `broken`,
`mended` and `resumed`, for each change the run's executor made to a destination: the resource is the
destination (`outbox.destination.<name>`) with its kind, the reason, and for a pause its seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections import Counter
from datetime import UTC, datetime
from functools import partial
from typing import Any, cast
from uuid import UUID

from prefect import State, flow, get_run_logger
from prefect.artifacts import acreate_table_artifact
from prefect.blocks.system import Secret
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    WorkerFilter,
    WorkerFilterStatus,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.context import FlowRunContext
from prefect.events import emit_event
from prefect.runtime import flow_run as this_run
from prefect.states import Failed
from sqlalchemy.exc import DBAPIError

from outbox._internal.checks.kind_rows import require_declared
from outbox._internal.connections.engines import async_engine, fault_text, shown_database, sync_engine
from outbox._internal.redaction.log_records import hide_secrets_in_logs
from outbox.cells import CellsError
from outbox.executor import Executor, ExecutorConfig
from outbox.executor.adapter import ActionAdapter, close_adapters, load_adapters
from outbox.executor.config import DEFAULTS, ENGINE_POOL_SIZE, start_line
from outbox.executor.outcomes import DestinationChange, EndedAction, Outcomes
from outbox.github.accounts import GithubSecretError, registered_accounts
from outbox.github.accounts import add_secret_source as add_github_secret_source
from outbox.gitlab.hosts import GitlabTokenError, registered_hosts
from outbox.gitlab.hosts import add_token_source as add_gitlab_token_source
from outbox.nats.settings import NatsSettingsError
from outbox.ops import lanes
from outbox.settings import load_settings
from outbox.slack.workspaces import SlackTokenError, add_token_source, registered_workspaces
from outbox.webhook.endpoints import WebhookSecretError, add_secret_source, registered_endpoints

from .cells import cell_url
from .live import show_live

# how often a run looks for its successor; a handover overlaps by at most this much plus the hand-back
HANDOVER_CHECK_SECONDS = 2.0
# how long a run stopped by its worker keeps its executor while its replacement starts
REPLACEMENT_WAIT_SECONDS = 30.0
# a run carries `kind:<KIND>` tags while its executor claims: the relay counts those runs only
CLAIMING_TAG = "kind:"
# and `worker:<name>`, the worker that started it: the relay keeps one run per worker first
WORKER_TAG = "worker:"
# the key of the table artifact a run that attempted something leaves when it ends
SUMMARY_KEY = "outbox-drain-summary"
# the Prefect Secret block a webhook endpoint's secret is read from when neither the code nor the
# environment (OUTBOX_WEBHOOK_SECRET_<NAME>) gives one
WEBHOOK_SECRET_BLOCK = "outbox-webhook-{name}"
# the Prefect Secret block a Slack workspace's token is read from when neither the code nor the environment
# (OUTBOX_SLACK_TOKEN_<NAME>) gives one
SLACK_TOKEN_BLOCK = "outbox-slack-{name}"
# and a GitLab host's token, when neither the code nor OUTBOX_GITLAB_TOKEN_<NAME> gives one
GITLAB_TOKEN_BLOCK = "outbox-gitlab-{name}"
# and a GitHub account's token or App private key, when neither the code nor its variable gives one
GITHUB_SECRET_BLOCK = "outbox-github-{name}"
# a run of a cell carries `cell:<name>`
CELL_TAG = "cell:"


def ship_outbox_logs() -> None:
    """Send the `outbox` loggers (the UNCERTAIN warnings among them) to the run's logs in the Prefect UI."""
    target = logging.getLogger("outbox")
    target.setLevel(logging.INFO)
    for handler in logging.getLogger("prefect.extra").handlers:
        if handler not in target.handlers:
            target.addHandler(handler)


async def webhook_secrets_from_prefect() -> None:
    """Read the Secret block `outbox-webhook-<name>` of each registered webhook endpoint that has no secret
    in the code or the environment, and offer them to the adapter as a secret source. An endpoint with no
    block either fails the run when the adapter is built, in one line naming the variable and the block."""
    found: dict[str, str] = {}
    for endpoint in registered_endpoints():
        if endpoint.secret is not None or endpoint.secret_variable in os.environ:
            continue
        block_name = WEBHOOK_SECRET_BLOCK.format(name=endpoint.name)
        with contextlib.suppress(ValueError):  # no such block: the adapter's error names it
            block = cast("Secret[str]", await Secret.aload(block_name))
            found[endpoint.name] = str(block.get())
    add_secret_source(
        found.get, label=lambda name: "the Prefect Secret block " + WEBHOOK_SECRET_BLOCK.format(name=name)
    )


async def slack_tokens_from_prefect() -> None:
    """Read the Secret block `outbox-slack-<name>` of each registered Slack workspace that has no token in the
    code or the environment, and offer them to the adapter as a token source (as webhook secrets are)."""
    found: dict[str, str] = {}
    for workspace in registered_workspaces():
        if workspace.token is not None or workspace.token_variable in os.environ:
            continue
        with contextlib.suppress(ValueError):  # no such block: the adapter's error names it
            block = cast("Secret[str]", await Secret.aload(SLACK_TOKEN_BLOCK.format(name=workspace.name)))
            found[workspace.name] = str(block.get())
    add_token_source(found.get, label=lambda name: "the Prefect Secret block " + SLACK_TOKEN_BLOCK.format(name=name))


async def gitlab_tokens_from_prefect() -> None:
    """Read the Secret block `outbox-gitlab-<name>` of each registered GitLab host that has no token in the code
    or the environment, and offer them to the adapter as a token source (as webhook secrets are)."""
    found: dict[str, str] = {}
    for host in registered_hosts():
        if host.token is not None or host.token_variable in os.environ:
            continue
        with contextlib.suppress(ValueError):  # no such block: the adapter's error names it
            block = cast("Secret[str]", await Secret.aload(GITLAB_TOKEN_BLOCK.format(name=host.name)))
            found[host.name] = str(block.get())
    add_gitlab_token_source(
        found.get, label=lambda name: "the Prefect Secret block " + GITLAB_TOKEN_BLOCK.format(name=name)
    )


async def github_secrets_from_prefect() -> None:
    """Read the Secret block `outbox-github-<name>` of each registered GitHub account that has no token (or App
    private key) in the code or the environment, and offer them to the adapter as a secret source."""
    found: dict[str, str] = {}
    for account in registered_accounts():
        if account.secret is not None or account.secret_variable in os.environ:
            continue
        with contextlib.suppress(ValueError):  # no such block: the adapter's error names it
            block = cast("Secret[str]", await Secret.aload(GITHUB_SECRET_BLOCK.format(name=account.name)))
            found[account.name] = str(block.get())
    add_github_secret_source(
        found.get, label=lambda name: "the Prefect Secret block " + GITHUB_SECRET_BLOCK.format(name=name)
    )


def keyed(key: str, cell: str | None) -> str:
    """An artifact's key, per cell when the run drains one."""
    return f"{key}-{cell}" if cell else key


def worker_name() -> str:
    """The worker that started this run (the host's name outside a worker)."""
    return os.environ.get("PREFECT__WORKER_NAME") or socket.gethostname()


def run_name() -> str:
    """`<worker> [<cell>] <window start, UTC>`: which replica ran the window, of which cell, and when it was due."""
    start = this_run.scheduled_start_time.astimezone(UTC)
    cell = this_run.parameters.get("cell")
    return f"{worker_name()}{f' {cell}' if cell else ''} {start:%Y-%m-%d %H:%M:%S}Z"


@flow(name="outbox-drain", flow_run_name=run_name, retries=0, log_prints=False)
async def drain(
    max_seconds: float | None = None,
    max_actions: int | None = None,
    concurrency: int = DEFAULTS.concurrency,
    adapters: str = "outbox.email:email_adapters",
    cell: str | None = None,
) -> dict[str, Any] | State[Any]:
    """Carry out actions until a newer run takes over (in a deployment), SIGTERM, or a given budget is
    spent (`max_seconds`, `max_actions`: none by default), in `cell`'s database (None: OUTBOX_DATABASE_URL's);
    return a summary, or the Failed state of a run whose adapters cannot be built (a webhook endpoint without
    a secret, no OUTBOX_NATS_URL) or whose database cannot be read (a cell unknown, or down)."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop_requested.set)
    try:
        return await _drain(stop_requested, max_seconds, max_actions, concurrency, adapters, cell)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def _drain(
    stop_requested: asyncio.Event,
    max_seconds: float | None,
    max_actions: int | None,
    concurrency: int,
    adapters: str,
    cell: str | None,
) -> dict[str, Any] | State[Any]:
    hide_secrets_in_logs()
    ship_outbox_logs()
    logger = get_run_logger()
    settings = load_settings()
    if cell is not None:
        try:
            url = await cell_url(cell)
        except CellsError as wrong:  # one line, no traceback
            return Failed(message=str(wrong))
    elif settings.database_url:
        url = settings.database_url
    else:
        raise ValueError("OUTBOX_DATABASE_URL is not set for the drain flow")
    engine = async_engine(url, pool_size=ENGINE_POOL_SIZE, max_overflow=0, **settings.engine_timeouts())
    config = ExecutorConfig(concurrency=concurrency, lease_seconds=settings.lease_seconds)
    carried_out: list[ActionAdapter] = []
    try:
        factory = load_adapters(adapters)  # imports the application's modules: its endpoints are registered
        await webhook_secrets_from_prefect()
        await slack_tokens_from_prefect()
        await gitlab_tokens_from_prefect()
        await github_secrets_from_prefect()
        try:
            carried_out = list(factory(engine))
        except (
            WebhookSecretError,
            NatsSettingsError,
            SlackTokenError,
            GitlabTokenError,
            GithubSecretError,
        ) as missing:  # one line, no traceback: nothing to retry
            return Failed(message=str(missing))
        listen_url = settings.listen_database_url if cell is None else None  # one listen URL: one database
        executor = Executor(engine, carried_out, config, listen_url=listen_url)
        try:
            await require_declared(engine, (adapter.kind for adapter in carried_out))
        except DBAPIError as error:
            if cell is None:
                raise
            # a cell that is down: one line; the next tick tries again, the other cells drain on
            return Failed(message=f"cell {cell}: cannot reach its database ({fault_text(error)})")
        line = start_line(executor.kinds, shown_database(url), config)
        logger.info("%s%s", f"cell {cell}: " if cell else "", line)
        executor.outcomes.listeners.append(partial(emit_ended, cell=cell))
        executor.outcomes.destination_listeners.append(partial(emit_destination, cell=cell))
        started = asyncio.get_running_loop().time()
        watchers = [
            asyncio.create_task(_stop_on(stop_requested, executor, logger)),
            asyncio.create_task(tag_when_claiming(executor, settings.environment, logger, cell)),
            asyncio.create_task(hand_over_when_relieved(executor, logger)),
            asyncio.create_task(show_live(executor, engine, logger, cell)),
        ]
        try:
            outcomes = await executor.run(max_actions=max_actions, max_seconds=max_seconds)
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
    finally:
        await close_adapters(carried_out)
        await engine.dispose()
    seconds = asyncio.get_running_loop().time() - started
    summary = summarize(outcomes, seconds)
    logger.info(
        "drained %s attempts in %.1f s: %s",
        summary["attempts"],
        seconds,
        ", ".join(f"{k} {v}" for k, v in sorted(summary["by_result"].items())) or "nothing due",
    )
    if outcomes.attempted or outcomes.ended_count:
        rows = await asyncio.to_thread(artifact_rows, outcomes, url)
        await acreate_table_artifact(
            table=rows,
            key=keyed(SUMMARY_KEY, cell),
            description="Attempts by kind and result; the deepest lanes after the run.",
        )
    return summary


def deployment_run() -> FlowRun | None:
    """This flow run, when a deployment on a work pool started it; None for a run called directly."""
    context = FlowRunContext.get()
    me = context.flow_run if context is not None else None
    if me is None or me.deployment_id is None or me.work_pool_name is None:
        return None
    return me


async def _stop_on(stop_requested: asyncio.Event, executor: Executor, logger: Any) -> None:
    await stop_requested.wait()
    with contextlib.suppress(Exception):  # no replacement (the API unreachable): stop all the same
        await replace_before_stopping(logger)
    executor.stop()


async def replace_before_stopping(logger: Any) -> None:
    """A deployment run stopped by its worker (not cancelled, its deployment not paused) drops its `kind:`
    tags (the relay no longer counts it), asks for a run to take its place now and, when another worker of
    its pool is ONLINE, keeps its executor until that run claims, for at most REPLACEMENT_WAIT_SECONDS: a
    replica restarted while it holds every executor leaves none missing. Its own worker takes no new run
    while it stops, so another replica takes the replacement; with none ONLINE, the next worker to start
    takes it."""
    me = deployment_run()
    if me is None:
        return
    assert me.deployment_id is not None and me.work_pool_name is not None  # deployment_run says so
    async with get_client() as client:
        current = await client.read_flow_run(me.id)
        # no longer counted by the relay: a stopping run must not make another one hand over
        await client.update_flow_run(me.id, tags=[tag for tag in current.tags if not tag.startswith(CLAIMING_TAG)])
        if current.state is not None and current.state.type == StateType.CANCELLING:
            return  # cancelled by an operator: nothing takes its place
        if (await client.read_deployment(me.deployment_id)).paused:
            logger.info("stopping: the deployment is paused, so no run takes this one's place")
            return
        replacement = await client.create_flow_run_from_deployment(me.deployment_id)
        if not await other_workers_online(client, me.work_pool_name):
            logger.info(
                "stopping: run %s takes over once a worker of pool %s starts", replacement.name, me.work_pool_name
            )
            return
        logger.info("stopping: run %s takes over", replacement.name)
        deadline = asyncio.get_running_loop().time() + REPLACEMENT_WAIT_SECONDS
        while asyncio.get_running_loop().time() < deadline:
            run = await client.read_flow_run(replacement.id)
            if is_claiming(run):
                return
            await asyncio.sleep(1.0)
        logger.warning("stopping: run %s did not claim within %.0f s", replacement.name, REPLACEMENT_WAIT_SECONDS)


async def other_workers_online(client: PrefectClient, work_pool_name: str) -> list[str]:
    """The names of the pool's ONLINE workers (a heartbeat within three of their intervals) other than the
    one that started this run."""
    workers = await client.read_workers_for_work_pool(
        work_pool_name, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
    )
    mine = os.environ.get("PREFECT__WORKER_NAME")
    return [worker.name for worker in workers if worker.name != mine]


async def tag_when_claiming(executor: Executor, environment: str, logger: Any, cell: str | None = None) -> None:
    """Once the executor claims, add `kind:<KIND>` for each kind it carries out, `env:<environment>` (and
    `cell:<name>` for a cell's run) to this run's tags. The relay counts a run only once it carries them: its
    executor is up. The Prefect API being unreachable delays the tags, never the executor: it is asked again
    every check."""
    await executor.claiming.wait()
    run_id = this_run.get_id()
    if run_id is None:
        return
    failing = False
    async with get_client() as client:
        while True:
            try:
                run = await client.read_flow_run(UUID(run_id))
                tags = set(run.tags) | {f"{CLAIMING_TAG}{kind}" for kind in executor.kinds} | {f"env:{environment}"}
                tags.add(f"{WORKER_TAG}{worker_name()}")
                if cell is not None:
                    tags.add(f"{CELL_TAG}{cell}")
                await client.update_flow_run(run.id, tags=sorted(tags))
                return
            except Exception as error:  # the API is down or slow: the run drains untagged meanwhile
                if not failing:
                    logger.warning("cannot tag this run (%s); asking again", type(error).__name__)
                failing = True
            await asyncio.sleep(HANDOVER_CHECK_SECONDS)


async def hand_over_when_relieved(executor: Executor, logger: Any) -> None:
    """Stop the executor once enough newer runs of this deployment are Running (see the module docstring).
    The Prefect API being unreachable never stops the executor: the run keeps draining and looks again."""
    me = deployment_run()
    if me is None:
        return  # a run started outside a deployment relays nothing: it ends on its budget or SIGTERM
    failing = False
    async with get_client() as client:
        while True:
            await asyncio.sleep(HANDOVER_CHECK_SECONDS)
            try:
                running, workers = await _relay_view(client, me)
            except Exception as error:  # the API is down or slow: keep draining
                if not failing:
                    logger.warning("cannot see the other drain runs (%s); draining on", type(error).__name__)
                failing = True
                continue
            failing = False
            claiming = relieved_by(me.id, running, workers)
            if claiming is not None:
                logger.info("handing over: %s claiming runs for %s ONLINE workers", claiming, workers)
                executor.stop()
                return


async def _relay_view(client: PrefectClient, me: FlowRun) -> tuple[list[tuple[datetime, UUID, str]], int]:
    """This deployment's Running runs whose executor claims (start time, id, worker), and the number of
    ONLINE workers in its pool. A run without a worker tag counts as a worker of its own."""
    assert me.deployment_id is not None and me.work_pool_name is not None
    runs = await client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[me.deployment_id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))),
        limit=200,
    )
    workers = await client.read_workers_for_work_pool(
        me.work_pool_name, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
    )
    claiming: list[tuple[datetime, UUID, str]] = [
        (run.start_time, run.id, next((t for t in run.tags if t.startswith(WORKER_TAG)), str(run.id)))
        for run in runs
        if run.start_time is not None and is_claiming(run)
    ]
    return claiming, len(workers)


def is_claiming(run: FlowRun) -> bool:
    return any(tag.startswith(CLAIMING_TAG) for tag in run.tags)


def relieved_by(me: UUID, running: list[tuple[datetime, UUID, str]], workers: int) -> int | None:
    """The count of claiming runs when `me` should hand over; None while the relay keeps it, when it is not
    among the running, or when no worker is ONLINE. `running` holds (start time, id, worker) of each
    claiming run. The relay keeps `workers` runs: each worker's newest first, newest first among them, then
    each worker's second newest, and so on. Every run ranks them alike, so they agree on who hands over."""
    if workers < 1 or me not in {run for _, run, _ in running}:
        return None
    held: Counter[str] = Counter()
    ranked = []
    for newer, (_, run, worker) in enumerate(sorted(running, reverse=True)):  # newest first
        ranked.append((held[worker], newer, run))  # 0: its worker's newest
        held[worker] += 1
    kept = {run for _, _, run in sorted(ranked)[:workers]}
    return None if me in kept else len(running)


def emit_ended(action: EndedAction, cell: str | None = None) -> None:
    """One Prefect event for an action of any kind that ended UNCERTAIN or FAILED."""
    if action.state not in ("UNCERTAIN", "FAILED"):
        return
    emit_event(event=f"outbox.action.{action.state.lower()}", resource=ended_resource(action, cell))


def ended_resource(action: EndedAction, cell: str | None = None) -> dict[str, str]:
    """The event's resource: the action, its kind, state and reason, and its trace (`outbox.trace.<field>`,
    a string as it is, any other value as JSON). A cell's action is `outbox.action.<cell>.<id>` (ids repeat
    across cells), with `outbox.cell`."""
    where = f"{cell}." if cell else ""
    resource = {
        "prefect.resource.id": f"outbox.action.{where}{action.id}",
        "prefect.resource.name": f"{action.kind} action {action.id}" + (f" in cell {cell}" if cell else ""),
        "outbox.kind": action.kind,
        "outbox.state": action.state,
        "outbox.reason": action.reason,
    }
    if cell:
        resource["outbox.cell"] = cell
    for name, value in action.trace.items():
        resource[f"outbox.trace.{name}"] = value if isinstance(value, str) else json.dumps(value)
    return resource


def emit_destination(change: DestinationChange, cell: str | None = None) -> None:
    """One Prefect event for each change the executor made to a destination: paused, broken, refused, mended,
    resumed."""
    emit_event(event=f"outbox.destination.{change.change}", resource=destination_resource(change, cell))


def destination_resource(change: DestinationChange, cell: str | None = None) -> dict[str, str]:
    """The event's resource: the destination, its kind, why it changed, and how long a pause lasts; a cell's
    destination is `outbox.destination.<cell>.<name>` (each cell pauses its own), with `outbox.cell`."""
    where = f"{cell}." if cell else ""
    resource = {
        "prefect.resource.id": f"outbox.destination.{where}{change.name}",
        "prefect.resource.name": f"{change.kind} destination {change.name}",
        "outbox.kind": change.kind,
        "outbox.destination": change.name,
        "outbox.reason": change.reason,
    }
    if change.seconds is not None:
        resource["outbox.seconds"] = f"{change.seconds:.3f}"
    if cell:
        resource["outbox.cell"] = cell
    return resource


def summarize(outcomes: Outcomes, seconds: float) -> dict[str, Any]:
    by_result: dict[str, int] = {}
    for (_, result, _), count in outcomes.attempts.items():
        by_result[result] = by_result.get(result, 0) + count
    return {
        "attempts": outcomes.attempted,
        "ended": outcomes.ended_count,
        "by_result": by_result,
        "uncertain": sum(n for (_, state, _), n in outcomes.ended.items() if state == "UNCERTAIN"),
        "seconds": round(seconds, 3),
    }


def artifact_rows(outcomes: Outcomes, url: str) -> list[dict[str, Any]]:
    """Attempts by kind, result and recorded; then the ten deepest lanes left after the run."""
    rows: list[dict[str, Any]] = [
        {
            "section": "attempts",
            "kind": kind,
            "result": result,
            "recorded": recorded,
            "count": count,
            "lane": "",
            "head": "",
        }
        for (kind, result, recorded), count in sorted(outcomes.attempts.items())
    ]
    engine = sync_engine(url, pool_size=1, **load_settings().engine_timeouts())
    try:
        with engine.connect() as conn:
            deepest = lanes(conn, 10).deepest
    finally:
        engine.dispose()
    rows += [
        {
            "section": "lane backlog",
            "kind": "",
            "result": "",
            "recorded": "",
            "count": lane.depth,
            "lane": lane.lane_key,
            "head": f"{lane.head_id} {lane.head_state}",
        }
        for lane in deepest
    ]
    return rows
