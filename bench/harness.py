"""What the benchmarks share: a server, a fresh migrated database per scenario, executor processes.

The server is OUTBOX_BENCH_DATABASE_URL (its maintenance database) when set, otherwise an embedded
PostgreSQL under ./.outbox/bench. Executor processes are `outbox run` with the adapters of
`bench.adapters`, started and stopped by PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from bench import kinds
from demo.postgres import start_embedded_postgres
from outbox import migrate
from outbox.db import psycopg_url
from outbox.testing import install_kinds

ROOT = Path(__file__).resolve().parent.parent


def server_url() -> str:
    configured = os.environ.get("OUTBOX_BENCH_DATABASE_URL")
    if configured:
        return psycopg_url(configured)
    return start_embedded_postgres(ROOT / ".outbox" / "bench")


def server_version(url: str) -> str:
    engine = create_engine(url)
    with engine.connect() as conn:
        version = str(conn.execute(text("SHOW server_version")).scalar_one())
    engine.dispose()
    return version


@contextmanager
def fresh_database(server: str, name: str) -> Iterator[tuple[str, Engine]]:
    """A new database with the schema and the benchmark kinds (bench.kinds); dropped afterwards."""
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        install_kinds(conn, kinds.ALL)
    try:
        yield url, engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def start_executors(
    url: str, count: int, adapters: str, extra_env: dict[str, str] | None = None, *args: str
) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "run", "--adapters", adapters, *args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        process.wait(timeout=90)


def wait_listening(engine: Engine, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            listening = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'"
                )
            ).scalar_one()
        if listening >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {listening} of {count} executors listen after {timeout} s")
        time.sleep(0.05)


def wait_beating(engine: Engine, count: int, timeout: float = 60) -> None:
    """Until `count` executors have a heartbeat row (they have swept once and claim from now on)."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            beating = conn.execute(text("SELECT count(*) FROM agent_executor")).scalar_one()
        if beating >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {beating} of {count} executors beat after {timeout} s")
        time.sleep(0.05)


def ended(engine: Engine, where: str = "true") -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(text(f"SELECT count(*) FROM agent_action WHERE ended_at IS NOT NULL AND {where}")).scalar_one()
        )


def unended(engine: Engine, where: str = "true") -> int:
    """Actions not ended yet, counted from the small partial indexes (never from the ended rows)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    f"SELECT (SELECT count(*) FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED') AND {where})"
                    f" + (SELECT count(*) FROM agent_action WHERE state = 'EXECUTING' AND {where})"
                )
            ).scalar_one()
        )


def wait_drained(engine: Engine, where: str = "true", timeout: float = 600) -> float:
    """Seconds until no action matching `where` is left unended (polled every 20 ms)."""
    start = time.perf_counter()
    while unended(engine, where) > 0:
        if time.perf_counter() - start > timeout:
            raise RuntimeError(f"actions still unended after {timeout} s")
        time.sleep(0.02)
    return time.perf_counter() - start


def bulk_admit(engine: Engine, count: int, lanes: int, *, lane_prefix: str = "lane", start: int = 0) -> None:
    """Insert `count` ADMITTED no-op actions round-robin over `lanes` lanes (the commit wakes the executors)."""
    with engine.begin() as conn:
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
            SELECT 'TEST_NOOP', 1, :prefix || '-' || (g % :lanes), :prefix || '-job-' || g, '{}', 5, 'ADMITTED'
              FROM generate_series(CAST(:start AS bigint), CAST(:start AS bigint) + :count - 1) AS g
        """),
            {"count": count, "lanes": lanes, "prefix": lane_prefix, "start": start},
        )
