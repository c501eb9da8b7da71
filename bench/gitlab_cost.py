"""The executor's CPU per GitLab note against a bare loop of the same client making the same calls.

    python -m bench.gitlab_cost [--actions 2000] [--rounds 3] [--merge-requests 100] [--threads 16]

    the local GitLab API (demo/gitlab_api.py) in a process of its own, no limit that bites
    every round, in a rotated order:
      outbox  one `outbox run` (shipped defaults, concurrency 64) drains N GITLAB_POST notes; the adapter runs
              python-gitlab in its pool of 16 threads (--threads)
      bare    `python -m bench.gitlab_cost bare`: the same python-gitlab client (one requests session, every retry
              off) posts the same N notes (merge request, body with its marker) from as many threads
    each: CPU of the posting process (utime + stime from /proc for `outbox run`, from the process itself for the
    bare loop) over the drain alone, per note; the load average beside every round
    ─▶ medians and spread of the rounds, and outbox/bare per note

Every action must end DONE on its first attempt (no read-back: it runs only after a lost answer). The N notes go
round `--merge-requests` merge requests of one project; the host has no configured rate. The database is
OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL (bench.harness).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from bench import harness
from bench.effects_cost import described, load_average, process_cpu
from outbox.executor import ActionAdapter
from outbox.intake import enqueue_many

TOKEN = "glpat-" + "0" * 20
HOST = "bench"
PROJECT = "acme/shop"
# the adapter's pool (outbox.gitlab.adapter.THREADS), unless --threads: the bare loop posts from as many threads
THREADS = 16
THREADS_VARIABLE = "OUTBOX_BENCH_GITLAB_THREADS"


def gitlab_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters bench.gitlab_cost:gitlab_adapters`: the host at OUTBOX_BENCH_GITLAB_URL."""
    from outbox.gitlab import GitlabAdapter, register_host

    register_host(HOST, os.environ["OUTBOX_BENCH_GITLAB_URL"], rate=None)
    return [GitlabAdapter(engine, threads=int(os.environ.get(THREADS_VARIABLE, THREADS)))]


@contextmanager
def gitlab_api() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        argv = [sys.executable, "-m", "demo.gitlab_api", "--port", "0", "--port-file", str(port_file)]
        argv += ["--token", TOKEN, "--journal", os.devnull, "--project", PROJECT]
        process = subprocess.Popen(argv, cwd=harness.ROOT)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the GitLab API did not start")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{port_file.read_text()}"
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def outbox_run(server: str, count: int, merge_requests: int, url: str) -> float:
    """CPU seconds of one `outbox run` over the drain of `count` notes."""
    from outbox.gitlab import note_request, register_host

    register_host(HOST, url, token=TOKEN, rate=None)
    requests = [
        note_request(HOST, PROJECT, f"note {n}", merge_request=n % merge_requests + 1, idempotency_key=f"bench-{n}")
        for n in range(count)
    ]
    with harness.fresh_database(server, "bench_gitlab") as (db_url, engine):
        env = {**os.environ, "OUTBOX_DATABASE_URL": db_url, "OUTBOX_BENCH_GITLAB_URL": url}
        env[f"OUTBOX_GITLAB_TOKEN_{HOST.upper()}"] = TOKEN
        argv = [sys.executable, "-m", "outbox.cli", "run", "--adapters", "bench.gitlab_cost:gitlab_adapters"]
        process = subprocess.Popen(
            argv, env=env, cwd=harness.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            harness.wait_listening(engine, 1)
            with engine.begin() as conn:
                enqueue_many(conn, requests)
                before = process_cpu(process.pid)
            harness.wait_drained(engine)
            cpu = process_cpu(process.pid) - before
            first = harness.ended(engine, "state = 'DONE' AND attempt = 1")
            if first != count:
                raise RuntimeError(f"{first} of {count} notes ended DONE at their first attempt")
        finally:
            harness.stop([process])
    return cpu


def bare_run(count: int, merge_requests: int, url: str) -> float:
    argv = [sys.executable, "-m", "bench.gitlab_cost", "bare", "--url", url, "--count", str(count)]
    argv += ["--merge-requests", str(merge_requests), "--threads", os.environ[THREADS_VARIABLE]]
    answer = subprocess.run(argv, cwd=harness.ROOT, capture_output=True)
    if answer.returncode != 0:
        raise RuntimeError(f"the bare loop failed: {answer.stderr.decode()[-2000:]}")
    return float(json.loads(answer.stdout)["cpu_seconds"])


def post_notes(url: str, count: int, merge_requests: int, threads: int) -> dict[str, float]:
    """The bare loop: the adapter's call (the note's body with its marker) with the adapter's client."""
    from outbox.gitlab.client import client, create_note
    from outbox.gitlab.hosts import GitlabHost
    from outbox.gitlab.posts import marked, marker

    gl = client(GitlabHost(HOST, url), TOKEN, threads)

    def post(n: int) -> None:
        create_note(gl, PROJECT, "merge_request", n % merge_requests + 1, marked(f"note {n}", marker(f"bench-{n}")), 15)

    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(post, range(count)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime - cpu
    return {"cpu_seconds": used, "seconds": time.perf_counter() - start, "count": count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["bare"])
    parser.add_argument("--actions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--merge-requests", type=int, default=100)
    parser.add_argument("--threads", type=int, default=THREADS, help="the adapter's pool and the bare loop's")
    parser.add_argument("--url")
    parser.add_argument("--count", type=int)
    args = parser.parse_args()
    if args.command == "bare":
        print(json.dumps(post_notes(args.url, args.count, args.merge_requests, args.threads)))
        return
    os.environ[THREADS_VARIABLE] = str(args.threads)
    server = harness.server_url()
    rounds: dict[str, list[float]] = {"outbox": [], "bare": []}
    with gitlab_api() as url:
        for r in range(args.rounds):
            order = ["outbox", "bare"] if r % 2 == 0 else ["bare", "outbox"]
            figures = []
            for name in order:
                load = load_average()
                if name == "bare":
                    cpu = bare_run(args.actions, args.merge_requests, url)
                else:
                    cpu = outbox_run(server, args.actions, args.merge_requests, url)
                rounds[name].append(cpu / args.actions * 1e6)
                figures.append(f"{name} {rounds[name][-1]:.0f} µs (load {load})")
            print(f"round {r + 1}: " + ", ".join(figures), flush=True)
    for name, values in rounds.items():
        print(f"{name}: CPU per note {described(values)} µs")
    ratios = [a / b for a, b in zip(rounds["outbox"], rounds["bare"], strict=True)]
    print(f"outbox / bare, per round {' '.join(f'{x:.2f}' for x in ratios)}: {described(ratios, 2)}x")


if __name__ == "__main__":
    main()
