"""The exporter process (`outbox metrics serve`) under load and faults, against a real PostgreSQL, as the
read-only role `outbox_reader`; and the tally merge, which moved from the scrape to the executors and the purge.

Scrapes are real HTTP requests, many at once on one event loop. A database that hangs or goes away is a TCP
front of the test's PostgreSQL (`Front`) that forwards, holds every byte (a host that hangs) or closes every
connection (a database gone). Snapshots are counted twice: by the exporter
(`outbox_exporter_snapshots_total`) and by PostgreSQL itself (scans of agent_executor, which one snapshot
reads exactly once and nothing else in these tests reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import committer as committer_module
from outbox.executor.committer import Committer
from outbox.retention import purge_ended
from outbox.store import metrics as store_metrics
from tests.support import until
from tests.test_metrics import mixed_workload, samples, scrape, value
from tests.test_reader_role import reader_login

ROOT = Path(__file__).resolve().parent.parent
TALLIES = ("agent_action_attempt_tally", "agent_action_ended_tally", "agent_action_latency_tally")
DOWN = "outbox_exporter_up 0"
UP = "outbox_exporter_up 1"


# ---- a TCP front of the database that can hang or go away --------------------------------------------------


class Front:
    """127.0.0.1:port in front of `target` (a Unix socket path or a (host, port)), or of nothing (a host
    that accepts and never answers). `freeze()` holds every byte both ways; `gone()` closes every connection
    and each new one at once; `forward()` lets bytes flow again."""

    def __init__(self, target: str | tuple[str, int] | None) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._gone = False
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def forward(self) -> None:
        self._gone = False
        self._flowing.set()

    def freeze(self) -> None:
        self._flowing.clear()

    def gone(self) -> None:
        self._gone = True
        self._flowing.set()
        with self._lock:
            held, self._open = self._open, []
        for sock in held:
            _close(sock)

    def close(self) -> None:
        self.gone()
        _close(self._listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._gone:
                _close(client)
                continue
            with self._lock:
                self._open.append(client)
            if self._target is None:
                continue  # held open, never answered
            if isinstance(self._target, str):
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            else:
                upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.connect(self._target)
            with self._lock:
                self._open.append(upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                if self._gone:
                    break
                sink.sendall(data)
        except OSError:
            pass
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def database_socket(database_url: str) -> str | tuple[str, int]:
    """Where the test's PostgreSQL listens: its Unix socket, or its TCP address."""
    url = make_url(database_url)
    host = url.query.get("host") or url.host or "localhost"
    assert isinstance(host, str)
    port = url.port or 5432
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


def through(front: Front, database_url: str) -> str:
    url = make_url(database_url).difference_update_query(["host"]).set(host="127.0.0.1", port=front.port)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def reader_url(admin_engine: Engine, database_url: str) -> Iterator[str]:
    with reader_login(admin_engine, database_url) as url:
        yield url


@pytest.fixture
def front(database_url: str) -> Iterator[Front]:
    running = Front(database_socket(database_url))
    yield running
    running.close()


# ---- the exporter process, and many scrapes at once ---------------------------------------------------------


