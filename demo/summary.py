"""The summary `outbox demo` prints once its workload ended: every action's outcome, and figures that add up.

    the workload's ids ─▶ outcomes by part (backlog, posts, probe), kind, state and reason ─▶ the outcomes table
                       ─▶ fences (first attempt, later, none) and the waits' quantiles ─┐
    the SMTP sink, the webhook receiver, the stream, the local APIs, the URLs ──────────┴▶ the figures table
    each post's action (as `outbox show` reads it) and what its local API stored ──────────▶ a line per post

Each figure says what it counts when that is not every action of its part: a wait is measured over the
actions that reached their fence (an action cancelled before its fence has none), the pickup over first
attempts only (a retried one waited for its backoff, not for a pickup); the sink's messages are the emails
that reached DATA, DONE or UNCERTAIN (the relay kept an UNCERTAIN one, then its answer was lost); the
receiver's deliveries include the repeats it deduplicated by webhook-id. A post is found in its local API's
store by the marker its action put in it (a Slack message's metadata, a GitHub or GitLab body's last line).

Both tables fit 80 columns at the demo's sizes. Sent to a file or a pipe, a table is printed as wide as it
needs (rich would wrap its cells at 80 columns otherwise), so every row stays one line.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import nats
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from sqlalchemy import Connection, Engine, text

from demo import posts
from demo.posts import Posts
from demo.stack import Stack, answers
from examples.accounts import events
from outbox import ops
from outbox.action import Action
from outbox.github import marker as github_marker
from outbox.gitlab import marker as gitlab_marker
from outbox.slack import message_marker


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
    # the alert's posts: their ids, and which is which
    posts: Ids
    alert: Posts
    probe: Ids
    # the probe's emails a second
    probe_rate: float


@dataclass(frozen=True)
class Fences:
    """A part's actions by the attempt that reached the fence last: the first, a later one, or none."""

    total: int
    first: int
    later: int

    @property
    def none(self) -> int:
        return self.total - self.first - self.later


class Stored(NamedTuple):
    """A post as its local API stored it: what the summary shows, and how its action's readback reference starts."""

    shown: str
    reference: str


class Outcome(NamedTuple):
    kind: str
    state: str
    reason: str | None
    actions: int


OUTCOMES = text(
    "SELECT kind, state, stop_reason, count(*) FROM agent_action WHERE id BETWEEN :first AND :last"
    " GROUP BY 1, 2, 3 ORDER BY 1, 4 DESC"
)
FENCES = text("""
    SELECT count(*),
           count(*) FILTER (WHERE write_started_at IS NOT NULL AND attempt = 1),
           count(*) FILTER (WHERE write_started_at IS NOT NULL AND attempt > 1)
      FROM agent_action
     WHERE id BETWEEN :first AND :last
""")
# from when each action could be claimed to its last fence, on the database clock: when it was due (its
# enqueue's commit, or its retry's time), or with from_first_fence, the part's first fence if that came later
# (the backlog is enqueued before the executors start); with first_only, the actions fenced in their first
# attempt only
WAIT = text("""
    WITH part AS (SELECT * FROM agent_action WHERE id BETWEEN :first AND :last),
         start AS (SELECT min(write_started_at) AS first_fence FROM part)
    SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM write_started_at
               - CASE WHEN :from_first_fence THEN greatest(due_at, first_fence) ELSE due_at END))
      FROM part CROSS JOIN start
     WHERE write_started_at IS NOT NULL AND (attempt = 1 OR NOT :first_only)
""")
# the backlog's drain on the database clock: from its first fence to its last end
DRAIN_SECONDS = text("""
    SELECT extract(epoch FROM max(ended_at) - min(write_started_at))::float8
      FROM agent_action WHERE id BETWEEN :first AND :last
""")
# what the figures' names mean, printed under the table
NOTES = (
    "backlog throughput: its actions, every one due at once before the executors started, over the",
    "  seconds from its first fence (the last check before a provider is called) to its last action's end",
    "backlog wait: from when an action could be claimed (due, with executors running) to its fence:",
    "  how long it queued behind its lane's earlier actions and for a free executor, retries' backoff included",
    "pickup: the same for the probe's emails, each alone in its lane on idle executors: how soon outbox",
    "  starts an effect once its transaction commits",
)


