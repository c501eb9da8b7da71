"""What destinations cost the claim when none is held, and what a paused destination's backlog costs the others.

    .venv/bin/python -m bench.claim_destinations [--before COMMIT] [--rounds 5] [--jobs 20000] [--skip ...]
                                                 [--loops N ...] [--markdown FILE]

One private PostgreSQL (`bench.sql_cost`'s, with pg_stat_statements) and two trees of the code: this one
("after"), and `git archive` of --before (the last commit before destinations, revision 0016) in a temporary
folder with this module copied in ("before"). Each tree migrates its own databases and runs its own processes
(`python -m bench.claim_destinations side ...` from that tree); within every round the runs are alternated,
each round in a rotated order, so that the machine's drift hits both alike.

1. loop: `bench.sql_cost`'s `outbox` loop (2 processes: claim 50, fence them, their results, until none) on
   each tree, and on this one with 1 held destination (paused by an operator, no action of its own)
   (`--loops` picks some): jobs/s, the loops' backend CPU µs per action, the claim statement's µs per action
   (pg_stat_statements)
2. executor: 2 `outbox run` processes (defaults, the no-op adapter) drain N actions, each in its own lane,
   on each tree: jobs/s, their backends' CPU µs per action
3. explain: this tree's claim of 50 heads (`CLAIM_READY_HEADS`), each time alternated with the same claim
   without its destination filter, with 0, 1 and 10 rows in agent_destination (held or open) and then with
   one paused destination whose 5,000 due heads come first in `ix_agent_action_ready`, there also the claim
   an executor runs while a destination is held (`CLAIM_OPEN_DESTINATION_HEADS`): EXPLAIN (ANALYZE,
   BUFFERS), rolled back; the median execution time and the buffers each claim touches, and one timed plan
   of each (results.json)
4. fairness: two destinations; one paused by an operator with a backlog of 5,000 due heads (`--backlog`; due a day
   before the others), or no such destination, alternated: the other's burn-down (2 executors, N actions)
   and its pickup (1 executor, 500 actions enqueued one per transaction at 50/s, enqueue commit to adapter
   start: p50, p95), and the plain claim's mean time and buffers during the burn-down (pg_stat_statements)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
from sqlalchemy import Engine, text

from bench import harness, sql_cost
from bench.peers import ROOT, base_env, python
from bench.peers.sql_loop import backend_cpu_seconds
from outbox.db import psycopg_url

WORK = ROOT / ".outbox" / "claim-destinations"
# the last commit on revision 0016, before destinations
BEFORE = "f23148a"
PARKED = "parked"  # the paused destination of the fairness runs
OPEN = "test_noop"  # TEST_NOOP's own destination: the other one
BACKLOG = 5_000  # the paused destination's due heads, unless --backlog says otherwise


# ---- agent_destination's rows and the paused backlog ------------------------------------------------------


def destination_rows(count: int, *, held: bool) -> str:
    """`count` destinations with no action of theirs: held (an operator's pause without end) or open (a pause
    that is over)."""
    until = "'infinity'" if held else "now() - interval '1 h'"
    return f"""
INSERT INTO agent_destination (name, kind, paused_until, paused_by)
SELECT 'other-' || g, 'TEST_NOOP', {until}, 'operator' FROM generate_series(1, {count}) AS g
"""


PAUSE_PARKED = f"""
INSERT INTO agent_destination (name, kind, paused_until, paused_by, pause_reason)
VALUES ('{PARKED}', 'TEST_NOOP', 'infinity', 'operator', 'bench')
"""
# the paused destination's heads, each in its own lane, due a day before the others: first in the ready index
PARKED_BACKLOG = f"""
INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state, destination,
                          due_at)
SELECT 'TEST_NOOP', 1, 'parked-' || g, 'parked-' || g, '{{}}', 5, 'ADMITTED', '{PARKED}', now() - interval '1 day'
  FROM generate_series(1, %s) AS g
