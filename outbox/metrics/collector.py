"""OutboxCollector: every outbox metric, read from the database at scrape time, never written.

    scrapes ──▶ a snapshot younger than `cache_seconds`? ──yes──▶ shared by every scrape
                    │ no
                    ▼
        the one snapshot in flight: the first scrape starts it on a thread of its own, every concurrent
        scrape waits for that one (single flight), each at most `wait_seconds`
                    ▼
        one READ ONLY, REPEATABLE READ transaction: connect timeout 2 s at most, statement_timeout 2 s
        ──▶ counters: the sum of every tally row (merged or not), histograms from the latency tallies,
            gauges from the partial indexes ──▶ outbox_exporter_up 1 and every metric
    an error, or no answer within `wait_seconds` ──▶ outbox_exporter_up 0, and one log line per change
        between up and down (WARNING with the cause when it goes down, INFO when it comes back)

The collector never writes, so it runs under the read-only role `outbox_reader`: the tally rows are merged by
the executors and the retention purge (store_metrics.merge_tallies), and a merge keeps every sum. Counters
come from durable tallies written in the transactions they count, so they are right across replicas, crashed
workers and flow runs in short-lived subprocesses. Every label set an alert uses is exported from the first
scrape (at 0), so the first UNCERTAIN shows as an increase; the kinds are those with a row in
agent_action_kind (an application's own, which this process never imports, included), those this process
registered, and those with tallies. No label holds a lane key, an id or free text. One snapshot serves every
scrape of a cache period, so many Prometheus servers scraping at once do not multiply the database load. A
snapshot whose database never answers (a host that hangs) is left to its thread; a later scrape starts a new
one, at most MAX_UNANSWERED of them at a time.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError

from outbox._internal.connections import opening
from outbox._internal.connections.engines import fault_text, shown_url
from outbox._internal.connections.opening import TCP_BOUNDS
from outbox.destinations import Destination, destinations
from outbox.executor.results import RESULT_NAMES
from outbox.kinds import ActionKind
from outbox.states import REASON_STATE
from outbox.store import metrics as sql
from outbox.store.executor import LATENCY_BUCKETS
from outbox.store.operator import COUNT_UNENDED_BY_STATE_AND_KIND

log = logging.getLogger("outbox.metrics")

LANE_DEPTH_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0, math.inf)
UNENDED_STATES = ("PROPOSED", "ADMITTED", "EXECUTING")
LATENCY_METRICS = {
    "attempt_duration": ("action_attempt_duration_seconds", "Time from claim to result of an attempt."),
    "pickup_delay": ("action_pickup_delay_seconds", "Time from an action's due time to its claim."),
}
# A host that does not complete the handshake fails the exporter's connection after 2 s, also when its URL
# allows longer (a scrape waits `wait_seconds` at most: a longer handshake would only hold a thread).
CONNECT_TIMEOUT_SECONDS = 2
# snapshots started that never ended (their database stopped answering mid-way) before no new one starts
MAX_UNANSWERED = 2


@dataclass
class Snapshot:
    attempts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    ended: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # (kind, metric) -> {le: count in that bucket}, and the sum of observations
    latency: dict[tuple[str, str], dict[float, int]] = field(default_factory=dict)
    latency_sum: dict[tuple[str, str], float] = field(default_factory=dict)
    # every kind with a row in agent_action_kind, whether or not this process registered it
    kinds: set[str] = field(default_factory=set)
    actions: dict[tuple[str, str], int] = field(default_factory=dict)
    # kind -> (claimable now, age of the oldest of them in seconds)
    due: dict[str, tuple[int, float]] = field(default_factory=dict)
    # kind -> ADMITTED actions due that wait for their lane (behind its head or its executing action)
    lane_waiting: dict[str, int] = field(default_factory=dict)
    leases: dict[str, tuple[int, int]] = field(default_factory=dict)
    lanes_by_depth: dict[int, int] = field(default_factory=dict)
    executors: int = 0
    last_purge: float | None = None
    # every destination with a row or an action not ended
    destinations: tuple[Destination, ...] = ()


class NoAnswer(Exception):
    """The database did not answer a snapshot in time."""


@dataclass
class _Flight:
    """One snapshot being read, which every scrape that arrives meanwhile waits for."""

    started: float
    done: threading.Event = field(default_factory=threading.Event)
    snapshot: Snapshot | None = None
    error: Exception | None = None


class OutboxCollector(Collector):
    def __init__(
        self,
        engine: Engine,
        *,
        cache_seconds: float = 5.0,
        statement_timeout_ms: int = 2000,
        wait_seconds: float = 5.0,
        cell: str | None = None,
    ) -> None:
        bound_connections(engine)
        self._engine = engine
        self._cell = cell  # named in the log lines
        self._cache_seconds = cache_seconds
        self._timeout = statement_timeout_ms
        self._wait_seconds = wait_seconds
        self._lock = threading.Lock()
        self._cached: Snapshot | None = None
        self._taken_at = -math.inf
        self._flight: _Flight | None = None
        self._unanswered = 0  # flights given up on whose thread still waits for the database
        self._up: bool | None = None  # what the last scrape found, for the log line on a change
        self.snapshots = 0  # snapshots started, whatever their outcome

    def describe(self) -> Iterable[Metric]:
        return []  # no query when the collector is registered

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        yield from self.answer(self.take(), started)

    def answer(self, snapshot: Snapshot | Exception, started: float) -> Iterable[Metric]:
        """Every family of one scrape that found `snapshot` (or failed with it), begun at `started`."""
        up = GaugeMetricFamily("outbox_exporter_up", "1 when the last scrape could read the outbox database.")
        if isinstance(snapshot, Exception):
            self._found(False, snapshot)
            up.add_metric([], 0)
            yield up
            yield self._snapshots_total()
            yield _scrape_duration(started)
            return
        self._found(True, None)
        up.add_metric([], 1)
        yield up
        yield from families(snapshot)
        yield self._snapshots_total()
        yield _scrape_duration(started)

    @property
    def wait_seconds(self) -> float:
        return self._wait_seconds

    def take(self) -> Snapshot | Exception:
        """The cached snapshot while it is fresh, else the one in flight (started here when there is none);
        or what reading it raised, or NoAnswer after `wait_seconds`. Every waiter gets the same object."""
        deadline = time.monotonic() + self._wait_seconds
        return self.finish(self.begin(), deadline)

    def begin(self) -> Snapshot | _Flight:
        """The cached snapshot while it is fresh, else the flight to wait for (started here when there is
        none); never waits for the database."""
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._taken_at < self._cache_seconds:
                return self._cached
            flight = self._flight
            if flight is None or (now - flight.started > self._wait_seconds and self._unanswered < MAX_UNANSWERED):
                if flight is not None:
                    self._unanswered += 1  # its thread ends when its connection fails; nobody waits for it
                flight = self._flight = _Flight(time.monotonic())
                self.snapshots += 1
                threading.Thread(target=self._fly, args=(flight,), name="outbox-metrics-snapshot", daemon=True).start()
            return flight

    def finish(self, begun: Snapshot | _Flight, deadline: float) -> Snapshot | Exception:
        """What `begin` gave, once its flight has landed; NoAnswer when it has not by `deadline` (monotonic)."""
        if isinstance(begun, Snapshot):
            return begun
        if not begun.done.wait(max(0.0, deadline - time.monotonic())):
            return NoAnswer(f"the database did not answer within {self._wait_seconds:g} s")
        if begun.error is not None:
            return begun.error
        assert begun.snapshot is not None
        return begun.snapshot

    def _fly(self, flight: _Flight) -> None:
        try:
            flight.snapshot = self._read()
        except Exception as error:
            flight.error = error
        with self._lock:
            if self._flight is flight:
                self._flight = None
                if flight.snapshot is not None:
                    self._cached, self._taken_at = flight.snapshot, time.monotonic()
            else:
                self._unanswered -= 1
        flight.done.set()

    def _read(self) -> Snapshot:
        for tries_left in (1, 0):
            try:
                with self._engine.connect() as conn:
                    conn.execute(sql.READ_ONLY_SNAPSHOT)
                    conn.execute(sql.BOUND_STATEMENTS, {"ms": self._timeout})
                    snapshot = read_snapshot(conn)
                    conn.rollback()
                    return snapshot
            except DBAPIError as error:
                # a pooled connection the server closed meanwhile (a restart): once more, on a new one
                if not (error.connection_invalidated and tries_left):
                    raise
        raise AssertionError("unreachable")

    def _found(self, up: bool, error: Exception | None) -> None:
        """Log a change between up and down: the first scrape's finding, then each change."""
        with self._lock:
            changed, self._up = self._up is not up, up
        if not changed:
            return
        where = _where(self._engine) if self._cell is None else f"of cell {self._cell} ({_where(self._engine)})"
        if up:
            log.info("outbox_exporter_up 1: reading the outbox database %s", where)
        else:
            log.warning("outbox_exporter_up 0: cannot read the outbox database %s: %s", where, self._cause(error))

    def _cause(self, error: Exception | None) -> str:
        return "unknown" if error is None else fault_text(error, self._engine.url.password)

    def _snapshots_total(self) -> Metric:
        total = CounterMetricFamily(
            "outbox_exporter_snapshots", "Database snapshots this exporter started, whatever their outcome."
        )
        total.add_metric([], self.snapshots)
        return total


