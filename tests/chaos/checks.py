"""The invariants of a chaos run, checked once its executors stopped, from the relay's messages, the read-back
provider's writes, the NATS stream's messages, the webhook receiver's journal, the Slack, GitHub and GitLab
APIs' stores, the executors' journals, the metrics and the database.

`check` gathers the evidence once (`gather`), then each `check_*` function checks one invariant, or one
family of them, and records what it finds in the report: breaches (`Report.breach`) and the counts the
report shows. A breach is explained when a late write caused it: a write (or the end of a provider call)
by a holder that had already lost its action, the one case no fence can stop; the run injects it on purpose.
A late write is itself a breach unless its writer was frozen (SIGSTOP, a brink) shortly before it: a process
that merely lost its network must not call a provider once it cannot prove its window.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from outbox.email import message_id
from outbox.github import marker as github_marker
from outbox.github.readback import SINCE_MARGIN as GITHUB_MARGIN
from outbox.gitlab import marker as gitlab_marker
from outbox.gitlab.readback import SINCE_MARGIN as GITLAB_MARGIN
from outbox.metrics.exporter import registry_for
from outbox.nats import event_token
from outbox.slack import message_marker
from outbox.webhook import webhook_id
from tests import kinds
from tests.chaos import journal, posts
from tests.chaos.providers import StreamMessage
from tests.chaos.records import ENDED_STATES, SENDER_DOMAIN, Erasure, Planned
from tests.chaos.report import Report

if TYPE_CHECKING:
    from demo.sink import Received
    from tests.chaos.runner import Chaos

# how many on-time effects (deliveries, provider writes) an action may have made, by the state it ended in;
# any other state: none
EFFECTS_ALLOWED = {"DONE": (1, 1), "UNCERTAIN": (0, 1)}
LATE_HOLDER = ("expired", "superseded")

# a late write is explained by a freeze of its writer that ended at most this long before it (lease + window)
FREEZE_REACH_SECONDS = 130.0

UNFROZEN_LATE_WRITE = "a read-back write after its holder lost the action, by no frozen process"

# a write to the provider or the relay, on one timeline (both clocks are this machine's):
# (start, end, action id, late, kind)
Span = tuple[float, float, int, bool, str]


@dataclass
class Evidence:
    """What the checks read, gathered once after the executors stopped."""

    planned: list[Planned]
    rows: dict[int, Any]  # agent_action, by id
    writes: list[Any]  # chaos_provider_write, in id order
    by_action: dict[int, list[Any]]  # the same writes, by action id
    erasures: list[Erasure]
    erased: dict[int, tuple[Erasure, dict[str, Any]]]  # by action id: its erasure, and its row just before
    emails: dict[str, Planned]  # the EMAIL actions, by the Message-ID of their message
    deliveries: dict[str, list[Received]]  # the relay's messages, by Message-ID
    journals: list[Path]
    unexpected_exits: list[str]
    engines: list[Engine]  # the one database's, or every cell's
    freezes: dict[int, list[list[float]]]  # by pid: when a fault or a brink froze it, [start, end] epoch seconds
    journal_pids: dict[str, int]  # by journal file name: the process that wrote it
    stream: list[StreamMessage]  # every message of the NATS stream, in sequence order
    stored: dict[str, list[StreamMessage]]  # the same, by Nats-Msg-Id
    nats_events: dict[str, Planned]  # the NATS_EVENT actions, by their event's id (the Nats-Msg-Id)
    effects: dict[str, dict[str, Any]]  # the webhook receiver's journal: webhook-id -> body, deliveries, receiver id
    hooks: dict[str, Planned]  # the WEBHOOK actions, by webhook-id
    stored_posts: dict[str, list[posts.Stored]]  # by kind: every post the Slack, GitHub and GitLab stores hold
    post_plans: dict[str, Planned]  # their actions, by the marker each of their posts carries
    may_have_fenced: set[int]  # the actions an attempt fenced, or may have (it never ended: killed)
    ends: list[dict[str, Any]]  # every attempt's end in the journals (recorded or not)

    def frozen_before(self, pids: set[int], start: float, end: float) -> bool:
        """One of `pids` was frozen at some moment in [start - FREEZE_REACH_SECONDS, end]."""
        return any(a <= end and b >= start - FREEZE_REACH_SECONDS for pid in pids for a, b in self.freezes.get(pid, []))

    def writers(self, action_id: int) -> set[int]:
        """The processes that started an attempt at the action (from their journals)."""
        found = set()
        for path in self.journals:
            if any(e["e"] == "start" and e["id"] == action_id for e in journal.read(path)):
                found.add(self.journal_pids.get(path.name, -1))
        return found

    def end_of(self, plan: Planned) -> float | None:
        """When the action ended (epoch seconds, database clock), or its account was erased; None: neither."""
        row = self.rows.get(plan.id)
        if row is not None:
            return row.ended_at  # type: ignore[no-any-return]
        return self.erased[plan.id][0].at if plan.id in self.erased else None

    def messages(self, mid: str, plan: Planned) -> tuple[list[Received], list[Received]]:
        """The messages the relay received for an EMAIL action, in order, and those received after it ended."""
        got = sorted(self.deliveries.get(mid, []), key=lambda r: r.received_at)
        end = self.end_of(plan)
        return got, [r for r in got if end is not None and r.received_at > end]


def check(chaos: Chaos, report: Report) -> None:
    """Every invariant, from the sink's and the providers' records, the journals and the database."""
    evidence = gather(chaos, report)
    check_emails(evidence, report)
    check_readbacks(evidence, report)
    check_nats(evidence, report)
    check_webhooks(evidence, report)
    check_posts(evidence, report)
    check_brinks_after_accept(evidence, report)
    check_lanes(evidence, report)
    check_journals(evidence, report)
    check_nothing_lost(evidence, report)
    check_metrics(evidence, report)
    for engine in evidence.engines:
        check_constraints(engine, report)
    check_per_cell(evidence, report)
    check_executors(evidence, report)


def gather(chaos: Chaos, report: Report) -> Evidence:
    """Copy into the report what the run did, and read what the checks need."""
    report.faults = chaos.faults
    report.cell_faults = dict(chaos.cell_faults)
    report.kills = chaos.kills
    report.brinks = chaos.brinks
    report.partitions = chaos.partitions
    report.unexpected_exits = chaos.unexpected_exits
    report.driver_retries = chaos.errors
    report.pg_restarts = chaos.pg_restarts
    report.enqueue_seconds = chaos.enqueue_seconds
    for plan in chaos.planned.values():
        report.enqueued[plan.kind] += 1
        report.enqueued[f"{plan.kind} proposed"] += plan.proposed
        report.enqueued[f"{plan.kind} with expires_at"] += plan.expires
    rows: dict[int, Any] = {}
    writes: list[Any] = []
    for cell in chaos.cells:  # a cells run: every cell's (their action ids do not meet)
        with cell.engine.connect() as conn:
            rows |= {
                r.id: r
                for r in conn.execute(
                    text("""
                    SELECT id, kind, lane_key, state, stop_reason, due_at > now() AS later, readback_ref, last_error,
                           extract(epoch FROM ended_at)::float8 AS ended_at, trace
                      FROM agent_action
                    """)
                )
            }
            writes += conn.execute(
                text("""
                SELECT id, action_id, epoch, lane_key, pid, brink, remaining_before, remaining_after, holder_at_start,
                       holder_at_end, extract(epoch FROM started_at)::float8 AS started_at,
                       extract(epoch FROM ended_at)::float8 AS ended_at
                  FROM chaos_provider_write ORDER BY id
                """)
            )
    for row in rows.values():
        if row.stop_reason is not None:
            report.outcomes[(row.kind, row.state, row.stop_reason)] += 1
    erased: dict[int, tuple[Erasure, dict[str, Any]]] = {}
    for erasure in chaos.erasures:
        for found in erasure.rows:
            erased[found["id"]] = (erasure, found)
            report.erased[f"{found['kind']} {found['state']}{' fenced' if found['fenced'] else ''}"] += 1
    report.sink_messages = len(chaos.sink.received)
    report.provider_writes = len(writes)
    deliveries: dict[str, list[Received]] = defaultdict(list)
    for received in chaos.sink.received:
        deliveries[received.message_id].append(received)
    by_action: dict[int, list[Any]] = defaultdict(list)
    for w in writes:
        by_action[w.action_id].append(w)
    may_have_fenced, ends = _attempts(sorted(chaos.work_dir.glob("journal-*.jsonl")))
    stream = chaos.provider.stream_messages()
    stored: dict[str, list[StreamMessage]] = defaultdict(list)
    for message in stream:
        stored[message.msg_id or ""].append(message)
    return Evidence(
        planned=list(chaos.planned.values()),
        rows=rows,
        writes=writes,
        by_action=by_action,
        erasures=chaos.erasures,
        erased=erased,
        emails={message_id(p.key, SENDER_DOMAIN): p for p in chaos.planned.values() if p.kind == "EMAIL"},
        deliveries=deliveries,
        journals=sorted(chaos.work_dir.glob("journal-*.jsonl")),
        unexpected_exits=chaos.unexpected_exits,
        engines=[cell.engine for cell in chaos.cells],
        freezes=chaos.freezes,
        journal_pids=chaos.journal_pids,
        stream=stream,
        stored=stored,
        nats_events={event_token(p.key): p for p in chaos.planned.values() if p.kind == "NATS_EVENT"},
        effects=chaos.provider.effects(),
        hooks={webhook_id(p.key): p for p in chaos.planned.values() if p.kind == "WEBHOOK"},
        stored_posts=chaos.apis.stored(),
        post_plans={post_marker(p): p for p in chaos.planned.values() if p.kind in posts.KINDS},
        may_have_fenced=may_have_fenced,
        ends=ends,
    )


def _attempts(paths: list[Path]) -> tuple[set[int], list[dict[str, Any]]]:
    """From the journals: the actions some attempt fenced (or may have: it started and never ended), and
    every attempt's end."""
    fenced: set[int] = set()
    ends: list[dict[str, Any]] = []
    for path in paths:
        open_attempts: set[tuple[int, int]] = set()
        for entry in journal.read(path):
            if entry["e"] == "start":
                open_attempts.add((entry["id"], entry["epoch"]))
            elif entry["e"] == "end":
                open_attempts.discard((entry["id"], entry["epoch"]))
                ends.append(entry)
                if entry.get("fenced"):
                    fenced.add(entry["id"])
        fenced.update(action_id for action_id, _ in open_attempts)
    return fenced, ends


