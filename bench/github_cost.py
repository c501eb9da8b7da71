"""The executor's CPU per GitHub comment against a bare loop of the same client making the same calls.

    python -m bench.github_cost [--actions 2000] [--rounds 3] [--pulls 100] [--concurrency 64] [--stub-seconds 0.044]

    the local GitHub API (demo/github_api.py) in a process of its own, no limit that bites
    every round, in a rotated order:
      outbox  one `outbox run` (shipped defaults, --concurrency 64) drains N GITHUB_POST comments
      bare    `python -m bench.github_cost bare`: githubkit's GitHub client, configured as the adapter's (no
              retries, no HTTP cache, one shared connection pool), posts the same N comments (the body and
              its marker) from as many tasks
      bare-httpx  the same from a githubkit client as its documentation shows it (`async with GitHub(...)`: one
              httpx client on httpx's own connection pool), retries and cache off as the adapter's
      stub    one `outbox run` as `outbox`, its client's comment answered after --stub-seconds without a request
              (the local server's answer time to one call alone): the executor's and the adapter's own work,
              without the client's
    each: CPU of the posting process (utime + stime from /proc for `outbox run`, from the process itself for the
    bare loop) over the drain alone, per comment, and the drain's seconds; the load average beside every round
    ─▶ medians and spread of the rounds, outbox/bare and outbox/bare-httpx per comment, and (outbox - stub)/bare:
       the client's cost inside `outbox run` against the same client's in the bare loop

Every action must end DONE on its first attempt (no read-back: it runs only after a lost answer). The N
comments go round `--pulls` pull requests of one repository; the account's rate is 10,000 a second, so the
pace spaces nothing (`OUTBOX_BENCH_GITHUB_RATE=none`: no rate, an open destination, as a test of what the
pace's own statements cost). The database is OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncEngine

from bench import harness
from bench.effects_cost import described, load_average, process_cpu
from outbox.executor import ActionAdapter
from outbox.intake import enqueue_many

TOKEN = "ghp_" + "0" * 36
ACCOUNT = "bench"
REPO = "bench/web"
# the account's rate: --rate, "none" for none (the destination then stays open)
RATE = os.environ.get("OUTBOX_BENCH_GITHUB_RATE", "10000/s")


def rate() -> str | None:
    return None if RATE == "none" else RATE


def github_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters bench.github_cost:github_adapters`: the account at OUTBOX_BENCH_GITHUB_URL."""
    from outbox.github import github_adapters, register_account

    register_account(ACCOUNT, url=os.environ["OUTBOX_BENCH_GITHUB_URL"], rate=rate())
    return github_adapters(engine)


