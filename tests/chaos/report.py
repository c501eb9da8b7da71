"""A chaos run's report: what it did, what the checks found, as a Markdown table or JSON."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.records import Brink, Kill, Partition


@dataclass
class Report:
    """Filled by the runner (what it did) and by tests.chaos.checks (what it found)."""

    seed: int
    minutes: float
    command: str
    postgres: str
    wall_seconds: float = 0.0
    enqueued: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    erased: Counter[str] = field(default_factory=Counter)
    kills: list[Kill] = field(default_factory=list)
    brinks: list[Brink] = field(default_factory=list)
    partitions: list[Partition] = field(default_factory=list)
    late_writes: Counter[str] = field(default_factory=Counter)
    late_details: list[dict[str, Any]] = field(default_factory=list)
    breaches: list[dict[str, Any]] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)
    waiting: int = 0
    # not explained by a late write (must be 0), and explained by one
    duplicates: int = 0
    overlaps: int = 0
    late_duplicates: int = 0
    # a post made again because its read-back looked only after the first one: the first attempt's executor
    # clock ran ahead of the provider's by more than the read-back's margin (explained, counted apart)
    clock_duplicates: int = 0
    late_overlaps: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    stop_codes: list[int | None] = field(default_factory=list)
    driver_retries: Counter[str] = field(default_factory=Counter)
    pg_restarts: list[float] = field(default_factory=list)
    enqueue_seconds: list[float] = field(default_factory=list)
    sink_messages: int = 0
    provider_writes: int = 0
    settle_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # WEBHOOK and NATS_EVENT: figures per kind, and why actions ended UNCERTAIN or FAILED (kind, state, reason)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    reasons: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # a cells run: each cell's name and the first of its action ids, in order; its figures and faults by name
    cells: list[tuple[str, int]] = field(default_factory=list)
    by_cell: dict[str, Counter[str]] = field(default_factory=dict)
    cell_faults: dict[str, Counter[str]] = field(default_factory=dict)

    def breach(self, invariant: str, action_id: int | None, detail: str, late: bool = False) -> None:
        """An invariant found broken; `late`: explained by a late write (the case no fence can stop)."""
        self.breaches.append({"invariant": invariant, "action": action_id, "detail": detail, "late": late})

    def count(self, what: str, late: bool, action_id: int | None = None) -> None:
        name = f"late_{what}" if late else what
        setattr(self, name, getattr(self, name) + 1)
        if self.cells and action_id is not None:
            self.cell_figures(action_id)[name] += 1

    def cell_of(self, action_id: int) -> str:
        """The cell that holds the action (a cells run)."""
        return [name for name, first in self.cells if action_id > first][-1]

    def cell_figures(self, action_id: int) -> Counter[str]:
        return self.by_cell.setdefault(self.cell_of(action_id), Counter())

    def figures(self, kind: str) -> Counter[str]:
        """The figures of one kind's provider (WEBHOOK, NATS_EVENT), made on first use."""
        return self.by_kind.setdefault(kind, Counter())

    @property
    def unexplained(self) -> list[dict[str, Any]]:
        return [b for b in self.breaches if not b["late"]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def render(report: Report) -> str:
    lines = [
        f"## Chaos run: seed {report.seed}, {report.minutes:g} min of faults",
        "",
        f"`{report.command}` on PostgreSQL {report.postgres}; {report.wall_seconds:.0f} s wall, "
        f"settled {report.settle_seconds:.0f} s after the faults stopped.",
        "",
        "| actions | count |",
        "| --- | ---: |",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(report.enqueued.items()) if v]
    lines += [f"| erased while {k} | {v} |" for k, v in sorted(report.erased.items())]
    lines += [
        f"| messages at the relay | {report.sink_messages} |",
        f"| writes at the read-back provider | {report.provider_writes} |",
    ]
    lines += ["", "| fault injected | count |", "| --- | ---: |"]
    lines += [f"| {k} | {v} |" for k, v in sorted(report.faults.items()) if v]
    lines += ["", "| kind | state | reason | actions |", "| --- | --- | --- | ---: |"]
    lines += [f"| {k} | {s} | {r} | {n} |" for (k, s, r), n in sorted(report.outcomes.items())]
    recoveries = [k.recovery for k in report.kills if k.recovery is not None]
    held = [k for k in report.kills if k.held]
    beats = [k.restart_to_beat for k in report.kills if k.restart_to_beat is not None]
    lines += [
        "",
        "| invariant | found |",
        "| --- | ---: |",
        f"| duplicates (must be 0) | {report.duplicates} |",
        f"| lane overlaps (must be 0) | {report.overlaps} |",
        f"| duplicates caused by a late write (the unfenceable case) | {report.late_duplicates} |",
        "| duplicates after a read-back that began after the post (the first attempt's executor clock ahead of"
        f" the provider's by more than the read-back's margin) | {report.clock_duplicates} |",
        f"| lane overlaps caused by a late write | {report.late_overlaps} |",
        f"| lost actions (must be 0) | {len(report.lost)} |",
        f"| actions legitimately waiting (parked proposals, backoff) | {report.waiting} |",
        f"| invariant breaches | {len(report.breaches)} |",
        f"| of them not explained by a late write (must be 0) | {len(report.unexplained)} |",
    ]
    lines += [f"| late writes: {k} | {v} |" for k, v in sorted(report.late_writes.items())]
    lines += [
        f"| executors that exited on their own | {len(report.unexpected_exits)} |",
        f"| executor exit codes on the final SIGTERM | {report.stop_codes} |",
        "",
        f"Kills: {len(report.kills)}; {len(held)} of them hit a process holding attempts"
        f" ({sum(len(k.held) for k in held)} in all). Kill to every held action taken"
        f" back or ended: p50 {percentile(recoveries, 0.5):.1f} s, max {max(recoveries, default=0):.1f} s"
        f" (held only: p50 {percentile([k.recovery for k in held if k.recovery], 0.5):.1f} s; the lease is 65 s)."
        f" Restart to first heartbeat: p50 {percentile(beats, 0.5):.1f} s, max {max(beats, default=0):.1f} s"
        " (no fault stops or cuts off a process before its first heartbeat).",
    ]
    lines += cell_lines(report)
    lines += provider_lines(report)
    lines += partition_lines(report.partitions)
    enqueues = report.enqueue_seconds
    lines.append(
        "Enqueue transactions (the application's side, retried across restarts):"
        f" p50 {percentile(enqueues, 0.5) * 1000:.1f} ms, p99 {percentile(enqueues, 0.99) * 1000:.1f} ms,"
        f" max {max(enqueues, default=0):.2f} s."
    )
    if report.pg_restarts:
        restarts = ", ".join(f"{s:.1f} s" for s in report.pg_restarts)
        lines.append(f"PostgreSQL restarts (and cell primaries SIGKILLed: the kill to a server up) took {restarts}.")
    lines += [
        "",
        "| kill | at (s) | executor | held | restart to beat (s) | recovered after (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in report.kills:
        beat = "" if k.restart_to_beat is None else f"{k.restart_to_beat:.1f}"
        rec = "not yet" if k.recovery is None else f"{k.recovery:.1f}"
        lines.append(f"| {k.n} | {k.at:.0f} | {k.slot} | {len(k.held)} | {beat} | {rec} |")
    if report.brinks:
        lines += ["", "| frozen at the brink | action | held (s) | outcome |", "| --- | ---: | ---: | --- |"]
        for b in report.brinks:
            held_for = "" if b.released_at is None else f"{b.released_at - b.since:.0f}"
            lines.append(f"| {b.kind} | {b.action_id} | {held_for} | {b.outcome} |")
    if report.breaches:
        lines += ["", "| breach | action | detail | late write |", "| --- | ---: | --- | --- |"]
        for breach in report.breaches[:50]:
            lines.append(f"| {breach['invariant']} | {breach['action']} | {breach['detail']} | {breach['late']} |")
    if report.late_details:
        lines += ["", "Late writes: " + json.dumps(report.late_details[:20])]
    if report.lost:
        lines += ["", "Lost: " + json.dumps(report.lost[:20])]
    if report.driver_retries:
        lines += ["", "Driver retries on lost connections: " + json.dumps(dict(report.driver_retries))]
    return "\n".join(lines)


def cell_lines(report: Report) -> list[str]:
    """A cells run: per cell, its actions and how they ended, the invariants (each must be 0), and the faults its
    database took."""
    if not report.cells:
        return []
    names = [name for name, _ in report.cells]
    rows = [
        ("actions enqueued", "actions"),
        ("ended DONE", "ended DONE"),
        ("ended UNCERTAIN", "ended UNCERTAIN"),
        ("ended FAILED", "ended FAILED"),
        ("ended CANCELLED", "ended CANCELLED"),
        ("erased", "erased"),
        ("duplicates (must be 0)", "duplicates"),
        ("lane overlaps (must be 0)", "overlaps"),
        ("lost (must be 0)", "lost"),
        ("breaches not explained by a late write (must be 0)", "breaches not explained by a late write"),
        ("duplicates caused by a late write", "late_duplicates"),
        ("lane overlaps caused by a late write", "late_overlaps"),
    ]
    lines = ["", "| per cell | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(str(report.by_cell.get(n, Counter())[key]) for n in names) + " |")
    faults = sorted({fault for counts in report.cell_faults.values() for fault in counts})
    for fault in faults:
        counts = (str(report.cell_faults.get(n, Counter())[fault]) for n in names)
        lines.append(f"| fault: {fault} | " + " | ".join(counts) + " |")
    return lines


def provider_lines(report: Report) -> list[str]:
    """WEBHOOK, NATS_EVENT, SLACK_MESSAGE, GITHUB_POST, GITLAB_POST: what each kind's provider holds, the
    read-backs, the brinks, and why actions ended UNCERTAIN or FAILED."""
    lines: list[str] = []
    for kind in ("WEBHOOK", "NATS_EVENT", "SLACK_MESSAGE", "GITHUB_POST", "GITLAB_POST"):
        figures = report.by_kind.get(kind)
        if not figures:
            continue
        lines += ["", f"| {kind} | count |", "| --- | ---: |"]
        lines += [f"| {name} | {n} |" for name, n in sorted(figures.items())]
    if report.reasons:
        lines += ["", "| kind | ended | reason | actions |", "| --- | --- | --- | ---: |"]
        lines += [f"| {k} | {s} | {r} | {n} |" for (k, s, r), n in sorted(report.reasons.items())]
    if report.notes:
        lines += ["", "Notes: " + json.dumps(report.notes[:20])]
    return [*lines, ""] if lines else []


def partition_lines(partitions: list[Partition]) -> list[str]:
    """The network faults: per blackhole, how soon its executor noticed and beat again after it."""
    if not partitions:
        return []
    lines = []
    for kind in ("blackhole past the lease", "blackhole short", "delay", "cut"):
        of_kind = [p for p in partitions if p.kind == kind]
        if not of_kind:
            continue
        noticed = [p.noticed_after for p in of_kind if p.noticed_after is not None]
        beats = [p.beat_after_end for p in of_kind if p.beat_after_end is not None]
        lines.append(
            f"Network {kind}: {len(of_kind)}; its executor logged the database unreachable in {len(noticed)},"
            f" after p50 {percentile(noticed, 0.5):.1f} s, max {max(noticed, default=0):.1f} s;"
            f" end to next heartbeat p50 {percentile(beats, 0.5):.1f} s, max {max(beats, default=0):.1f} s"
            f" ({len(of_kind) - len(beats)} without one)."
        )
    lines += [
        "",
        "| network fault | at (s) | executor | lasted (s) | detail | noticed after (s) | end to heartbeat (s) |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for p in partitions:
        seen = "" if p.noticed_after is None else f"{p.noticed_after:.1f}"
        beat = p.outcome if p.beat_after_end is None else f"{p.beat_after_end:.1f}"
        lines.append(f"| {p.kind} | {p.at:.0f} | {p.slot} | {p.seconds:.1f} | {p.detail} | {seen} | {beat} |")
    return lines


def as_json(report: Report) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {"/".join(map(str, k)) if isinstance(k, tuple) else str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)

    return {"render": render(report), **plain(dataclasses.asdict(report))}