def check_emails(ev: Evidence, report: Report) -> None:
    """EMAIL, counted by Message-ID at the relay: only enqueued messages, each at most once, none after an
    erasure that came before its fence, and as many on time as the state it ended in allows."""
    for mid in ev.deliveries.keys() - ev.emails.keys():
        report.breach("a message nobody enqueued reached the relay", None, mid)
    for mid, plan in ev.emails.items():
        got, late = ev.messages(mid, plan)
        row = ev.rows.get(plan.id)
        end = ev.end_of(plan)
        report.late_writes["EMAIL delivered after its action ended"] += len(late)
        for r in late:
            assert end is not None
            # after an erasure that came after its fence, a message on its way is no breach of its window
            if row is not None and not ev.frozen_before(ev.writers(plan.id), r.mail_at, r.received_at):
                report.breach("an email delivered after its action ended, by no frozen process", plan.id, mid)
            report.late_details.append(
                {
                    "action": plan.id,
                    "kind": "EMAIL",
                    "end": row.stop_reason if row is not None else "erased",
                    "mail_after_end_s": round(r.mail_at - end, 3),
                    "received_after_end_s": round(r.received_at - end, 3),
                    "peer": r.peer,
                }
            )
        on_time = len(got) - len(late)
        if len(got) > 1:
            report.count("duplicates", bool(late), plan.id)
            report.breach("an at-most-once action delivered twice", plan.id, f"{len(got)} messages", bool(late))
        if plan.id in ev.erased:
            erasure, found = ev.erased[plan.id]
            after = [r for r in got if r.received_at > erasure.at]
            if after and not found["fenced"] and found["state"] not in ENDED_STATES:
                report.breach(
                    "an erased account's pending email reached the relay", plan.id, found["state"], bool(late)
                )
            continue
        if row is None:
            report.breach("an action vanished without an erasure", plan.id, "EMAIL")
            continue
        expected = EFFECTS_ALLOWED.get(row.state, (0, 0))
        if not expected[0] <= on_time <= expected[1]:
            report.breach(f"an email ended {row.state} was delivered {on_time} times", plan.id, row.stop_reason or "")