"""


def setup(held: int = 0) -> str:
    """The SQL that sets a database up before its actions are loaded and analyzed."""
    return destination_rows(held, held=True) if held else ""


def park_backlog(conn: psycopg.Connection[Any], backlog: int) -> None:
    conn.execute(PAUSE_PARKED)
    conn.execute(PARKED_BACKLOG, (backlog,))
    conn.execute("ANALYZE agent_action")


# ---- the side of one tree: its loops and its executors ------------------------------------------------------


def side_loop(admin: str, postmaster: int, jobs: int, ddl: str, work: Path) -> dict[str, Any]:
    """`bench.sql_cost`'s `outbox` loop on this tree, its database set up by `ddl` first."""
    variant = sql_cost.Variant("outbox", "outbox's schema and executor statements", ddl=ddl)
    return asdict(sql_cost.measure(admin, psutil.Process(postmaster), variant, jobs, 0, work))


def backend_cpu(engine: Engine, pids: dict[int, float]) -> dict[int, float]:
    """CPU seconds of the database's other backends (the executors'), by PID; `pids`: those already read."""
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        ).scalars()
        seen = dict(pids)
        for pid in found:
            try:
                seen[pid] = backend_cpu_seconds(pid)
            except FileNotFoundError:
                continue
    return seen


def side_executor(admin: str, jobs: int, ddl: str) -> dict[str, Any]:
    """2 `outbox run` processes of this tree drain `jobs` actions, each in its own lane (`ddl` run first)."""
    name = f"claim_dest_exec_{os.getpid()}"
    with harness.fresh_database(psycopg_url(admin), name) as (url, engine):
        if ddl:
            with psycopg.connect(sql_cost.database_url(admin, name), autocommit=True) as conn:
                conn.execute(ddl.encode())
        processes = harness.start_executors(url, 2, "bench.adapters:noop_adapters")
        try:
            harness.wait_listening(engine, 2)
            before = backend_cpu(engine, {})
            harness.bulk_admit(engine, jobs, jobs)
            seconds = harness.wait_drained(engine)
            after = backend_cpu(engine, before)
        finally:
            harness.stop(processes)
    cpu = sum(after[pid] - before.get(pid, 0.0) for pid in after)
    return {"rate": jobs / seconds, "backend_us": cpu / jobs * 1e6}