@dataclass
class Exporter:
    process: subprocess.Popen[bytes]
    port: int
    log_file: Path

    def stop(self) -> str:
        """Stop it (SIGTERM); its log."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        return self.log_file.read_text()


@pytest.fixture
def start_exporter(tmp_path: Path) -> Iterator[Callable[..., Exporter]]:
    started: list[Exporter] = []

    def start(database_url: str, cache_seconds: float) -> Exporter:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        log_file = tmp_path / f"exporter-{len(started)}.log"
        env = {**os.environ, "OUTBOX_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
        command = ["metrics", "serve", "--port", str(port), "--cache-seconds", str(cache_seconds)]
        with log_file.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "outbox.cli", *command], env=env, cwd=ROOT, stdout=log, stderr=log
            )
        exporter = Exporter(process, port, log_file)
        started.append(exporter)
        # listening is enough: a scrape here would take a snapshot
        until(lambda: _listening(port) or process.poll() is not None, what="the exporter to listen")
        assert process.poll() is None, log_file.read_text()
        return exporter

    yield start
    for exporter in started:
        exporter.stop()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    seconds: float


async def get(port: int) -> Answer:
    started = time.monotonic()

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        await writer.drain()
        response = await reader.read()
        writer.close()
        return response

    response = await asyncio.wait_for(exchange(), 30)
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return Answer(status, body.decode(), time.monotonic() - started)


async def get_many(port: int, count: int) -> list[Answer]:
    return list(await asyncio.gather(*(get(port) for _ in range(count))))


def snapshots_reported(answer: Answer) -> float:
    return value(samples(answer.body), "outbox_exporter_snapshots_total")


def scans_of_agent_executor(engine: Engine, database_url: str) -> int:
    """How many times PostgreSQL scanned agent_executor, counting only sessions that have ended (a session
    reports its counts when it ends): wait until no other session is left on the database first."""
    database = make_url(database_url).database
    alone = text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()")

    def others_ended() -> bool:
        with engine.connect() as conn:
            return int(conn.execute(alone, {"db": database}).scalar_one()) == 0

    until(others_ended, what="the exporter's sessions to end")
    with engine.connect() as conn:
        scans = conn.execute(
            text(
                "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
                " WHERE relname = 'agent_executor'"
            )
        ).scalar_one()
    return int(scans)


def log_lines(log: str, level: str) -> list[str]:
    return [line for line in log.splitlines() if f" {level} outbox.metrics " in line]


# ---- (a) one snapshot per cache period, (b) hundreds of concurrent scrapes ---------------------------------


async def test_fifty_cold_scrapes_at_once_take_one_snapshot(
    engine: Engine, database_url: str, reader_url: str, start_exporter: Callable[..., Exporter]
) -> None:
    assert scans_of_agent_executor(engine, database_url) == 0
    exporter = start_exporter(reader_url, cache_seconds=60)
    answers = await get_many(exporter.port, 50)
    assert [a.status for a in answers] == [200] * 50
    assert all(UP in a.body for a in answers), answers[0].body
    assert [snapshots_reported(a) for a in answers] == [1] * 50
    log = exporter.stop()
    assert scans_of_agent_executor(engine, database_url) == 1, log
    print(f"\n50 cold scrapes: 1 snapshot, slowest answer {max(a.seconds for a in answers):.2f} s")


async def test_postgresql_counts_the_snapshots_the_exporter_reports(
    engine: Engine, database_url: str, reader_url: str, start_exporter: Callable[..., Exporter]
) -> None:
    """The database's count is the measure of the test above: one scan of agent_executor per snapshot."""
    exporter = start_exporter(reader_url, cache_seconds=0)
    answers = [await get(exporter.port) for _ in range(3)]
    assert [snapshots_reported(a) for a in answers] == [1, 2, 3]
    exporter.stop()
    assert scans_of_agent_executor(engine, database_url) == 3