def check_readbacks(ev: Evidence, report: Report) -> None:
    """TEST_READBACK, every write the provider holds: each action wrote at most once, never after an erasure
    that came before its fence, and as many times on time as the state it ended in allows."""
    for plan in ev.planned:
        if plan.kind != kinds.READBACK.name:
            continue
        got = ev.by_action.get(plan.id, [])
        late = [w for w in got if _late(w)]
        for w in late:
            report.late_writes[_late_label(w)] += 1
            if _started_late(w) and not ev.frozen_before({w.pid}, w.started_at, w.started_at):
                detail = f"write {w.id} by pid {w.pid}: holder {w.holder_at_start}"
                report.breach(UNFROZEN_LATE_WRITE, plan.id, detail)
        if len(got) > 1:
            report.count("duplicates", bool(late), plan.id)
            report.breach("a read-back action wrote twice", plan.id, f"{len(got)} writes", bool(late))
        # a write that started while its holder held the action happened on time, even when the rest of the
        # provider call came late (the holder frozen mid-call): that end only counts for the lane's overlaps
        on_time = sum(1 for w in got if not _started_late(w))
        if plan.id in ev.erased:
            erasure, found = ev.erased[plan.id]
            after = [w for w in got if w.started_at > erasure.at]
            if after and not found["fenced"] and found["state"] not in ENDED_STATES:
                report.breach(
                    "an erased account's pending action reached the provider", plan.id, found["state"], bool(late)
                )
            continue
        row = ev.rows.get(plan.id)
        if row is None:
            report.breach("an action vanished without an erasure", plan.id, "TEST_READBACK")
            continue
        expected = EFFECTS_ALLOWED.get(row.state, (0, 0))
        if not expected[0] <= on_time <= expected[1]:
            report.breach(
                f"a read-back action ended {row.state} with {on_time} writes",
                plan.id,
                row.stop_reason or "",
                bool(late),
            )