# ---- the runs, alternated between the trees ----------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    label: str
    root: Path

    def side(self, *args: str) -> dict[str, Any]:
        env = {**base_env(), "PYTHONPATH": str(self.root)}
        done = subprocess.run(
            [python(), "-m", "bench.claim_destinations", "side", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.label}: {' '.join(args[:1])} failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


@contextmanager
def before_tree(commit: str) -> Iterator[Tree]:
    """The code of `commit` in a temporary folder, with this module copied in."""
    with tempfile.TemporaryDirectory(prefix="claim-destinations-") as folder:
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        shutil.copy(Path(__file__), Path(folder) / "bench" / Path(__file__).name)
        yield Tree(f"before ({commit})", Path(folder))


def rotated(items: list[Any], rnd: int) -> list[Any]:
    return items[rnd % len(items) :] + items[: rnd % len(items)]


# the loops' settings: the tree, and how this tree's database is set up (`setup`'s arguments)
LOOPS: dict[str, tuple[str, dict[str, Any]]] = {
    "before": ("before", {}),
    "after": ("after", {}),
    "after, 1 held": ("after", {"held": 1}),
}


def loops(admin: str, postmaster: int, trees: dict[str, Tree], args: argparse.Namespace) -> dict[str, list[Any]]:
    runs: dict[str, list[Any]] = defaultdict(list)
    for rnd in range(args.rounds):
        for label in rotated([label for i, label in enumerate(LOOPS) if i in args.loops], rnd):
            tree, settings = LOOPS[label]
            work = WORK / "loops" / re.sub(r"[^a-z0-9]+", "-", label)
            found = trees[tree].side(
                "loop", "--admin", admin, "--postmaster", str(postmaster), "--jobs", str(args.jobs),
                "--ddl", setup(**settings), "--work", str(work),
            )  # fmt: skip
            runs[label].append(found)
            claim = found["statements_us"].get("claim", 0.0)
            print(
                f"  loop {label:56} round {rnd + 1}: {found['rate']:8,.0f} jobs/s, backend"
                f" {found['backend_us']:6.1f} µs, claim {claim:5.1f} µs per action",
                flush=True,
            )
    return dict(runs)


EXECUTORS: dict[str, tuple[str, dict[str, Any]]] = {
    "before": ("before", {}),
    "after": ("after", {}),
}


def executors(admin: str, trees: dict[str, Tree], args: argparse.Namespace) -> dict[str, list[Any]]:
    runs: dict[str, list[Any]] = defaultdict(list)
    for rnd in range(args.rounds):
        for label in rotated(list(EXECUTORS), rnd):
            tree, settings = EXECUTORS[label]
            found = trees[tree].side("executor", "--admin", admin, "--jobs", str(args.jobs), "--ddl", setup(**settings))
            runs[label].append(found)
            print(
                f"  executor {label:38} round {rnd + 1}: {found['rate']:8,.0f} jobs/s,"
                f" backend {found['backend_us']:6.1f} µs per action",
                flush=True,
            )
    return dict(runs)


# ---- explain ------------------------------------------------------------------------------------------------


def claim_statements() -> tuple[str, str]:
    """This tree's plain claim; and the same without its destination filter (the claim before destinations)."""
    from outbox.store.executor import CLAIM_READY_HEADS

    claim = str(CLAIM_READY_HEADS.text)
    line = re.search(r"\n *AND coalesce\(a\.destination <> ALL [^\n]*", claim)
    if line is None:
        raise RuntimeError("the claim changed: no destination filter found")
    return claim, claim.replace(line.group(0), "")


def explain(conn: psycopg.Connection[Any], sql: str, *, timing: bool = False) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim of 50 heads, rolled back."""
    params = {"limit": 50, "lease_seconds": 300, "kinds": ["TEST_NOOP"]}
    query = sql.replace(":limit", "%(limit)s").replace(":lease_seconds", "%(lease_seconds)s")
    query = query.replace(":kinds", "%(kinds)s")
    option = "" if timing else ", TIMING OFF"
    with conn.transaction(force_rollback=True):
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS{option}, FORMAT JSON) {query}".encode(), params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]
    return plan


def shared_buffers(plan: dict[str, Any]) -> int:
    top = plan["Plan"]
    return int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))


@dataclass
class Explained:
    ms: list[float]  # the claim with its filter
    buffers: list[int]
    base_ms: list[float]  # the claim without it, alternated with the above
    base_buffers: list[int]
    plan: str  # one plan, timed


def explains(admin: str, args: argparse.Namespace) -> dict[str, Explained]:
    """The claim with its filter, alternated with the claim without it, on `args.jobs` heads as the rows in
    agent_destination change, then with a paused destination's backlog first in the ready index. Each setting
    starts from a vacuumed table: the rolled-back claims leave dead rows, and a larger table makes the
    sequential scan dearer to the planner."""
    current, without = claim_statements()
    from outbox.store.executor import CLAIM_OPEN_DESTINATION_HEADS

    by_destination = str(CLAIM_OPEN_DESTINATION_HEADS.text)
    parked = f"1 paused destination, its {args.backlog:,} due heads first"
    parked_by_destination = "the same, destination by destination (what an executor runs while one is held)"
    settings = [
        ("0 rows", ""),
        ("1 held row", destination_rows(1, held=True)),
        ("10 open rows", destination_rows(10, held=False)),
        ("10 held rows", destination_rows(10, held=True)),
    ]
    found: dict[str, Explained] = {}
    with harness.fresh_database(psycopg_url(admin), "claim_dest_explain") as (_, engine):
        harness.bulk_admit(engine, args.jobs, args.jobs)
        with psycopg.connect(sql_cost.database_url(admin, "claim_dest_explain"), autocommit=True) as conn:
            for label, rows in [*settings, (parked, ""), (parked_by_destination, "")]:
                if label != parked_by_destination:  # the same backlog as the setting before
                    conn.execute("DELETE FROM agent_destination")
                if label == parked:
                    park_backlog(conn, args.backlog)
                elif rows:
                    conn.execute(rows.encode())
                conn.execute("VACUUM ANALYZE agent_action")
                claim = by_destination if label == parked_by_destination else current
                found[label] = timed(conn, claim, without, args.explains)
                print(
                    f"  explain {label:50}: {med(found[label].ms):6.3f} ms, {med(found[label].buffers):6.0f}"
                    f" buffers; without the filter {med(found[label].base_ms):6.3f} ms,"
                    f" {med(found[label].base_buffers):6.0f} buffers",
                    flush=True,
                )
    return found


def timed(conn: psycopg.Connection[Any], with_filter: str, without: str, count: int) -> Explained:
    """The claim with and without its filter, `count` times each, alternated; and one plan with its timing."""
    found = Explained([], [], [], [], json.dumps(explain(conn, with_filter, timing=True), indent=1))
    for i in range(count):
        for sql in (with_filter, without) if i % 2 else (without, with_filter):
            plan = explain(conn, sql)
            if sql is with_filter:
                found.ms.append(float(plan["Execution Time"]))
                found.buffers.append(shared_buffers(plan))
            else:
                found.base_ms.append(float(plan["Execution Time"]))
                found.base_buffers.append(shared_buffers(plan))
    return found


# ---- fairness ------------------------------------------------------------------------------------------------

# the plain claim's calls, time and buffers (pg_stat_statements; its text, in both of its forms, names
# `destination <> ALL`)
CLAIM_STATS = """
SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8,
       coalesce(sum(shared_blks_hit + shared_blks_read), 0)::float8
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) AND query LIKE '%%destination <> ALL%%'
"""


@dataclass
class Fair:
    rate: float
    p50: float
    p95: float
    claims: int
    claim_ms: float
    claim_buffers: float


def prepare_fair(admin: str, name: str, parked: int) -> None:
    """`parked`: the paused destination's due heads (0: no paused destination)."""
    if parked:
        with psycopg.connect(sql_cost.database_url(admin, name), autocommit=True) as conn:
            park_backlog(conn, parked)