async def test_an_application_kind_has_its_backlog_series_from_the_first_scrape(
    engine: Engine, reader_url: str, start_exporter: Callable[..., Exporter]
) -> None:
    """A kind the exporter's process never registers (its rows are all it knows of it), before any attempt."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_action_kind (name, at_most_once, instance_level, workspace_level)"
                " VALUES ('APP_INVOICE', false, true, false)"
            )
        )
    exporter = start_exporter(reader_url, cache_seconds=0)
    found = samples((await get(exporter.port)).body)
    for name in ("outbox_due_actions", "outbox_oldest_due_age_seconds", "outbox_lane_waiting_actions"):
        assert value(found, name, kind="APP_INVOICE") == 0, name
    assert value(found, "outbox_actions", kind="APP_INVOICE", state="ADMITTED") == 0
    assert value(found, "action_ended_total", kind="APP_INVOICE", state="UNCERTAIN", reason="PROVIDER_UNCERTAIN") == 0

    with engine.begin() as conn:  # the application's own SQL: two actions in one lane
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, lane_key, idempotency_key, payload, max_attempts, state)"
                " SELECT 'APP_INVOICE', 'invoice:7', 'invoice:7:' || g, '{}', 5, 'ADMITTED'"
                " FROM generate_series(1, 2) g"
            )
        )
    found = samples((await get(exporter.port)).body)
    assert value(found, "outbox_actions", kind="APP_INVOICE", state="ADMITTED") == 2
    assert value(found, "outbox_due_actions", kind="APP_INVOICE") == 1
    assert value(found, "outbox_lane_waiting_actions", kind="APP_INVOICE") == 1


async def test_three_hundred_scrapes_at_once_all_answer(
    reader_url: str, start_exporter: Callable[..., Exporter]
) -> None:
    exporter = start_exporter(reader_url, cache_seconds=60)
    assert UP in (await get(exporter.port)).body  # the cache is warm
    started = time.monotonic()
    answers = await get_many(exporter.port, 300)
    took = time.monotonic() - started
    assert [a.status for a in answers] == [200] * 300
    assert all(UP in a.body and snapshots_reported(a) == 1 for a in answers)
    assert took < 20, took
    print(f"\n300 warm scrapes: all 200, all up, {took:.2f} s for all, slowest {max(a.seconds for a in answers):.2f} s")


# ---- (c) a host that hangs, (d) a database that goes away and comes back -------------------------------------


async def test_a_host_that_hangs_reads_as_down_within_seconds(
    start_exporter: Callable[..., Exporter],
) -> None:
    hanging = Front(None)
    try:
        exporter = start_exporter(f"postgresql://outbox:hang-s3cret@127.0.0.1:{hanging.port}/outbox", cache_seconds=5)
        answers = await get_many(exporter.port, 20)
        log = exporter.stop()
    finally:
        hanging.close()
    assert all(a.status == 200 and DOWN in a.body for a in answers), answers[0].body
    assert [snapshots_reported(a) for a in answers] == [1] * 20  # they shared the one attempt
    slowest = max(a.seconds for a in answers)
    assert slowest < 4, slowest
    [warning] = log_lines(log, "WARNING")
    assert "ConnectionTimeout" in warning and "hang-s3cret" not in log, log
    print(f"\na host that hangs: up 0 after {slowest:.2f} s; logged: {warning}")


async def test_a_database_that_stops_answering_mid_scrape_reads_as_down_within_the_bound(
    reader_url: str, front: Front, start_exporter: Callable[..., Exporter]
) -> None:
    exporter = start_exporter(through(front, reader_url), cache_seconds=0)
    assert UP in (await get(exporter.port)).body
    front.freeze()  # the pooled connection's next snapshot waits forever for its answer
    stuck = await get(exporter.port)
    retried = await get(exporter.port)  # a new snapshot on a new connection, which hangs in its handshake
    front.forward()
    back = await get(exporter.port)
    log = exporter.stop()
    assert DOWN in stuck.body and stuck.seconds < 7, stuck
    assert DOWN in retried.body and retried.seconds < 7, retried
    assert UP in back.body, back.body
    assert len(log_lines(log, "WARNING")) == 1 and len(log_lines(log, "INFO")) == 2, log
    print(
        f"\na database that stops answering mid-scrape: up 0 after {stuck.seconds:.2f} s, then {retried.seconds:.2f} s"
    )


async def test_a_database_that_goes_away_reads_as_down_and_as_up_when_it_is_back(
    reader_url: str, front: Front, start_exporter: Callable[..., Exporter]
) -> None:
    exporter = start_exporter(through(front, reader_url), cache_seconds=0)
    first = await get(exporter.port)
    front.gone()
    away = [await get(exporter.port) for _ in range(3)]
    front.forward()
    back = [await get(exporter.port) for _ in range(3)]
    log = exporter.stop()
    assert UP in first.body
    assert all(DOWN in a.body for a in away) and max(a.seconds for a in away) < 4, away
    assert all(UP in a.body for a in back), back
    [went] = log_lines(log, "WARNING")
    assert re.search(r"outbox_exporter_up 0: cannot read the outbox database .*: \w+: \S", went), went
    assert "reader-s3cret" not in log
    first_up, came_back = log_lines(log, "INFO")
    assert "outbox_exporter_up 1" in first_up and "outbox_exporter_up 1" in came_back
    assert log.index(first_up) < log.index(went) < log.index(came_back)
    print(f"\na database gone: logged once: {went}\nand back: {came_back}")


# ---- no write at scrape time: the executors and the purge merge the tallies ----------------------------------


def tally_rows(engine: Engine) -> dict[str, list[tuple[int, str]]]:
    with engine.connect() as conn:
        return {
            table: [
                (r.id, r.xmin) for r in conn.execute(text(f"SELECT id, xmin::text AS xmin FROM {table} ORDER BY id"))
            ]
            for table in TALLIES
        }


def counters(found: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[object, float]:
    return {k: v for k, v in found.items() if k[0].endswith(("_total", "_count", "_sum", "_bucket"))}


async def test_a_scrape_writes_nothing(engine: Engine, aengine: AsyncEngine) -> None:
    await mixed_workload(engine, aengine)
    before = tally_rows(engine)
    assert value(samples(scrape(engine)), "outbox_exporter_up") == 1
    assert tally_rows(engine) == before


async def test_the_executors_merges_keep_every_counter_exact(engine: Engine, aengine: AsyncEngine) -> None:
    await mixed_workload(engine, aengine)
    await mixed_workload(engine, aengine)  # every label set twice: rows to fold
    before = samples(scrape(engine))
    rows = {t: len(r) for t, r in tally_rows(engine).items()}
    committer = Committer(aengine)
    assert await committer.merge_tallies()
    merged = {t: len(r) for t, r in tally_rows(engine).items()}
    assert all(merged[t] < rows[t] for t in TALLIES), (rows, merged)
    with engine.connect() as conn:
        for table, labels in (
            ("agent_action_attempt_tally", "kind, result, recorded"),
            ("agent_action_ended_tally", "kind, state, reason"),
            ("agent_action_latency_tally", "kind, metric, le"),
        ):
            folded = f"SELECT count(*) FROM (SELECT 1 FROM {table} GROUP BY {labels} HAVING count(*) > 1) AS f"
            assert conn.execute(text(folded)).scalar_one() == 0
    assert counters(samples(scrape(engine))) == counters(before)
    assert await committer.merge_tallies()  # nothing left to fold: nothing rewritten
    assert {t: len(r) for t, r in tally_rows(engine).items()} == merged


async def test_one_merge_at_a_time_and_group_commits_never_wait_for_it(engine: Engine, aengine: AsyncEngine) -> None:
    await mixed_workload(engine, aengine)
    await mixed_workload(engine, aengine)
    before = samples(scrape(engine))
    with engine.connect() as merging, engine.connect() as other, engine.connect() as committing:
        merging.execute(text("SET lock_timeout = '2s'"))
        other.execute(text("SET lock_timeout = '2s'"))
        committing.execute(text("SET lock_timeout = '2s'"))
        assert store_metrics.merge_tallies(merging)  # holds its rows until it commits
        assert not store_metrics.merge_tallies(other)  # another executor skips, without waiting
        other.rollback()
        # a merge that bypasses the advisory lock (an older exporter) skips the rows the first one holds
        for merge in store_metrics.MERGE_TALLIES:
            other.execute(merge)
        other.commit()
        committing.execute(  # a group commit's tallies, while the merge holds its rows
            text(
                "INSERT INTO agent_action_attempt_tally (kind, result, recorded, n)"
                " VALUES ('TEST_NOOP', 'DONE', true, 5)"
            )
        )
        committing.commit()
        merging.commit()
    after = samples(scrape(engine))
    key = ("action_attempts_total", (("kind", "TEST_NOOP"), ("recorded", "true"), ("result", "DONE")))
    assert after[key] == before[key] + 5
    assert {k: v for k, v in counters(after).items() if k != key} == {
        k: v for k, v in counters(before).items() if k != key
    }


async def test_a_running_committer_merges_on_its_own(
    engine: Engine, aengine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await mixed_workload(engine, aengine)
    await mixed_workload(engine, aengine)
    before = samples(scrape(engine))
    monkeypatch.setattr(committer_module, "TALLY_MERGE_SECONDS", 0.05)  # every 10 s in a running executor
    committer = Committer(aengine)
    committer.start()
    deadline = time.monotonic() + 30
    while committer.merges < 1:  # polling the committer's own count
        assert time.monotonic() < deadline, "no merge within 30 s"
        await asyncio.sleep(0.01)
    await committer.close()
    assert counters(samples(scrape(engine))) == counters(before)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM agent_action_attempt_tally")).scalar_one()
        sets = conn.execute(
            text("SELECT count(*) FROM (SELECT DISTINCT kind, result, recorded FROM agent_action_attempt_tally) s")
        ).scalar_one()
    assert rows == sets


async def test_the_purge_merges_too(engine: Engine, aengine: AsyncEngine) -> None:
    await mixed_workload(engine, aengine)
    await mixed_workload(engine, aengine)
    before = samples(scrape(engine))
    purge_ended(engine)  # nothing old enough to delete; it still merges at its end
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM agent_action_ended_tally")).scalar_one()
        sets = conn.execute(
            text("SELECT count(*) FROM (SELECT DISTINCT kind, state, reason FROM agent_action_ended_tally) s")
        ).scalar_one()
    assert rows == sets
    assert counters(samples(scrape(engine))) == counters(before)