def check_nats(ev: Evidence, report: Report) -> None:
    """NATS_EVENT, every message the stream holds: each Nats-Msg-Id once and an enqueued event's; exactly one
    for an action ended DONE, at most one for UNCERTAIN, none for an action that never fenced or was erased
    before its fence; none stored after its action ended, but by a frozen holder."""
    figures = report.figures("NATS_EVENT")
    figures["messages in the stream"] = len(ev.stream)
    figures["distinct Nats-Msg-Id in the stream"] = len(ev.stored)
    for msg_id, messages in ev.stored.items():
        if msg_id not in ev.nats_events:
            report.breach("a message nobody enqueued is in the stream", None, f"seq {messages[0].seq}: {msg_id}")
    for plan in ev.planned:
        if plan.kind != "NATS_EVENT":
            continue
        got = ev.stored.get(event_token(plan.key), [])
        end = ev.end_of(plan)
        late = [m for m in got if end is not None and m.at > end]
        explained = bool(late) and ev.frozen_before(ev.writers(plan.id), late[0].at, late[-1].at)
        if late:
            report.late_writes["NATS_EVENT stored after its action ended"] += len(late)
            if not explained:
                detail = f"seq {late[0].seq}, {late[0].at - (end or 0):.1f} s after the end"
                report.breach("an event stored after its action ended, by no frozen process", plan.id, detail)
        if len(got) > 1:
            report.count("duplicates", explained, plan.id)
            seqs = ", ".join(str(m.seq) for m in got)
            report.breach("one Nats-Msg-Id stored twice in the stream", plan.id, f"seqs {seqs}", explained)
        _check_effects(ev, report, plan, len(got) - len(late), explained, [m.at for m in got])
    ids = {p.id for p in ev.nats_events.values()}
    for entry in ev.ends:
        if entry["id"] in ids:
            ref = entry.get("ref") or ""
            figures["attempts Done by a read-back (recorded or not)"] += "read back" in ref
            figures["PubAcks marked duplicate (recorded or not)"] += ref.endswith(" duplicate")


def check_webhooks(ev: Evidence, report: Report) -> None:
    """WEBHOOK, the receiver's journal: each webhook-id an enqueued action's, with that action's body, one
    effect however often delivered (deliveries counted: a second one is absorbed); an effect for every action
    ended DONE, at most one for UNCERTAIN, none for an action that never fenced."""
    figures = report.figures("WEBHOOK")
    figures["effects at the receiver"] = len(ev.effects)
    figures["deliveries at the receiver"] = sum(int(e["deliveries"]) for e in ev.effects.values())
    figures["webhook-ids delivered more than once (absorbed)"] = sum(
        1 for e in ev.effects.values() if int(e["deliveries"]) > 1
    )
    for msg_id, effect in ev.effects.items():
        plan = ev.hooks.get(msg_id)
        if plan is None:
            report.breach("an effect at the receiver nobody enqueued", None, msg_id)
        elif _alert_of(effect["body"]) != plan.key.rpartition(":")[2]:
            report.breach("the receiver holds another webhook's body under a webhook-id", plan.id, msg_id)
    for plan in ev.planned:
        if plan.kind == "WEBHOOK":
            held = ev.effects.get(webhook_id(plan.key))
            row = ev.rows.get(plan.id)
            if held is not None and row is not None and row.state == "DONE" and int(held["deliveries"]) > 1:
                figures["DONE after a second delivery (the receiver absorbed it)"] += 1
            _check_effects(ev, report, plan, 0 if held is None else 1, False, None)


def post_marker(plan: Planned) -> str:
    """The marker every post of a SLACK_MESSAGE, GITHUB_POST or GITLAB_POST action carries."""
    if plan.kind == "SLACK_MESSAGE":
        return message_marker(plan.key)
    return github_marker(plan.key) if plan.kind == "GITHUB_POST" else gitlab_marker(plan.key)


