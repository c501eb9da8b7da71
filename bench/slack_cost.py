"""The executor's CPU per Slack message against a bare loop of the same client making the same calls.

    python -m bench.slack_cost [--actions 2000] [--rounds 3] [--channels 100] [--concurrency 64]
                               [--stub-seconds 0.044]

    the local Slack Web API (demo/slack_api.py) in a process of its own, no limit that bites
    every round, in a rotated order:
      outbox  one `outbox run` (shipped defaults, --concurrency 64) drains N SLACK_MESSAGE actions
      bare    `python -m bench.slack_cost bare`: slack_sdk's AsyncWebClient (one aiohttp session, no retry
              handler, a logger at WARNING as the adapter's) posts the same N messages (channel, text,
              metadata) from as many tasks
      stub    one `outbox run` as `outbox`, its client's chat.postMessage answered after --stub-seconds without a
              request (the local server's answer time to one call alone): the executor's and the adapter's own
              work, without the client's
    each: CPU of the posting process (utime + stime from /proc for `outbox run`, from the process itself for the
    bare loop) over the drain alone, per message, and the drain's seconds; the load average beside every round
    ─▶ medians and spread of the rounds, outbox/bare per message, and (outbox - stub)/bare: the client's cost
       inside `outbox run` against the same client's in the bare loop

Every action must end DONE on its first attempt (no read-back: it runs only after a lost answer). The N
messages go round `--channels` channels; both sides space nothing (the server allows 1,000 a second per channel).
The database is OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL (bench.harness).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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
from typing import cast

from sqlalchemy.ext.asyncio import AsyncEngine

from bench import harness
from bench.effects_cost import described, load_average, process_cpu
from outbox.executor import ActionAdapter
from outbox.intake import enqueue_many

TOKEN = "xoxb-0000-0000-benchlocaltoken"
WORKSPACE = "bench"


def channels(count: int) -> list[str]:
    return [f"C{n:010d}" for n in range(count)]


def slack_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters bench.slack_cost:slack_adapters`: the workspace at OUTBOX_BENCH_SLACK_URL."""
    from outbox.slack import register_workspace, slack_adapters

    register_workspace(WORKSPACE, base_url=os.environ["OUTBOX_BENCH_SLACK_URL"], channel_rate="1000/s")
    return slack_adapters(engine)