def print_summary(console: Console, engine: Engine, workload: Workload, stack: Stack) -> None:
    with engine.connect() as conn:
        parts = {"backlog": workload.backlog, "posts": workload.posts, "probe": workload.probe}
        outcomes = {
            part: [Outcome(*row) for row in conn.execute(OUTCOMES, ids.params())] for part, ids in parts.items()
        }
        figures = figures_table(conn, workload, outcomes, stack)
        arrived = post_lines(conn, workload.alert, stack)
    print_table(console, outcomes_table(outcomes))
    print_table(console, figures)
    for line in [*NOTES, *arrived]:
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def print_table(console: Console, table: Table) -> None:
    """On a terminal, as wide as the terminal; elsewhere as wide as the table needs: no row wraps."""
    if console.is_terminal:
        console.print(table)
        return
    needed = Measurement.get(console, console.options.update(max_width=10_000), table).maximum
    console.print(table, width=max(console.width, needed))


def outcomes_table(outcomes: dict[str, list[Outcome]]) -> Table:
    table = Table(title="every action of this run, by how it ended")
    for name in ("part", "kind", "state", "reason"):
        table.add_column(name)
    table.add_column("actions", justify="right")
    for part, rows in outcomes.items():
        for kind, state, reason, count in rows:
            table.add_row(part, kind, state, reason or "", f"{count:,}")
        table.add_row(part, "all", "", "", f"{sum(row.actions for row in rows):,}", end_section=True)
    return table


def figures_table(conn: Connection, workload: Workload, outcomes: dict[str, list[Outcome]], stack: Stack) -> Table:
    table = Table(title="figures, and what each one counts (the terms below the table)", show_header=False)
    for name, value in [*wait_rows(conn, workload), *effect_rows(outcomes, stack)]:
        table.add_row(name, value)
    urls = {"Prefect UI": stack.prefect_url, "metrics": stack.metrics_url, "mailbox": stack.mailbox_url}
    if stack.prometheus_url:
        urls["Prometheus"] = f"{stack.prometheus_url}/-/ready"
    silent = [name for name, url in urls.items() if not answers(url)]
    up = [name for name in urls if name not in silent]
    not_up = f"; NOT answering: {', '.join(silent)}" if silent else ""
    table.add_row("servers up (URLs below)", ", ".join(up) + not_up)
    return table


def wait_rows(conn: Connection, workload: Workload) -> list[tuple[str, str]]:
    """The backlog's throughput and wait, the probe's pickup, and which actions each one counts."""
    backlog = Fences(*conn.execute(FENCES, workload.backlog.params()).one())
    probe = Fences(*conn.execute(FENCES, workload.probe.params()).one())
    seconds = conn.execute(DRAIN_SECONDS, workload.backlog.params()).scalar_one() or 0.0
    rate = f"{backlog.total / seconds:,.0f} actions/s" if seconds > 0 else "-"
    before = f": {backlog.none:,} ended before a fence" if backlog.none else ""
    return [
        ("backlog throughput", f"{rate}: {backlog.total:,} in {seconds:.1f} s"),
        ("backlog wait p50/p95/p99", _quantiles(conn, workload.backlog, first_only=False, from_first_fence=True)),
        ("  measured over", f"{backlog.first + backlog.later:,} of {backlog.total:,}{before}"),
        (
            f"pickup p50/p95/p99 ({workload.probe_rate:g}/s)",
            _quantiles(conn, workload.probe, first_only=True, from_first_fence=False),
        ),
        ("  measured over", f"{probe.first:,} of {probe.total:,}: first attempts{_others(probe)}"),
    ]


def effect_rows(outcomes: dict[str, list[Outcome]], stack: Stack) -> list[tuple[str, str]]:
    """What reached the SMTP sink, the webhook receiver and the stream, against the actions' outcomes."""
    assert stack.sink is not None and stack.receiver is not None
    emails: Counter[str] = Counter()  # the backlog's and the probe's, by state
    for part in outcomes.values():
        emails.update({state: n for kind, state, _, n in part if kind == "EMAIL"})
    duplicates = sum(1 for n in stack.sink.count_by_message_id().values() if n > 1)
    deliveries = stack.receiver.deliveries()
    kept = sum(deliveries.values())
    rows = [
        (
            "messages at the sink",
            f"{len(stack.sink.received):,}: {emails['DONE']:,} DONE + {emails['UNCERTAIN']:,} UNCERTAIN",
        ),
        ("duplicates at the sink", str(duplicates)),
        ("webhook effects", f"{len(deliveries):,} from {kept:,} deliveries ({kept - len(deliveries):,} repeats)"),
    ]
    if stack.nats is not None:
        held = asyncio.run(stream_messages(stack.nats.url, events.STREAM))
        rows.append(("events in the stream", f"{sum(held.values()):,} ({len(held):,} distinct Nats-Msg-Id)"))
    apis = stack.apis
    assert apis.slack is not None and apis.github is not None and apis.gitlab is not None
    stored = (len(apis.slack.posted()), len(apis.github.posts_of("comment") + apis.github.posts_of("issue")))
    notes = len(apis.gitlab.notes(posts.PROJECT, "merge_request", posts.MERGE_REQUEST))
    done = sum(n for _, state, _, n in outcomes["posts"] if state == "DONE")
    rows.append(("posts at the local APIs", f"Slack {stored[0]}, GitHub {stored[1]}, GitLab {notes}: {done} DONE"))
    return rows