def check_posts(ev: Evidence, report: Report) -> None:
    """SLACK_MESSAGE, GITHUB_POST, GITLAB_POST, every post the three stores hold: each marker an enqueued
    action's of that kind, at most once (a second post of one action is a duplicate); exactly one for an action
    ended DONE, at most one for UNCERTAIN or an action still waiting, none for one that never fenced; none stored
    after its action ended, but by a frozen holder."""
    for kind in posts.KINDS:
        figures = report.figures(kind)
        stored = ev.stored_posts.get(kind, [])
        by_marker: dict[str, list[posts.Stored]] = defaultdict(list)
        for post in stored:
            by_marker[post.marker].append(post)
        figures["posts in the store"] = len(stored)
        figures["distinct markers in the store"] = len(by_marker)
        for zero in ("duplicates", "lane overlaps", "lost"):  # shown when none
            figures[zero] += 0
        for mark, found in by_marker.items():
            plan = ev.post_plans.get(mark)
            if plan is None or plan.kind != kind:
                report.breach(f"a post nobody enqueued is in the {kind} store", None, f"{found[0].where}: {mark}")
        for plan in ev.planned:
            if plan.kind != kind:
                continue
            got = by_marker.get(post_marker(plan), [])
            end = ev.end_of(plan)
            late = [p for p in got if end is not None and p.at > end]
            explained = bool(late) and ev.frozen_before(ev.writers(plan.id), late[0].at, late[-1].at)
            if late:
                report.late_writes[f"{kind} stored after its action ended"] += len(late)
                if not explained:
                    detail = f"{late[0].where}, {late[0].at - (end or 0):.1f} s after the end"
                    report.breach("a post stored after its action ended, by no frozen process", plan.id, detail)
            if len(got) > 1 and not explained and _missed_for_a_clock(ev, plan, got[0]):
                # not a late write: the read-back looked from after the first post, as its executor's clock told
                explained = True
                report.clock_duplicates += 1
                figures["stored twice: read-back began after the post (a clock ahead)"] += 1
            elif len(got) > 1:
                report.count("duplicates", explained, plan.id)
                figures["duplicates"] += 0 if explained else len(got) - 1
            if len(got) > 1:
                where = ", ".join(p.where for p in got)
                report.breach(f"one {kind} action stored {len(got)} times", plan.id, where, explained)
            _check_effects(ev, report, plan, len(got) - len(late), explained, [p.at for p in got])
        ids = {p.id for p in ev.planned if p.kind == kind}
        for entry in ev.ends:
            if entry["id"] in ids:
                figures["attempts Done by a read-back (recorded or not)"] += "read back" in (entry.get("ref") or "")


def readback_from(kind: str, trace: object) -> float | None:
    """Where the kind's read-back begins to look (epoch seconds, its provider's clock), from the `since` (Slack,
    GitHub) or `first_write` (GitLab) its first attempt noted by its executor's clock; None: not noted."""
    noted = trace.get("first_write" if kind == "GITLAB_POST" else "since") if isinstance(trace, dict) else None
    if not isinstance(noted, str):
        return None
    if kind == "SLACK_MESSAGE":  # a Slack ts, its margin already taken off
        return float(noted)
    margin = GITHUB_MARGIN if kind == "GITHUB_POST" else GITLAB_MARGIN
    return (datetime.fromisoformat(noted) - margin).timestamp()


def _missed_for_a_clock(ev: Evidence, plan: Planned, first: posts.Stored) -> bool:
    """A post made again because the read-back looked only after the first one: the first attempt's executor
    noted its `since` by a wall clock ahead of the provider's by more than the read-back's margin."""
    row = ev.rows.get(plan.id)
    start = readback_from(plan.kind, row.trace if row is not None else None)
    return start is not None and start > first.at


def _alert_of(body: str) -> str:
    try:
        return str(json.loads(body)["data"]["alert_id"])
    except (ValueError, KeyError, TypeError):
        return ""