def burn_down(admin: str, name: str, jobs: int, parked: int) -> tuple[float, int, float, float]:
    """(jobs/s of the open destination, plain claims, their mean ms, their mean buffers)."""
    with harness.fresh_database(psycopg_url(admin), name) as (url, engine):
        prepare_fair(admin, name, parked)
        processes = harness.start_executors(url, 2, "bench.adapters:noop_adapters")
        try:
            harness.wait_listening(engine, 2)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            harness.bulk_admit(engine, jobs, jobs)
            seconds = harness.wait_drained(engine, f"destination = '{OPEN}'")
            with psycopg.connect(admin, autocommit=True) as conn:
                calls, total_ms, buffers = conn.execute(CLAIM_STATS, (name,)).fetchone() or (0, 0.0, 0)
        finally:
            harness.stop(processes)
    return jobs / seconds, int(calls), float(total_ms) / max(1, calls), float(buffers) / max(1, calls)


def pickup(admin: str, name: str, parked: int, count: int = 500, rate: float = 50.0) -> list[float]:
    """Pickup delays (ms) of `count` actions enqueued one per transaction at `rate`, one idle executor."""
    import outbox
    from bench import kinds

    with harness.fresh_database(psycopg_url(admin), name) as (url, engine), tempfile.TemporaryDirectory() as tmp:
        prepare_fair(admin, name, parked)
        pickups = Path(tmp) / "pickups"
        env = {"OUTBOX_BENCH_PICKUP_FILE": str(pickups)}
        processes = harness.start_executors(
            url, 1, "bench.adapters:pickup_adapters", env, "--lease-seconds", "300"
        )  # fmt: skip
        committed: dict[int, int] = {}
        try:
            harness.wait_listening(engine, 1)
            for i in range(count):
                request = outbox.ActionRequest(
                    kind=kinds.NOOP, workspace_id=1, lane_key=f"p-{i}", idempotency_key=f"p-{i}", payload={}
                )
                with engine.begin() as conn:
                    action = outbox.enqueue(conn, request)
                committed[action.id] = time.time_ns()
                time.sleep(1 / rate)
            harness.wait_drained(engine, f"destination = '{OPEN}'")
        finally:
            harness.stop(processes)
        started = {int(a): int(t) for a, t in (line.split() for line in pickups.read_text().splitlines())}
    return sorted((started[i] - committed[i]) / 1e6 for i in committed)


