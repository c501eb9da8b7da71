"""OutboxCollector: every outbox metric, read from the database at scrape time.

    scrape ──▶ merge tally rows (short write) ──▶ one read-only snapshot, statement_timeout 2 s
           ──▶ counters from tallies, histograms from latency tallies, gauges from the partial indexes

Counters come from durable tallies written in the transactions they count, so they are right across
replicas, crashed workers and flow runs in short-lived subprocesses. Every label set an alert uses is
exported from the first scrape (at 0), so the first UNCERTAIN shows as an increase. No label holds a lane
key, an id or free text. A snapshot is cached for `cache_seconds`, so several Prometheus servers scraping
do not multiply the database load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from outbox import store_metrics as sql
from outbox.executor.committer import LATENCY_BUCKETS
from outbox.executor.results import RESULT_NAMES
from outbox.kinds import ActionKind
from outbox.states import REASON_STATE
from outbox.store_ops import COUNT_UNENDED_BY_STATE_AND_KIND

LANE_DEPTH_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0, math.inf)
UNENDED_STATES = ("PROPOSED", "ADMITTED", "EXECUTING")
# an executor that has not beaten for this long counts as gone
EXECUTOR_SILENCE_SECONDS = 30
LATENCY_METRICS = {
    "attempt_duration": ("action_attempt_duration_seconds", "Time from claim to result of an attempt."),
    "pickup_delay": ("action_pickup_delay_seconds", "Time from an action's due time to its claim."),
}


@dataclass
class Snapshot:
    attempts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    ended: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # (kind, metric) -> {le: count in that bucket}, and the sum of observations
    latency: dict[tuple[str, str], dict[float, int]] = field(default_factory=dict)
    latency_sum: dict[tuple[str, str], float] = field(default_factory=dict)
    actions: dict[tuple[str, str], int] = field(default_factory=dict)
    due: dict[str, tuple[int, float]] = field(default_factory=dict)
    leases: dict[str, tuple[int, int]] = field(default_factory=dict)
    lanes_by_depth: dict[int, int] = field(default_factory=dict)
    executors: int = 0
    last_purge: float | None = None


class OutboxCollector(Collector):
    def __init__(self, engine: Engine, *, cache_seconds: float = 5.0, statement_timeout_ms: int = 2000) -> None:
        self._engine = engine
        self._cache_seconds = cache_seconds
        self._timeout = statement_timeout_ms
        self._cached: Snapshot | None = None
        self._taken_at = -math.inf

    def describe(self) -> Iterable[Metric]:
        return []  # no query when the collector is registered

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        up = GaugeMetricFamily("outbox_exporter_up", "1 when the last scrape could read the outbox database.")
        try:
            snapshot = self._snapshot()
        except SQLAlchemyError:
            up.add_metric([], 0)
            yield up
            yield _scrape_duration(started)
            return
        up.add_metric([], 1)
        yield up
        yield from families(snapshot)
        yield _scrape_duration(started)

    def _snapshot(self) -> Snapshot:
        if self._cached is not None and time.monotonic() - self._taken_at < self._cache_seconds:
            return self._cached
        with self._engine.begin() as conn:
            conn.execute(text(f"SET LOCAL statement_timeout = {self._timeout}"))
            for merge in (sql.MERGE_ATTEMPT_TALLIES, sql.MERGE_ENDED_TALLIES, sql.MERGE_LATENCY_TALLIES):
                conn.execute(merge)
        with self._engine.connect() as conn:
            conn.execute(text("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            conn.execute(text(f"SET LOCAL statement_timeout = {self._timeout}"))
            snapshot = read_snapshot(conn)
            conn.rollback()
        self._cached, self._taken_at = snapshot, time.monotonic()
        return snapshot


def read_snapshot(conn: Connection) -> Snapshot:
    s = Snapshot()
    for row in conn.execute(sql.ATTEMPT_COUNTS):
        s.attempts[(row.kind, row.result, str(row.recorded).lower())] = row.n
    for row in conn.execute(sql.ENDED_COUNTS):
        s.ended[(row.kind, row.state, row.reason)] = row.n
    for row in conn.execute(sql.LATENCY_BUCKETS):
        s.latency.setdefault((row.kind, row.metric), {})[row.le] = row.n
        s.latency_sum[(row.kind, row.metric)] = s.latency_sum.get((row.kind, row.metric), 0.0) + row.total
    for row in conn.execute(COUNT_UNENDED_BY_STATE_AND_KIND):
        s.actions[(row.kind, row.state)] = row.actions
    s.due = {row.kind: (row.actions, row.oldest_due_seconds) for row in conn.execute(sql.DUE_BY_KIND)}
    s.leases = {row.kind: (row.executing, row.expired) for row in conn.execute(sql.LEASES_BY_KIND)}
    s.lanes_by_depth = {row.depth: row.lanes for row in conn.execute(sql.LANES_BY_DEPTH)}
    s.executors = conn.execute(sql.LIVE_EXECUTORS, {"seconds": EXECUTOR_SILENCE_SECONDS}).scalar_one()
    purge = conn.execute(sql.LAST_PURGE).first()
    s.last_purge = purge.at if purge is not None else None
    return s


def families(s: Snapshot) -> Iterable[Metric]:
    kinds = sorted({k.name for k in ActionKind.all()} | {k for k, *_ in s.attempts} | {k for k, *_ in s.ended})

    attempts = CounterMetricFamily(
        "action_attempts",
        "Attempts by kind, result, and whether their write took effect under their epoch.",
        labels=["kind", "result", "recorded"],
    )
    for key in sorted(
        {(k, r, c) for k in kinds for r in RESULT_NAMES.values() for c in ("true", "false")} | set(s.attempts)
    ):
        attempts.add_metric(list(key), s.attempts.get(key, 0))
    yield attempts

    ended = CounterMetricFamily(
        "action_ended", "Actions ended, by kind, state and stop reason.", labels=["kind", "state", "reason"]
    )
    for key in sorted({(k, st.value, r.value) for k in kinds for r, st in REASON_STATE.items()} | set(s.ended)):
        ended.add_metric(list(key), s.ended.get(key, 0))
    yield ended

    for metric, (name, documentation) in LATENCY_METRICS.items():
        histogram = HistogramMetricFamily(name, documentation, labels=["kind"])
        for kind in kinds:
            counts = s.latency.get((kind, metric), {})
            cumulative, buckets = 0, []
            for le in LATENCY_BUCKETS:
                cumulative += counts.get(le, 0)
                buckets.append(("+Inf" if le == math.inf else _number(le), float(cumulative)))
            histogram.add_metric([kind], buckets, sum_value=s.latency_sum.get((kind, metric), 0.0))
        yield histogram

    actions = GaugeMetricFamily("outbox_actions", "Actions not ended, by kind and state.", labels=["kind", "state"])
    for kind in kinds:
        for state in UNENDED_STATES:
            actions.add_metric([kind, state], s.actions.get((kind, state), 0))
    yield actions

    due = GaugeMetricFamily("outbox_due_actions", "ADMITTED actions whose due time has come.", labels=["kind"])
    oldest = GaugeMetricFamily(
        "outbox_oldest_due_age_seconds",
        "Age of the oldest due ADMITTED action, on the database clock (0: none).",
        labels=["kind"],
    )
    executing = GaugeMetricFamily("outbox_executing_actions", "Actions EXECUTING.", labels=["kind"])
    expired = GaugeMetricFamily("outbox_expired_leases", "EXECUTING actions whose lease has expired.", labels=["kind"])
    for kind in kinds:
        count, age = s.due.get(kind, (0, 0.0))
        due.add_metric([kind], count)
        oldest.add_metric([kind], max(0.0, age))
        running, lost = s.leases.get(kind, (0, 0))
        executing.add_metric([kind], running)
        expired.add_metric([kind], lost)
    yield from (due, oldest, executing, expired)

    with_backlog = GaugeMetricFamily("outbox_lanes_with_backlog", "Lanes with an action not started.")
    with_backlog.add_metric([], sum(s.lanes_by_depth.values()))
    deepest = GaugeMetricFamily("outbox_lane_depth_max", "Actions not started in the deepest lane.")
    deepest.add_metric([], max(s.lanes_by_depth, default=0))
    depth = GaugeHistogramMetricFamily("outbox_lane_depth", "Lanes by the number of actions not started in them.")
    depth.add_metric(
        [],
        [
            ("+Inf" if le == math.inf else _number(le), float(sum(n for d, n in s.lanes_by_depth.items() if d <= le)))
            for le in LANE_DEPTH_BUCKETS
        ],
        gsum_value=float(sum(d * n for d, n in s.lanes_by_depth.items())),
    )
    yield from (with_backlog, deepest, depth)

    executors = GaugeMetricFamily("outbox_executors", "Executors that beat in the last 30 seconds.")
    executors.add_metric([], s.executors)
    yield executors
    if s.last_purge is not None:
        purge = GaugeMetricFamily(
            "outbox_purge_last_success_timestamp_seconds", "When the retention purge last succeeded (Unix time)."
        )
        purge.add_metric([], s.last_purge)
        yield purge


def _number(le: float) -> str:
    return f"{le:g}"


def _scrape_duration(started: float) -> Metric:
    duration = GaugeMetricFamily("outbox_exporter_scrape_duration_seconds", "How long the last scrape took.")
    duration.add_metric([], time.perf_counter() - started)
    return duration