def _check_effects(
    ev: Evidence, report: Report, plan: Planned, effects: int, late: bool, times: list[float] | None
) -> None:
    """The effects a WEBHOOK or NATS_EVENT action's provider holds against the state it ended in, its
    erasure, and whether any attempt of it fenced. `times`: when each effect was made (None: unknown)."""
    figures = report.figures(plan.kind)
    figures["actions"] += 1
    if effects and plan.id not in ev.may_have_fenced:
        report.breach("an effect for an action whose fence never happened", plan.id, plan.kind, late)
    if plan.id in ev.erased:
        erasure, found = ev.erased[plan.id]
        figures["erased"] += 1
        after = [t for t in times if t > erasure.at] if times is not None else []
        if after and not found["fenced"] and found["state"] not in ENDED_STATES:
            report.breach("an erased account's pending action reached its provider", plan.id, found["state"], late)
        return
    row = ev.rows.get(plan.id)
    if row is None:
        report.breach("an action vanished without an erasure", plan.id, plan.kind)
        return
    figures[f"ended {row.state}"] += row.ended_at is not None
    if row.state == "DONE" and "read back" in (row.readback_ref or ""):
        figures["DONE by a read-back that found the event"] += 1
    if row.state == "DONE" and (row.readback_ref or "").endswith(" duplicate"):
        figures["DONE with a PubAck marked duplicate"] += 1
    if row.state in ("UNCERTAIN", "FAILED"):
        report.reasons[(plan.kind, row.state, _shape(row.last_error))] += 1
    if row.state in ("FAILED", "CANCELLED") and effects:
        # an attempt fenced (checked above) and sent, its answer lost; a later claim then ended the action
        # FAILED (attempts exhausted) or CANCELLED (expired), which say the provider holds nothing: counted
        # and listed, not a breach of the effect-needs-a-fence rule
        figures[f"ended {row.state} though the provider holds the effect (an earlier attempt fenced)"] += 1
        report.notes.append(f"{plan.kind} {plan.id} ended {row.stop_reason} ({row.last_error}); its provider holds it")
        return
    # an action still waiting for its retry may hold the effect of an attempt that fenced
    low, high = EFFECTS_ALLOWED.get(row.state, (0, 0)) if row.ended_at is not None else (0, 1)
    if not low <= effects <= high:
        detail = f"{row.stop_reason}: {effects} at the provider"
        report.breach(f"a {plan.kind} action ended {row.state} with the wrong number of effects", plan.id, detail, late)


def _shape(reason: str | None) -> str:
    """A reason without its numbers (sequences, seconds, ids), so alike reasons count together."""
    return re.sub(r"\d+(\.\d+)?", "N", reason or "")[:160]


def check_brinks_after_accept(ev: Evidence, report: Report) -> None:
    """Each WEBHOOK and NATS_EVENT brink (frozen once the provider accepted): the next claim found the effect
    and ended DONE with it, never a second effect (NATS: read back by its subject, past the duplicate window;
    webhook: sent again, the receiver absorbed it)."""
    plans = {p.id: p for p in ev.planned}
    for brink in report.brinks:
        plan = plans.get(brink.action_id or 0)
        if brink.kind not in ("WEBHOOK", "NATS_EVENT", *posts.KINDS) or plan is None:
            continue
        row = ev.rows.get(plan.id)
        ref = (row.readback_ref or "") if row is not None else ""
        if brink.kind == "NATS_EVENT":
            found = "read back" in ref and len(ev.stored.get(event_token(plan.key), [])) == 1
        elif brink.kind in posts.KINDS:
            held = [p for p in ev.stored_posts.get(brink.kind, []) if p.marker == post_marker(plan)]
            found = "read back" in ref and len(held) == 1
            if not found and held and _missed_for_a_clock(ev, plan, held[0]):
                brink.outcome += "; NOT found: the read-back began after the post (its first attempt's clock ahead)"
                report.figures(brink.kind)["brinks whose read-back began after the post (a clock ahead)"] += 1
                report.figures(brink.kind)[f"brinks ended by {brink.ending}"] += 1
                continue
        else:
            effect = ev.effects.get(webhook_id(plan.key))
            found = bool(ref) and effect is not None and int(effect["deliveries"]) >= 2
        found = found and row is not None and row.state == "DONE"
        brink.outcome += "; the next claim found the effect" if found else f"; NOT found ({ref or 'no ref'})"
        figures = report.figures(brink.kind)
        figures[f"brinks ended by {brink.ending}"] += 1
        figures["brinks whose next claim found the effect"] += found


def lane_spans(ev: Evidence) -> dict[str, list[Span]]:
    """Every message at the relay and every write at the provider, by lane."""
    spans: dict[str, list[Span]] = defaultdict(list)
    for mid, plan in ev.emails.items():
        got, late = ev.messages(mid, plan)
        for r in got:
            spans[plan.lane].append((r.mail_at, r.received_at, plan.id, r in late, "EMAIL"))
    for plan in ev.planned:
        if plan.kind == kinds.READBACK.name:
            for w in ev.by_action.get(plan.id, []):
                spans[plan.lane].append((w.started_at, w.ended_at or w.started_at, plan.id, _late(w), "READBACK"))
        elif plan.kind == "NATS_EVENT":  # the moment the server stored it (a webhook's is not known)
            end = ev.end_of(plan)
            for m in ev.stored.get(event_token(plan.key), []):
                spans[plan.lane].append((m.at, m.at, plan.id, end is not None and m.at > end, "NATS_EVENT"))
    for kind in posts.KINDS:  # the moment the API stored each post
        for post in ev.stored_posts.get(kind, []):
            found = ev.post_plans.get(post.marker)
            if found is not None:
                end = ev.end_of(found)
                spans[found.lane].append((post.at, post.at, found.id, end is not None and post.at > end, kind))
    return spans