def _where(engine: Engine) -> str:
    """The database as a log line names it: no password, and of the URL's parameters only a socket's host."""
    url = engine.url
    host = url.query.get("host")
    return shown_url(url.set(query={"host": host} if host else {}))


def bound_connections(engine: Engine) -> None:
    """Give the engine's new connections a connect timeout of at most CONNECT_TIMEOUT_SECONDS, and
    `TCP_BOUNDS` except what its URL sets itself (a host that stops acknowledging fails the
    connection after about 5 s, instead of the system's minutes), then opens them by `opening`'s
    rules with these parameters."""
    if not event.contains(engine, "do_connect", _bound_connect):
        event.listen(engine, "do_connect", _bound_connect)
        opening.install(engine)


def _bound_connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    given = cparams.get("connect_timeout")
    try:
        seconds = float(given) if given is not None else math.inf
    except ValueError:
        seconds = math.inf
    # libpq reads 0 (or less) as "wait forever"
    cparams["connect_timeout"] = CONNECT_TIMEOUT_SECONDS if not 0 < seconds < CONNECT_TIMEOUT_SECONDS else given
    for name, setting in TCP_BOUNDS.items():
        cparams.setdefault(name, setting)


def read_snapshot(conn: Connection) -> Snapshot:
    s = Snapshot()
    for row in conn.execute(sql.ATTEMPT_COUNTS):
        s.attempts[(row.kind, row.result, str(row.recorded).lower())] = row.n
    for row in conn.execute(sql.ENDED_COUNTS):
        s.ended[(row.kind, row.state, row.reason)] = row.n
    for row in conn.execute(sql.LATENCY_BUCKETS):
        s.latency.setdefault((row.kind, row.metric), {})[row.le] = row.n
        s.latency_sum[(row.kind, row.metric)] = s.latency_sum.get((row.kind, row.metric), 0.0) + row.total
    s.kinds = set(conn.execute(sql.KIND_NAMES).scalars())
    for row in conn.execute(COUNT_UNENDED_BY_STATE_AND_KIND):
        s.actions[(row.kind, row.state)] = row.actions
    claimable_heads: dict[str, int] = {}
    for row in conn.execute(sql.CLAIMABLE_BY_KIND):
        s.due[row.kind] = (row.actions, row.oldest_due_seconds)
        claimable_heads[row.kind] = row.heads
    s.lane_waiting = {
        row.kind: row.actions - claimable_heads.get(row.kind, 0) for row in conn.execute(sql.DUE_ADMITTED_BY_KIND)
    }
    s.leases = {row.kind: (row.executing, row.expired) for row in conn.execute(sql.LEASES_BY_KIND)}
    s.lanes_by_depth = {row.depth: row.lanes for row in conn.execute(sql.LANES_BY_DEPTH)}
    s.executors = conn.execute(sql.LIVE_EXECUTORS, {"seconds": sql.EXECUTOR_SILENCE_SECONDS}).scalar_one()
    purge = conn.execute(sql.LAST_PURGE).first()
    s.last_purge = purge.at if purge is not None else None
    s.destinations = destinations(conn)
    return s