def stub_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters bench.slack_cost:stub_adapters`: the adapter with a client that sends nothing."""
    from slack_sdk.web.async_client import AsyncWebClient

    from outbox.slack import SlackAdapter, register_workspace
    from outbox.slack.workspaces import SlackWorkspace

    class Answer(dict[str, str]):
        status_code = 200

    class StubClient:
        """chat.postMessage answered ok after OUTBOX_BENCH_STUB_SECONDS, without a request."""

        def __init__(self, seconds: float) -> None:
            self.seconds = seconds

        async def chat_postMessage(self, *, channel: str, **_: object) -> Answer:
            await asyncio.sleep(self.seconds)
            return Answer(channel=channel, ts="1700000000.000100")

    class StubbedAdapter(SlackAdapter):
        def client(self, workspace: SlackWorkspace) -> AsyncWebClient:
            return cast(AsyncWebClient, stub)

    stub = StubClient(float(os.environ["OUTBOX_BENCH_STUB_SECONDS"]))
    register_workspace(WORKSPACE, base_url=os.environ["OUTBOX_BENCH_SLACK_URL"], channel_rate="1000/s")
    return [StubbedAdapter(engine)]


@contextmanager
def slack_api(channel_count: int) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        argv = [sys.executable, "-m", "demo.slack_api", "--port", "0", "--port-file", str(port_file)]
        argv += ["--token", TOKEN, "--channels", ",".join(channels(channel_count)), "--channel-rate", "1000"]
        process = subprocess.Popen(argv, cwd=harness.ROOT)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the Slack Web API did not start")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{port_file.read_text()}/api/"
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def outbox_run(
    server: str, count: int, channel_count: int, url: str, concurrency: int, stub_seconds: float | None = None
) -> tuple[float, float]:
    """CPU seconds of one `outbox run` over the drain of `count` messages, and the drain's seconds; with
    `stub_seconds`, its client sends nothing and answers after that long."""
    from outbox.slack import register_workspace, slack_message

    register_workspace(WORKSPACE, token=TOKEN, base_url=url, channel_rate="1000/s")
    names = channels(channel_count)
    requests = [
        slack_message(WORKSPACE, names[n % channel_count], f"message {n}", idempotency_key=f"bench-{n}")
        for n in range(count)
    ]
    with harness.fresh_database(server, "bench_slack") as (db_url, engine):
        env = {**os.environ, "OUTBOX_DATABASE_URL": db_url, "OUTBOX_BENCH_SLACK_URL": url}
        env[f"OUTBOX_SLACK_TOKEN_{WORKSPACE.upper()}"] = TOKEN
        env["OUTBOX_BENCH_STUB_SECONDS"] = str(stub_seconds)
        factory = "stub_adapters" if stub_seconds is not None else "slack_adapters"
        argv = [sys.executable, "-m", "outbox.cli", "run", "--adapters", f"bench.slack_cost:{factory}"]
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
                raise RuntimeError(f"{first} of {count} messages ended DONE at their first attempt")
        finally:
            harness.stop([process])
    return cpu, seconds


def bare_run(count: int, channel_count: int, url: str, concurrency: int) -> tuple[float, float]:
    """CPU seconds of the bare loop over its `count` messages, and its seconds."""
    argv = [sys.executable, "-m", "bench.slack_cost", "bare", "--url", url, "--count", str(count)]
    argv += ["--channels", str(channel_count), "--concurrency", str(concurrency)]
    answer = subprocess.run(argv, cwd=harness.ROOT, capture_output=True)
    if answer.returncode != 0:
        raise RuntimeError(f"the bare loop failed: {answer.stderr.decode()[-2000:]}")
    figures = json.loads(answer.stdout)
    return float(figures["cpu_seconds"]), float(figures["seconds"])


async def post_messages(url: str, count: int, channel_count: int, concurrency: int) -> dict[str, float]:
    """The bare loop: the adapter's calls (channel, text, the metadata marker) with the adapter's client."""
    import aiohttp
    from slack_sdk.web.async_client import AsyncWebClient

    from outbox.slack.readback import message_marker, metadata

    names = channels(channel_count)
    next_n = iter(range(count))
    quiet = logging.getLogger("bench.slack_cost.client")
    quiet.setLevel(logging.WARNING)  # as the adapter's: slack_sdk formats its debug lines under a NOTSET logger
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        client = AsyncWebClient(token=TOKEN, base_url=url, timeout=15, session=session, retry_handlers=[], logger=quiet)

        async def post_some() -> None:
            for n in next_n:
                marker = metadata(message_marker(f"bench-{n}"))
                answer = await client.chat_postMessage(
                    channel=names[n % channel_count], text=f"message {n}", metadata=marker
                )
                if not answer["ok"]:
                    raise RuntimeError(f"Slack answered {answer['error']}")

        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
        await asyncio.gather(*(post_some() for _ in range(concurrency)))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = usage.ru_utime + usage.ru_stime - cpu
        return {"cpu_seconds": used, "seconds": time.perf_counter() - start, "count": count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["bare"])
    parser.add_argument("--actions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--channels", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=64, help="`outbox run --concurrency`, the bare loop's tasks")
    parser.add_argument("--stub-seconds", type=float, default=0.044, help="the stub client's answer time")
    parser.add_argument("--url")
    parser.add_argument("--count", type=int)
    args = parser.parse_args()
    if args.command == "bare":
        print(json.dumps(asyncio.run(post_messages(args.url, args.count, args.channels, args.concurrency))))
        return
    server = harness.server_url()
    sides = ["outbox", "bare", "stub"]
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    drains: dict[str, list[float]] = {name: [] for name in sides}
    with slack_api(args.channels) as url:
        for r in range(args.rounds):
            order = sides[r % 3 :] + sides[: r % 3]
            figures = []
            for name in order:
                load = load_average()
                if name == "bare":
                    cpu, seconds = bare_run(args.actions, args.channels, url, args.concurrency)
                else:
                    stub = args.stub_seconds if name == "stub" else None
                    cpu, seconds = outbox_run(server, args.actions, args.channels, url, args.concurrency, stub)
                rounds[name].append(cpu / args.actions * 1e6)
                drains[name].append(seconds)
                figures.append(f"{name} {rounds[name][-1]:.0f} µs in {seconds:.2f} s (load {load})")
            print(f"round {r + 1}: " + ", ".join(figures), flush=True)
    for name, values in rounds.items():
        print(f"{name}: CPU per message {described(values)} µs, drain {described(drains[name], 2)} s")
    ratios = [a / b for a, b in zip(rounds["outbox"], rounds["bare"], strict=True)]
    print(f"outbox / bare, per round {' '.join(f'{x:.2f}' for x in ratios)}: {described(ratios, 2)}x")
    client = [(a - s) / b for a, s, b in zip(rounds["outbox"], rounds["stub"], rounds["bare"], strict=True)]
    print(f"(outbox - stub) / bare, per round {' '.join(f'{x:.2f}' for x in client)}: {described(client, 2)}x")


if __name__ == "__main__":
    main()