def check_lanes(ev: Evidence, report: Report) -> None:
    """A lane never has two writes in flight at once, and its actions write in id order."""
    for lane, spans in lane_spans(ev).items():
        spans.sort()
        latest = spans[0]  # of the writes so far, the one that ended last
        for span in spans[1:]:
            start, end, action_id, late_write, kind = span
            if start < latest[1]:
                report.count("overlaps", latest[3] or late_write, action_id)
                for one in {kind, latest[4]} & set(posts.KINDS):
                    report.figures(one)["lane overlaps"] += 0 if latest[3] or late_write else 1
                detail = f"{lane}: {latest[4]} {latest[2]} and {kind} {action_id}"
                report.breach("two writes in one lane at once", action_id, detail, latest[3] or late_write)
            if end > latest[1]:
                latest = span
        first: dict[int, float] = {}
        for s, _, action_id, late_write, _ in spans:
            if not late_write:
                first.setdefault(action_id, s)
        order = [a for a, _ in sorted(first.items(), key=lambda item: item[1])]
        for before, after in itertools.pairwise(order):
            if after < before:
                report.breach("a lane ran out of id order", after, f"{lane}: {after} wrote after {before}")


def check_journals(ev: Evidence, report: Report) -> None:
    """At most once in the journals: no EMAIL claimed again after its write started."""
    for path in ev.journals:
        for entry in journal.read(path):
            if entry["e"] == "start" and entry.get("kind") == "EMAIL" and entry.get("prior"):
                report.breach("an EMAIL claimed again after its write started", entry["id"], path.name)


def check_nothing_lost(ev: Evidence, report: Report) -> None:
    """Nothing lost: every action not erased has ended or is legitimately waiting (a parked proposal, a retry
    not due yet, or an action behind a WEBHOOK's retry in its lane: the runner does not wait 5 minutes)."""
    webhook_retry: dict[str, int] = {}  # by lane: the first WEBHOOK waiting for a retry not due yet
    for row in ev.rows.values():
        if row.ended_at is None and row.state == "ADMITTED" and row.later and row.kind == "WEBHOOK":
            webhook_retry[row.lane_key] = min(row.id, webhook_retry.get(row.lane_key, row.id))
    for plan in ev.planned:
        row = ev.rows.get(plan.id)
        if row is None or row.ended_at is not None:
            continue
        behind = row.id > webhook_retry.get(row.lane_key, row.id)
        if plan.parked or (row.state == "ADMITTED" and (row.later or behind)):
            report.waiting += 1
            continue
        report.lost.append({"action": plan.id, "kind": plan.kind, "state": row.state, "lane": plan.lane})
        if plan.kind in posts.KINDS:
            report.figures(plan.kind)["lost"] += 1
    if report.lost:
        report.breach("actions left neither ended nor legitimately waiting", None, f"{len(report.lost)} actions")


def check_per_cell(ev: Evidence, report: Report) -> None:
    """A cells run: each cell's actions, how they ended, and its duplicates, lane overlaps and lost actions
    (every breach counted against the cell of its action)."""
    if not report.cells:
        return
    for plan in ev.planned:
        figures = report.cell_figures(plan.id)
        figures["actions"] += 1
        row = ev.rows.get(plan.id)
        if row is not None and row.ended_at is not None:
            figures[f"ended {row.state}"] += 1
        elif plan.id in ev.erased:
            figures["erased"] += 1
    for lost in report.lost:
        report.cell_figures(lost["action"])["lost"] += 1
    for breach in report.unexplained:
        if breach["action"] is not None:
            report.cell_figures(breach["action"])["breaches not explained by a late write"] += 1


def check_executors(ev: Evidence, report: Report) -> None:
    """No executor exited on its own, and every one stopped cleanly on the final SIGTERM."""
    for line in ev.unexpected_exits:
        report.breach("an executor exited on its own", None, line)
    if any(code != 0 for code in report.stop_codes):
        report.breach("an executor did not stop cleanly on SIGTERM", None, str(report.stop_codes))