def fairness(admin: str, args: argparse.Namespace) -> dict[str, list[Fair]]:
    cases = {"no paused destination": 0, f"1 paused, {args.backlog:,} due heads first": args.backlog}
    runs: dict[str, list[Fair]] = defaultdict(list)
    for rnd in range(args.rounds):
        for label in rotated(list(cases), rnd):
            parked = cases[label]
            rate, claims, claim_ms, buffers = burn_down(admin, "claim_dest_fair", args.jobs, parked)
            delays = pickup(admin, "claim_dest_pickup", parked)
            q = statistics.quantiles(delays, n=100)
            runs[label].append(Fair(rate, q[49], q[94], claims, claim_ms, buffers))
            print(
                f"  fairness {label:65} round {rnd + 1}: {rate:8,.0f} jobs/s ({claims} claims, {claim_ms:.3f} ms,"
                f" {buffers:.0f} buffers each), pickup p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms",
                flush=True,
            )
    return dict(runs)


# ---- the report ---------------------------------------------------------------------------------------------


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[8]


def spread(values: list[float]) -> str:
    """The rounds, and their range as a share of the median."""
    m = med(values)
    return f"{' / '.join(f'{v:,.1f}' for v in values)} (±{(max(values) - min(values)) / 2 / m:.0%})"


def paired(runs: dict[str, list[Any]], label: str, key: str) -> list[float]:
    """`label` over `before`, round by round (the two ran back to back)."""
    return [a[key] / b[key] for a, b in zip(runs[label], runs["before"], strict=True)]