def post_lines(conn: Connection, alert: Posts, stack: Stack) -> list[str]:
    """A line per post of the alert: its action's state, and what its local API stored (found by the marker its
    action put in it), said to be what `outbox show` gives as its readback reference, or not."""
    apis = stack.apis
    assert apis.slack is not None and apis.github is not None and apis.gitlab is not None
    slack, github, gitlab = apis.slack, apis.github, apis.gitlab

    def messages(action: Action) -> list[Stored]:
        key = message_marker(action.idempotency_key)
        return [
            Stored(
                f"channel {m['channel']}, ts {m['ts']}"
                + (f", in the thread of {m['thread_ts']}" if "thread_ts" in m else ""),
                f"channel={m['channel']} ts={m['ts']}",
            )
            for m in slack.posted()
            if (m.get("metadata") or {}).get("event_payload", {}).get("key") == key
        ]

    def github_posts(kind: str) -> Callable[[Action], list[Stored]]:
        def stored(action: Action) -> list[Stored]:
            mark = github_marker(action.idempotency_key)
            return [Stored(p.html_url, p.html_url) for p in github.posts_of(kind) if p.body.endswith(mark)]

        return stored

    def notes(action: Action) -> list[Stored]:
        mark = gitlab_marker(action.idempotency_key)
        found = gitlab.notes(posts.PROJECT, "merge_request", posts.MERGE_REQUEST)
        where = f"{posts.PROJECT}!{posts.MERGE_REQUEST}"
        return [
            Stored(
                f"note {n['id']} on {where}",
                f"{gitlab.url}/{posts.PROJECT}/-/merge_requests/{posts.MERGE_REQUEST}#note_{n['id']}",
            )
            for n in found
            if n["body"].endswith(mark)
        ]

    made = [
        ("Slack message", alert.message, messages),
        ("Slack reply", alert.reply, messages),
        ("PR comment", alert.comment, github_posts("comment")),
        ("feedback issue", alert.issue, github_posts("issue")),
        ("GitLab note", alert.note, notes),
    ]
    lines = ["posts, as the local Slack, GitHub and GitLab APIs stored them (each action in full: outbox show ID):"]
    for what, action_id, stored in made:
        if action_id is None:
            lines.append(f"  {what:<15} none: its thread's message was not posted")
            continue
        action = ops.get_action(conn, action_id)
        lines.append(f"  {what:<15} action {action.id}, {action.state.value}: {_arrival(action, stored(action))}")
    return lines


def _arrival(action: Action, stored: list[Stored]) -> str:
    """What the API stored for `action`, and whether `outbox show` gives it as the action's readback reference."""
    if not stored:
        return "nothing stored"
    shown = stored[0].shown + (f" (and {len(stored) - 1} more: the same post again)" if len(stored) > 1 else "")
    ref = action.readback_ref or "none"
    return shown + ("" if ref.startswith(stored[0].reference) else f"; outbox show gives {ref}")


def _quantiles(conn: Connection, ids: Ids, *, first_only: bool, from_first_fence: bool) -> str:
    params = {**ids.params(), "first_only": first_only, "from_first_fence": from_first_fence}
    quantiles = conn.execute(WAIT, params).scalar_one()
    if quantiles is None:
        return "-"
    return " / ".join(f"{1000 * q:,.1f}" for q in quantiles) + " ms"


def _others(fences: Fences) -> str:
    """The probe's actions the pickup does not count, and why."""
    later = f"; {fences.later:,} retried" if fences.later else ""
    return later + (f"; {fences.none:,} ended before a fence" if fences.none else "")


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