def stub_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters bench.github_cost:stub_adapters`: the adapter with a client that sends nothing."""
    from types import SimpleNamespace

    from githubkit import GitHub

    from outbox.github import GithubAdapter, register_account

    seconds = float(os.environ["OUTBOX_BENCH_STUB_SECONDS"])

    async def create_comment(owner: str, repo: str, number: int, *, body: str) -> SimpleNamespace:
        await asyncio.sleep(seconds)
        url = f"https://github.com/{owner}/{repo}/pull/{number}#issuecomment-1"
        return SimpleNamespace(parsed_data=SimpleNamespace(html_url=url))

    stub = SimpleNamespace(rest=SimpleNamespace(issues=SimpleNamespace(async_create_comment=create_comment)))

    class StubbedAdapter(GithubAdapter):
        def _client(self, account: str) -> GitHub[Any] | None:
            return cast("GitHub[Any]", stub)

    register_account(ACCOUNT, url=os.environ["OUTBOX_BENCH_GITHUB_URL"], rate=rate())
    return [StubbedAdapter(engine)]


@contextmanager
def github_api() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        argv = [sys.executable, "-m", "demo.github_api", "--port", "0", "--port-file", str(port_file)]
        argv += ["--token", TOKEN, "--journal", str(Path(tmp) / "journal"), "--core-limit", "1000000000"]
        process = subprocess.Popen(argv, cwd=harness.ROOT)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the GitHub API did not start")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{port_file.read_text()}"
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def outbox_run(
    server: str, count: int, pulls: int, url: str, concurrency: int, stub_seconds: float | None = None
) -> tuple[float, float]:
    """CPU seconds of one `outbox run` over the drain of `count` comments, and the drain's seconds; with
    `stub_seconds`, its client sends nothing and answers after that long."""
    from outbox.github import comment_request, register_account

    register_account(ACCOUNT, url=url, token=TOKEN, rate=rate())
    requests = [
        comment_request(ACCOUNT, REPO, 1 + n % pulls, f"comment {n}", idempotency_key=f"bench-{n}")
        for n in range(count)
    ]
    with harness.fresh_database(server, "bench_github") as (db_url, engine):
        env = {**os.environ, "OUTBOX_DATABASE_URL": db_url, "OUTBOX_BENCH_GITHUB_URL": url}
        env[f"OUTBOX_GITHUB_TOKEN_{ACCOUNT.upper()}"] = TOKEN
        env["OUTBOX_BENCH_STUB_SECONDS"] = str(stub_seconds)
        factory = "stub_adapters" if stub_seconds is not None else "github_adapters"
        argv = [sys.executable, "-m", "outbox.cli", "run", "--adapters", f"bench.github_cost:{factory}"]
        argv += ["--concurrency", str(concurrency)]
        process = subprocess.Popen(
            argv, env=env, cwd=harness.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            harness.wait_listening(engine, 1)
            with engine.begin() as conn:
                enqueue_many(conn, requests)
                before = process_cpu(process.pid)
            seconds = harness.wait_drained(engine)
            cpu = process_cpu(process.pid) - before
            first = harness.ended(engine, "state = 'DONE' AND attempt = 1")
            if first != count:
                raise RuntimeError(f"{first} of {count} comments ended DONE at their first attempt")
        finally:
            harness.stop([process])
    return cpu, seconds


def bare_run(count: int, pulls: int, url: str, concurrency: int, command: str = "bare") -> tuple[float, float]:
    """CPU seconds of the bare loop (`command`: bare or bare-httpx) over its `count` comments, and its seconds."""
    argv = [sys.executable, "-m", "bench.github_cost", command, "--url", url, "--count", str(count)]
    argv += ["--pulls", str(pulls), "--concurrency", str(concurrency)]
    answer = subprocess.run(argv, cwd=harness.ROOT, capture_output=True)
    if answer.returncode != 0:
        raise RuntimeError(f"the bare loop failed: {answer.stderr.decode()[-2000:]}")
    figures = json.loads(answer.stdout)
    return float(figures["cpu_seconds"]), float(figures["seconds"])


async def post_comments(url: str, count: int, pulls: int, concurrency: int, stock: bool) -> dict[str, float]:
    """The bare loop: the adapter's call (the body with its marker) with a client configured as the adapter's, or
    (`stock`) as githubkit's documentation shows one, on httpx's own pool."""
    from githubkit import GitHub, TokenAuthStrategy

    from outbox.github.accounts import GithubAccount
    from outbox.github.client import Credentials, SharedTransport, github_client
    from outbox.github.posts import marked, marker

    owner, repo = REPO.split("/")
    next_n = iter(range(count))

    async def post_some(github: GitHub[Any]) -> None:
        for n in next_n:
            body = marked(f"comment {n}", marker(f"bench-{n}"))
            made = await github.rest.issues.async_create_comment(owner, repo, 1 + n % pulls, body=body)
            made.parsed_data.html_url  # noqa: B018 (parsed, as the adapter parses it)

    async def timed(github: GitHub[Any]) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
        await asyncio.gather(*(post_some(github) for _ in range(concurrency)))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"cpu_seconds": usage.ru_utime + usage.ru_stime - cpu, "seconds": time.perf_counter() - start}

    if stock:
        auth = TokenAuthStrategy(TOKEN)
        documented = GitHub(auth, base_url=url + "/", auto_retry=False, http_cache=False, timeout=15.0)
        async with documented as github:
            return await timed(github) | {"count": count}
    transport = SharedTransport()
    try:
        adapters = github_client(Credentials(GithubAccount(ACCOUNT, url, secret=TOKEN), TOKEN), transport, 15.0)
        return await timed(adapters) | {"count": count}
    finally:
        await transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["bare", "bare-httpx"])
    parser.add_argument("--actions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pulls", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=64, help="`outbox run --concurrency`, the bare loop's tasks")
    parser.add_argument("--stub-seconds", type=float, default=0.044, help="the stub client's answer time")
    parser.add_argument("--url")
    parser.add_argument("--count", type=int)
    args = parser.parse_args()
    if args.command is not None:
        stock = args.command == "bare-httpx"
        print(json.dumps(asyncio.run(post_comments(args.url, args.count, args.pulls, args.concurrency, stock))))
        return
    server = harness.server_url()
    sides = ["outbox", "bare", "bare-httpx", "stub"]
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    drains: dict[str, list[float]] = {name: [] for name in sides}
    with github_api() as url:
        for r in range(args.rounds):
            order = sides[r % len(sides) :] + sides[: r % len(sides)]
            figures = []
            for name in order:
                load = load_average()
                if name.startswith("bare"):
                    cpu, seconds = bare_run(args.actions, args.pulls, url, args.concurrency, name)
                else:
                    stub = args.stub_seconds if name == "stub" else None
                    cpu, seconds = outbox_run(server, args.actions, args.pulls, url, args.concurrency, stub)
                rounds[name].append(cpu / args.actions * 1e6)
                drains[name].append(seconds)
                figures.append(f"{name} {rounds[name][-1]:.0f} µs in {seconds:.2f} s (load {load})")
            print(f"round {r + 1}: " + ", ".join(figures), flush=True)
    for name, values in rounds.items():
        print(f"{name}: CPU per comment {described(values)} µs, drain {described(drains[name], 2)} s")
    for bare in ("bare", "bare-httpx"):
        ratios = [a / b for a, b in zip(rounds["outbox"], rounds[bare], strict=True)]
        print(f"outbox / {bare}, per round {' '.join(f'{x:.2f}' for x in ratios)}: {described(ratios, 2)}x")
    client = [(a - s) / b for a, s, b in zip(rounds["outbox"], rounds["stub"], rounds["bare"], strict=True)]
    print(f"(outbox - stub) / bare, per round {' '.join(f'{x:.2f}' for x in client)}: {described(client, 2)}x")


if __name__ == "__main__":
    main()
