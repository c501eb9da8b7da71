"""Webhooks delivered per second by several `outbox run` processes against the bare loop in as many processes.

    python -m bench.webhook_rate [--webhooks 6000] [--processes 2] [--rounds 3]

    every round, in a rotated order, to one local keep-alive receiver (bench.bare_loops receiver):
      outbox  PROCESSES warm `outbox run` (shipped defaults, 64 attempts each) listening on a fresh database;
              N webhooks (bench.pinged, as bench.effects_cost) committed at once ─▶ the commit to the last
              action ended (polled every 20 ms)
      bare    PROCESSES bench.bare_loops webhook processes, N / PROCESSES each, 64 tasks each, all started at
              one wall-clock time after their imports ─▶ the first start to the last end
    ─▶ webhooks per second, median and spread of the rounds, outbox / bare per round; the load average; and the
       CPU per webhook (utime + stime from /proc) of the senders (the executors, or the loops), of the receiver,
       and of the database's backends (those of the bench's database: the executors' and the bench's poll)

Every action must end DONE. The receiver is one process for both: it answers as fast as asyncio parses, and
on a shared machine it takes a core's share of its own, alike for both.
The server is OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL (bench.harness).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from bench import harness
from bench.effects_cost import (
    ADAPTERS,
    SECRET,
    Providers,
    described,
    enqueue,
    load_average,
    local_process,
    process_cpu,
    start_executor,
)


@dataclass
class Run:
    rate: float
    # CPU seconds over the run: the senders, the receiver, the database's backends
    cpu: dict[str, float] = field(default_factory=dict)


def backends_cpu(engine: Engine) -> float:
    """CPU seconds of the server processes now connected to the bench's database."""
    with engine.connect() as conn:
        pids = conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")).scalars()
        return sum(process_cpu(pid) for pid in pids)


def outbox_rate(server: str, count: int, processes: int, to: Providers, receiver_pid: int) -> Run:
    with harness.fresh_database(server, "bench_webhook_rate") as (url, engine):
        executors = [start_executor(url, ADAPTERS["webhook"], to, harness.ROOT) for _ in range(processes)]
        try:
            harness.wait_listening(engine, processes)
            marks: list[float] = []

            def mark() -> None:
                marks.extend(
                    [sum(process_cpu(e.pid) for e in executors), process_cpu(receiver_pid), backends_cpu(engine)]
                )
                marks.append(time.perf_counter())

            enqueue(engine, "webhook", count, to, mark)
            harness.wait_drained(engine)
            seconds = time.perf_counter() - marks[3]
            cpu = {
                "senders": sum(process_cpu(e.pid) for e in executors) - marks[0],
                "receiver": process_cpu(receiver_pid) - marks[1],
                "database": backends_cpu(engine) - marks[2],
            }
            done = harness.ended(engine, "state = 'DONE'")
            if done != count:
                raise RuntimeError(f"{done} of {count} webhooks ended DONE")
        finally:
            harness.stop(executors)
    return Run(count / seconds, cpu)


def bare_rate(count: int, processes: int, to: Providers, receiver_pid: int) -> Run:
    at = time.time() + 3.0  # after every process's imports
    argv = [sys.executable, "-m", "bench.bare_loops", "--at", str(at), "webhook", "--url", to.receiver_url]
    loops = [
        subprocess.Popen(
            [*argv, "--count", str(count // processes)],
            env={**os.environ, "OUTBOX_BENCH_SECRET": SECRET},
            stdout=subprocess.PIPE,
        )
        for _ in range(processes)
    ]
    received = process_cpu(receiver_pid)  # the loops wait for `at`: nothing sent yet
    answers: list[dict[str, float]] = [json.loads(loop.communicate(timeout=600)[0]) for loop in loops]
    received = process_cpu(receiver_pid) - received
    if any(loop.returncode for loop in loops):
        raise RuntimeError("a bare loop failed")
    if min(a["started"] for a in answers) < at - 0.05:
        raise RuntimeError("a bare loop started early")
    span = max(a["ended"] for a in answers) - min(a["started"] for a in answers)
    senders = sum(a["cpu_seconds"] for a in answers)
    return Run(sum(a["count"] for a in answers) / span, {"senders": senders, "receiver": received, "database": 0.0})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webhooks", type=int, default=6000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = harness.server_url()
    names = ["outbox", "bare"]
    runs: dict[str, list[Run]] = {name: [] for name in names}
    with local_process("receiver") as (port, receiver_pid):
        to = Providers(receiver_url=f"http://127.0.0.1:{port}/hooks")
        for r in range(args.rounds):
            figures = []
            for name in names[r % 2 :] + names[: r % 2]:
                load = load_average()
                if name == "outbox":
                    run = outbox_rate(server, args.webhooks, args.processes, to, receiver_pid)
                else:
                    run = bare_rate(args.webhooks, args.processes, to, receiver_pid)
                runs[name].append(run)
                per = ", ".join(f"{part} {seconds / args.webhooks * 1e6:,.0f}" for part, seconds in run.cpu.items())
                figures.append(f"{name} {run.rate:,.0f}/s, CPU µs per webhook: {per} (load {load})")
            print(f"round {r + 1}: " + "; ".join(figures), flush=True)
    print(f"load average at the end: {load_average()}")
    for name, values in runs.items():
        print(f"{name}, {args.processes} processes: webhooks per second {described([v.rate for v in values])}")
        for part in ("senders", "receiver", "database"):
            each = [v.cpu[part] / args.webhooks * 1e6 for v in values]
            print(f"  CPU per webhook, {part}: {described(each)} µs")
        total = [sum(v.cpu.values()) / args.webhooks * 1e6 for v in values]
        print(f"  CPU per webhook, all three: {described(total)} µs")
    ratios = [a.rate / b.rate for a, b in zip(runs["outbox"], runs["bare"], strict=True)]
    print(f"outbox / bare, per round {' '.join(f'{x:.2f}' for x in ratios)}: {described(ratios, 2)}x")


if __name__ == "__main__":
    main()