def report(results: dict[str, Any], loads: list[str]) -> str:
    lines: list[str] = []
    loop_runs = results.get("loops", {})
    if loop_runs:
        lines += [
            "| SQL-only loop | jobs/s median | rounds | backend CPU µs per action median | rounds"
            " | per round vs before (median) | claim µs per action (pg_stat_statements) |",
            "| --- | ---: | --- | ---: | --- | ---: | ---: |",
        ]
        for label, rs in loop_runs.items():
            rates = [r["rate"] for r in rs]
            cpus = [r["backend_us"] for r in rs]
            ratio = "" if label == "before" else f"{med(paired(loop_runs, label, 'backend_us')):.3f}x"
            claim = med([r["statements_us"].get("claim", 0.0) for r in rs])
            lines.append(
                f"| {label} | {med(rates):,.0f} | {spread(rates)} | {med(cpus):.1f} | {spread(cpus)} | {ratio}"
                f" | {claim:.1f} |"
            )
    exec_runs = results.get("executors", {})
    if exec_runs:
        lines += [
            "",
            "| 2 executors, burn-down | jobs/s median | rounds | per round vs before | backend CPU µs per action"
            " | rounds | per round vs before |",
            "| --- | ---: | --- | ---: | ---: | --- | ---: |",
        ]
        for label, rs in exec_runs.items():
            rates = [r["rate"] for r in rs]
            cpus = [r["backend_us"] for r in rs]
            vs_rate = "" if label == "before" else f"{med(paired(exec_runs, label, 'rate')):.3f}x"
            vs_cpu = "" if label == "before" else f"{med(paired(exec_runs, label, 'backend_us')):.3f}x"
            lines.append(
                f"| {label} | {med(rates):,.0f} | {spread(rates)} | {vs_rate} | {med(cpus):.1f} | {spread(cpus)}"
                f" | {vs_cpu} |"
            )
    explained = results.get("explains", {})
    if explained:
        lines += [
            "",
            "| agent_destination | claim of 50 heads: execution ms median (p90) | shared buffers"
            " | without the filter, alternated: ms median (p90) | buffers | added ms (median of pairs) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for label, e in explained.items():
            added = med([a - b for a, b in zip(e["ms"], e["base_ms"], strict=True)])
            lines.append(
                f"| {label} | {med(e['ms']):.3f} ({p90(e['ms']):.3f}) | {med(e['buffers']):.0f}"
                f" | {med(e['base_ms']):.3f} ({p90(e['base_ms']):.3f}) | {med(e['base_buffers']):.0f} | {added:+.3f} |"
            )
    fair = results.get("fairness", {})
    if fair:
        lines += [
            "",
            "| the open destination | burn-down jobs/s median (rounds) | pickup p50 ms (rounds) | pickup p95 ms"
            " (rounds) | plain claim during the burn-down: mean ms, buffers |",
            "| --- | --- | --- | --- | --- |",
        ]
        for label, fs in fair.items():
            rates = [f["rate"] for f in fs]
            p50 = [f["p50"] for f in fs]
            p95 = [f["p95"] for f in fs]
            lines.append(
                f"| {label} | {med(rates):,.0f} ({spread(rates)}) | {med(p50):.1f} ({spread(p50)})"
                f" | {med(p95):.1f} ({spread(p95)}) | {med([f['claim_ms'] for f in fs]):.3f},"
                f" {med([f['claim_buffers'] for f in fs]):.0f} |"
            )
    lines += ["", "load average (1, 5, 15 min): " + "; ".join(loads)]
    return "\n".join(lines)


# ---- main ---------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    admin, handle = sql_cost.server(WORK / "pg")
    with psycopg.connect(admin, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        postmaster = psutil.Process(conn.info.backend_pid).ppid()
    print(f"PostgreSQL {version[0] if version else '?'}, {os.cpu_count()} cores, before = {args.before}", flush=True)
    loads: list[str] = []

    def note_load(moment: str) -> None:
        loads.append(f"{moment} {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        print(f"  load average {loads[-1]}", flush=True)

    note_load("at the start")
    results: dict[str, Any] = {"before": args.before, "args": sys.argv[1:]}
    try:
        with before_tree(args.before) as before:
            trees = {"before": before, "after": Tree("after", ROOT)}
            if "loop" not in args.skip:
                results["loops"] = loops(admin, postmaster, trees, args)
                note_load("after the loops")
            if "executor" not in args.skip:
                results["executors"] = executors(admin, trees, args)
                note_load("after the executors")
        if "explain" not in args.skip:
            results["explains"] = {k: asdict(v) for k, v in explains(admin, args).items()}
            note_load("after the explains")
        if "fairness" not in args.skip:
            results["fairness"] = {k: [asdict(f) for f in v] for k, v in fairness(admin, args).items()}
            note_load("after the fairness runs")
    finally:
        handle.cleanup()
    results["load"] = loads
    (WORK / "results.json").write_text(json.dumps(results, indent=1))
    table = report(results, loads)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


def side(args: argparse.Namespace) -> None:
    if args.what == "loop":
        found = side_loop(args.admin, args.postmaster, args.jobs, args.ddl, args.work)
    else:
        found = side_executor(args.admin, args.jobs, args.ddl)
    print(json.dumps(found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    measure_cmd = sub.add_parser("run", help="measure (the default)")
    for p in (parser, measure_cmd):
        p.add_argument("--before", default=BEFORE, help="the commit of the code before destinations")
        p.add_argument("--rounds", type=int, default=5)
        p.add_argument("--jobs", type=int, default=20_000)
        p.add_argument("--explains", type=int, default=300, help="claims timed per explain setting")
        p.add_argument("--backlog", type=int, default=BACKLOG, help="the paused destination's due heads")
        p.add_argument("--skip", nargs="*", default=[], choices=["loop", "executor", "explain", "fairness"])
        p.add_argument(
            "--loops",
            nargs="*",
            type=int,
            default=list(range(len(LOOPS))),
            help="the loop settings to run, by number: " + "; ".join(f"{i} {k}" for i, k in enumerate(LOOPS)),
        )
        p.add_argument("--markdown", type=Path, default=None)
    one = sub.add_parser("side", help="one measurement on the tree this runs from (the run starts them)")
    one.add_argument("what", choices=["loop", "executor"])
    one.add_argument("--admin", required=True)
    one.add_argument("--postmaster", type=int, default=0)
    one.add_argument("--jobs", type=int, required=True)
    one.add_argument("--ddl", default="", help="SQL that sets the database up first")
    one.add_argument("--work", type=Path, default=WORK)
    args = parser.parse_args()
    if args.command == "side":
        side(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