def families(s: Snapshot) -> Iterable[Metric]:
    kinds = sorted(
        {k.name for k in ActionKind.all()} | s.kinds | {k for k, *_ in s.attempts} | {k for k, *_ in s.ended}
    )

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

    due = GaugeMetricFamily(
        "outbox_due_actions",
        "Actions an executor could claim now: due heads of lanes with nothing executing, and expired leases"
        " to take back.",
        labels=["kind"],
    )
    oldest = GaugeMetricFamily(
        "outbox_oldest_due_age_seconds",
        "How long the oldest action an executor could claim now has been claimable, database clock (0: none).",
        labels=["kind"],
    )
    lane_waiting = GaugeMetricFamily(
        "outbox_lane_waiting_actions",
        "ADMITTED actions due that wait for their lane: behind its head or its executing action.",
        labels=["kind"],
    )
    executing = GaugeMetricFamily("outbox_executing_actions", "Actions EXECUTING.", labels=["kind"])
    expired = GaugeMetricFamily("outbox_expired_leases", "EXECUTING actions whose lease has expired.", labels=["kind"])
    for kind in kinds:
        count, age = s.due.get(kind, (0, 0.0))
        due.add_metric([kind], count)
        oldest.add_metric([kind], max(0.0, age))
        lane_waiting.add_metric([kind], s.lane_waiting.get(kind, 0))
        running, lost = s.leases.get(kind, (0, 0))
        executing.add_metric([kind], running)
        expired.add_metric([kind], lost)
    yield from (due, oldest, lane_waiting, executing, expired)

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

    yield from destination_families(s.destinations)

    executors = GaugeMetricFamily("outbox_executors", "Executors that beat in the last 30 seconds.")
    executors.add_metric([], s.executors)
    yield executors
    if s.last_purge is not None:
        purge = GaugeMetricFamily(
            "outbox_purge_last_success_timestamp_seconds", "When the retention purge last succeeded (Unix time)."
        )
        purge.add_metric([], s.last_purge)
        yield purge