def check_metrics(ev: Evidence, report: Report) -> None:
    """action_ended_total equals the ended rows (plus those an erasure deleted after they ended); the
    recorded attempts that end an action equal the actions they ended."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
    for engine in ev.engines:  # a cells run: every cell's counters, summed
        exposition = generate_latest(registry_for(engine, cache_seconds=0)).decode()
        for family in text_string_to_metric_families(exposition):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] += s.value
    ended: Counter[tuple[str, str, str]] = Counter()
    for row in ev.rows.values():
        if row.stop_reason is not None:
            ended[(row.kind, row.state, row.stop_reason)] += 1
    for erasure in ev.erasures:
        for found in erasure.rows:
            if found["stop_reason"] is not None:
                ended[(found["kind"], found["state"], found["stop_reason"])] += 1
    counted = {
        (dict(labels)["kind"], dict(labels)["state"], dict(labels)["reason"]): v
        for (name, labels), v in samples.items()
        if name == "action_ended_total"
    }
    for key in set(counted) | set(ended):
        if counted.get(key, 0) != ended.get(key, 0):
            detail = f"{key}: {counted.get(key, 0)} vs {ended[key]}"
            report.breach("action_ended_total differs from the database", None, detail)
    attempts = {
        (dict(labels)["kind"], dict(labels)["result"], dict(labels)["recorded"]): v
        for (name, labels), v in samples.items()
        if name == "action_attempts_total"
    }
    by_result = {
        "DONE": [("DONE", "CONFIRMED")],
        "FAILED": [("FAILED", "PROVIDER_REFUSED")],
        "CANCELLED": [("CANCELLED", "NOT_WANTED")],
        "UNCERTAIN": [("UNCERTAIN", "PROVIDER_UNCERTAIN"), ("UNCERTAIN", "ERROR_AFTER_WRITE")],
    }
    for kind in (kinds.READBACK.name, "EMAIL", "WEBHOOK", "NATS_EVENT", *posts.KINDS):
        for result, reasons in by_result.items():
            want = sum(ended.get((kind, state, reason), 0) for state, reason in reasons)
            got = attempts.get((kind, result, "true"), 0)
            if got != want:
                report.breach(
                    "action_attempts_total{recorded=true} differs from the outcomes",
                    None,
                    f"{kind} {result}: {got} vs {want}",
                )


CONSTRAINT_CHECKS = {
    "two EXECUTING actions in one lane": (
        "SELECT count(*) FROM (SELECT lane_key FROM agent_action WHERE state = 'EXECUTING'"
        " GROUP BY lane_key HAVING count(*) > 1) AS x"
    ),
    "an ended action with a payload, a lease or no ended_at": (
        "SELECT count(*) FROM agent_action WHERE stop_reason IS NOT NULL"
        " AND (payload IS NOT NULL OR lease_expires_at IS NOT NULL OR ended_at IS NULL)"
    ),
    "an EXECUTING action without a lease": (
        "SELECT count(*) FROM agent_action WHERE state = 'EXECUTING' AND lease_expires_at IS NULL"
    ),
    "an ended action that still holds its lane": (
        "SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL AND lane_head"
    ),
    "a lane whose holder differs from its actions (none, or not the executing or oldest waiting one)": """
        SELECT count(*) FROM (SELECT lane_key, id FROM agent_action WHERE lane_head) AS h
         FULL JOIN (
            SELECT DISTINCT ON (lane_key) lane_key, id FROM agent_action WHERE ended_at IS NULL
             ORDER BY lane_key, state = 'EXECUTING' DESC, id
         ) AS f ON f.lane_key = h.lane_key
         WHERE h.id IS DISTINCT FROM f.id
    """,
}


def check_constraints(engine: Engine, report: Report) -> None:
    """Every CHECK constraint of agent_action holds for every row, and the derived state is exact."""
    with engine.connect() as conn:
        checks = dict(CONSTRAINT_CHECKS)
        for name, definition in conn.execute(
            text(
                # the expression alone: a constraint added NOT VALID (to skip reading the table) says so in
                # its definition, yet every row must meet it all the same
                "SELECT conname, pg_get_expr(conbin, conrelid) FROM pg_constraint"
                " WHERE conrelid = 'agent_action'::regclass AND contype = 'c'"
            )
        ):
            expression = definition
            checks[name] = f"SELECT count(*) FROM agent_action WHERE NOT coalesce({expression}, true)"
        for name, query in checks.items():
            broken = int(conn.execute(text(query)).scalar_one())
            if broken:
                report.breach("a row breaks a constraint", None, f"{name}: {broken} rows")


def _started_late(w: Any) -> bool:
    """The writer no longer held the action when its write reached the provider."""
    return bool(w.holder_at_start in LATE_HOLDER)


def _late(w: Any) -> bool:
    """The writer no longer held the action when its write, or the end of its provider call, reached the provider."""
    return _started_late(w) or w.holder_at_end in LATE_HOLDER


def _late_label(w: Any) -> str:
    if _started_late(w):
        return "read-back write by a holder that had lost its lease" + (" (brink, on purpose)" if w.brink else "")
    return "read-back call that ended after its holder lost its lease (frozen mid-call)"