def destination_families(found: Iterable[Destination]) -> Iterable[Metric]:
    """Per destination (labels kind and destination: the names kinds and endpoints give, a bounded set): held
    back or not, the configured rate and learned pace when it has them, and its actions waiting."""
    labels = ["kind", "destination"]
    paused = GaugeMetricFamily(
        "outbox_destination_paused",
        "1 while no executor claims for the destination (a provider's or an operator's pause).",
        labels=labels,
    )
    broken = GaugeMetricFamily(
        "outbox_destination_broken",
        "1 while the destination is broken (not for refused credentials: the next gauge): one probe at a time.",
        labels=labels,
    )
    refused = GaugeMetricFamily(
        "outbox_destination_credentials_refused",
        "1 while the provider refuses the destination's credentials: one probe every few minutes.",
        labels=labels,
    )
    broken_seconds = GaugeMetricFamily(
        "outbox_destination_broken_seconds",
        "How long the destination has been broken, database clock (0: not broken).",
        labels=labels,
    )
    rate = GaugeMetricFamily(
        "outbox_destination_rate",
        "The destination's configured rate, attempts a second (none: no series).",
        labels=labels,
    )
    pace = GaugeMetricFamily(
        "outbox_destination_pace",
        "The pace the provider's slow-downs set, attempts a second, rising while it accepts (none: no series).",
        labels=labels,
    )
    waiting = GaugeMetricFamily(
        "outbox_destination_waiting_actions",
        "The destination's actions not started (PROPOSED or ADMITTED).",
        labels=labels,
    )
    oldest = GaugeMetricFamily(
        "outbox_destination_oldest_due_age_seconds",
        "How long the destination's oldest due lane head has waited to be claimed, database clock (0: none).",
        labels=labels,
    )
    for d in found:
        key = [d.kind, d.name]
        paused.add_metric(key, 1 if d.state == "paused" else 0)
        # a destination whose credentials are refused is held as broken, for a cause of its own and its own alert
        is_broken = d.broken_since is not None and d.credentials_refused_at is None
        broken.add_metric(key, 1 if is_broken else 0)
        broken_seconds.add_metric(key, max(0.0, d.broken_seconds or 0.0) if is_broken else 0.0)
        refused.add_metric(key, 1 if d.credentials_refused_at is not None else 0)
        if d.rate is not None:
            rate.add_metric(key, d.rate)
        if d.pace is not None:
            pace.add_metric(key, d.pace)
        waiting.add_metric(key, d.waiting)
        oldest.add_metric(key, max(0.0, d.oldest_due_seconds))
    yield from (paused, broken, broken_seconds, refused, rate, pace, waiting, oldest)


def _number(le: float) -> str:
    return f"{le:g}"


def _scrape_duration(started: float) -> Metric:
    duration = GaugeMetricFamily("outbox_exporter_scrape_duration_seconds", "How long the last scrape took.")
    duration.add_metric([], time.perf_counter() - started)
    return duration
