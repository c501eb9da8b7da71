"""The executor's own CPU per action, with no effect and with a real one, against the bare loop of the same client.

    python -m bench.effects_cost [--actions 3000] [--rounds 3] [--only ...] [--profile DIR] [--against DIR]

    every round, in a rotated order:
      noop        one `outbox run` (shipped defaults) drains N no-op actions (bench.adapters: fence, then Done)
      webhook     one `outbox run` drains N webhooks (bench.pinged, nothing looked up) to the local receiver
      bare        bench.bare_loops posts the same N signed webhooks to the same receiver at the same concurrency (64)
      email       one `outbox run --adapters examples.accounts:adapters` sends N verify-address emails (one
                  account and lane each, its recipient looked up before every attempt) to a local SMTP sink
      bare-email  bench.bare_loops sends the same N emails with aiosmtplib to the same sink from 64 tasks
      nats        one `outbox run` publishes N workspace alerts (examples.accounts.events, one workspace and lane
                  each, the alert's row looked up before every attempt) to a nats-server's JetStream stream
      bare-nats   bench.bare_loops publishes the same N alerts with nats-py, the same Nats-Msg-Id, 64 tasks
    each: CPU of the sending process (utime + stime from /proc for `outbox run`, from the process itself for a
    bare loop) over the drain alone, per action; the load average beside every round
    ─▶ medians and spread of the rounds, and outbox/bare per effect, per round

The N actions are committed at once into a warm executor (listening, the rows not yet there); its CPU is read
just before that commit and once the last action ended. Every action must end DONE and every provider must have
answered (both checked). The sink (bench.bare_loops smtp-sink), the receiver and the nats-server (demo.nats, the
stream ACCOUNTS) run in processes of their own, started only for the effects asked for. Every NATS run, outbox's
or the bare loop's, publishes alert ids of its own (the stream's duplicate window would otherwise answer a
repeated Nats-Msg-Id as a duplicate, without storing it). `--profile DIR`: instead, one py-spy record (raw,
200 Hz, `--idle` off) of each outbox run, and its top self-time frames (the innermost frame of each sample).

The server is OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL (bench.harness).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench import harness
from outbox.executor import ActionAdapter
from outbox.intake import enqueue_many

SECRET = "whsec_" + base64.b64encode(b"e" * 32).decode()
ENDPOINT = "bench-receiver"
TICKS = os.sysconf("SC_CLK_TCK")
PY_SPY = Path(sys.executable).parent / "py-spy"
SENDER = "outbox@example.com"
ADAPTERS = {
    "noop": "bench.adapters:noop_adapters",
    "webhook": "bench.effects_cost:webhook_adapters",
    "email": "examples.accounts:adapters",
    "nats": "bench.effects_cost:nats_adapters",
}
# each outbox run and bare loop against it: (outbox, bare)
PAIRS = [("webhook", "bare"), ("email", "bare-email"), ("nats", "bare-nats")]
# NATS runs take alert ids of their own: the next run's first is after this run's last
_nats_runs = itertools.count()


@dataclass(frozen=True)
class Providers:
    """Where the effects go: the webhook receiver's URL, the SMTP sink's port, the nats-server's URL."""

    receiver_url: str = ""
    smtp_port: int = 0
    nats_url: str = ""

    def env(self) -> dict[str, str]:
        """What `outbox run` reads to reach them."""
        return {
            "OUTBOX_BENCH_RECEIVER_URL": self.receiver_url,
            "OUTBOX_SMTP_HOST": "127.0.0.1",
            "OUTBOX_SMTP_PORT": str(self.smtp_port or 25),
            "OUTBOX_SMTP_SENDER": SENDER,
            **({"OUTBOX_NATS_URL": self.nats_url} if self.nats_url else {}),
        }


@functools.cache
def _pinged(receiver_url: str) -> object:
    """The benchmark's webhook event, its endpoint the receiver (registered once per process)."""
    from outbox.webhook import register_endpoint, register_webhook_event
    from tests.webhook_events import NumberedHook

    class Pinged(NumberedHook):
        name = "bench.pinged"
        endpoint = ENDPOINT

    register_endpoint(ENDPOINT, receiver_url, secret=SECRET)
    return register_webhook_event(Pinged())


def webhook_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters bench.effects_cost:webhook_adapters`: the endpoint and the event registered."""
    from outbox.webhook import WebhookAdapter

    _pinged(os.environ["OUTBOX_BENCH_RECEIVER_URL"])
    return [WebhookAdapter(engine)]


def nats_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters bench.effects_cost:nats_adapters`: the example's alert event, the NATS_EVENT adapter."""
    from examples.accounts import events
    from outbox.nats import nats_adapters as adapters

    assert events.ALERT_EVENT
    return adapters(engine)


def process_cpu(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextmanager
def local_server(command: str) -> Iterator[int]:
    """`bench.bare_loops <command>` (receiver, smtp-sink) in a process of its own; its port."""
    with local_process(command) as (port, _):
        yield port


@contextmanager
def local_process(command: str) -> Iterator[tuple[int, int]]:
    """`local_server`, with the process's id beside its port."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        process = subprocess.Popen([sys.executable, "-m", "bench.bare_loops", command, "--port-file", port_file])
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"the {command} did not start")
                time.sleep(0.02)
            yield int(port_file.read_text()), process.pid
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


@contextmanager
def receiver() -> Iterator[str]:
    with local_server("receiver") as port:
        yield f"http://127.0.0.1:{port}/hooks"


@contextmanager
def nats_stream() -> Iterator[str]:
    """A nats-server of its own (demo.nats) with the example's stream ACCOUNTS; its URL."""
    from demo.nats import NatsServer
    from examples.accounts.events import STREAM, STREAM_SUBJECTS
    from outbox.nats.settings import NatsConfig
    from outbox.nats.streams import StreamSpec, ensure_stream

    server = NatsServer()
    try:
        asyncio.run(ensure_stream(NatsConfig(servers=(server.url,)), StreamSpec(STREAM, STREAM_SUBJECTS)))
        yield server.url
    finally:
        server.stop()


@contextmanager
def providers(names: list[str]) -> Iterator[Providers]:
    """The local providers the effects in `names` need, each started once for the whole run."""
    with ExitStack() as stack:
        wanted = {name.partition("@")[0] for name in names}
        url = stack.enter_context(receiver()) if wanted & {"webhook", "bare"} else ""
        port = stack.enter_context(local_server("smtp-sink")) if wanted & {"email", "bare-email"} else 0
        nats_url = stack.enter_context(nats_stream()) if wanted & {"nats", "bare-nats"} else ""
        yield Providers(url, port, nats_url)


def enqueue(
    engine: Engine, effect: str, count: int, to: Providers, before_commit: Callable[[], object], start: int = 0
) -> None:
    """`count` actions of `effect` in one transaction (the application's rows they read committed before it);
    `before_commit` runs just before its commit. NATS alert ids are START+1 to START+count."""
    if effect in ("email", "nats"):
        from examples.accounts import schema

        with engine.begin() as conn:
            schema.create(conn)
            conn.execute(
                text(
                    "INSERT INTO app_account SELECT g, 'Account ' || g, 'user' || g || '@example.com', false"
                    " FROM generate_series(1, :n) AS g"
                ),
                {"n": count},
            )
            ids = "generate_series(CAST(:a AS bigint), CAST(:b AS bigint)) AS g"
            for insert in (
                f"INSERT INTO app_workspace SELECT g, 'Workspace ' || g FROM {ids}",
                f"INSERT INTO app_alert SELECT g, g, 'Alert ' || g, '' FROM {ids}",
            ):
                conn.execute(text(insert), {"a": start + 1, "b": start + count})
    with engine.begin() as conn:
        if effect == "webhook":
            pinged = _pinged(to.receiver_url)
            enqueue_many(conn, [pinged.request({"n": n}) for n in range(count)])  # type: ignore[attr-defined]
        elif effect == "email":
            from examples.accounts import notices

            enqueue_many(conn, [notices.VERIFY_ADDRESS.request({"account_id": n + 1}) for n in range(count)])
        elif effect == "nats":
            from examples.accounts import events

            alerts = range(start + 1, start + count + 1)
            enqueue_many(conn, [events.ALERT_EVENT.request({"workspace_id": a, "alert_id": a}) for a in alerts])
        else:
            conn.execute(
                text("""
                INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)
                SELECT 'TEST_NOOP', 1, 'lane-' || g, 'job-' || g, '{}', 5, 'ADMITTED' FROM generate_series(1, :n) g
            """),
                {"n": count},
            )
        before_commit()


def start_executor(url: str, adapters: str, to: Providers, root: Path) -> subprocess.Popen[bytes]:
    """`outbox run` of the tree at `root` (this one, or the checkout it is compared against)."""
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(root), **to.env()}
    argv = [sys.executable, "-m", "outbox.cli", "run", "--adapters", adapters]
    return subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def outbox_run(
    server: str, effect: str, count: int, to: Providers, profile: Path | None, root: Path = harness.ROOT
) -> float:
    """CPU seconds of one `outbox run` (of the tree at `root`) over the drain of `count` actions of `effect`."""
    start = next(_nats_runs) * count if effect == "nats" else 0
    with harness.fresh_database(server, f"bench_effects_{effect}") as (url, engine):
        process = start_executor(url, ADAPTERS[effect], to, root)
        spy: subprocess.Popen[bytes] | None = None
        try:
            harness.wait_listening(engine, 1)
            marks: list[float] = []
            if profile is not None:
                out = profile / f"{effect}.txt"
                spy = subprocess.Popen(
                    [PY_SPY, "record", "--pid", str(process.pid), "--format", "raw", "--rate", "200", "-o", out],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1)  # py-spy attaches
            enqueue(engine, effect, count, to, lambda: marks.append(process_cpu(process.pid)), start)
            harness.wait_drained(engine)
            cpu = process_cpu(process.pid) - marks[0]
            done = harness.ended(engine, "state = 'DONE'")
            if done != count:
                raise RuntimeError(f"{done} of {count} actions ended DONE")
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            harness.stop([process])
    return cpu


def bare_argv(name: str, count: int, to: Providers) -> list[str]:
    """The bare loop `name` (bare, bare-email, bare-nats) for `count` effects to the providers."""
    loop = [sys.executable, "-m", "bench.bare_loops"]
    if name == "bare-email":
        return [*loop, "email", "--port", str(to.smtp_port), "--count", str(count)]
    if name == "bare-nats":
        start = next(_nats_runs) * count
        return [*loop, "nats", "--url", to.nats_url, "--count", str(count), "--start", str(start)]
    return [*loop, "webhook", "--url", to.receiver_url, "--count", str(count)]


def bare_run(name: str, count: int, to: Providers) -> float:
    answer = subprocess.run(
        bare_argv(name, count, to), env={**os.environ, "OUTBOX_BENCH_SECRET": SECRET}, check=True, capture_output=True
    )
    return float(json.loads(answer.stdout)["cpu_seconds"])


def top_frames(raw: Path, limit: int = 15) -> list[tuple[str, float]]:
    """The frames with the most self time in a py-spy raw profile, with their share of the samples."""
    self_time: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        self_time[stack.rsplit(";", 1)[-1]] += int(samples)
    total = sum(self_time.values()) or 1
    return [(frame, n / total) for frame, n in self_time.most_common(limit)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only", nargs="*", default=["noop", "webhook", "bare"], choices=[*ADAPTERS, *(b for _, b in PAIRS)]
    )
    parser.add_argument("--profile", type=Path)
    parser.add_argument(
        "--against", type=Path, help="another checkout of outbox: its `outbox run` alternated as <effect>@base"
    )
    args = parser.parse_args()
    server = harness.server_url()
    with providers(args.only) as to:
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            for effect in [e for e in args.only if e in ADAPTERS]:
                outbox_run(server, effect, args.actions, to, args.profile)
                print(f"{effect} ({load_average()}):")
                for frame, share in top_frames(args.profile / f"{effect}.txt"):
                    print(f"  {share:6.1%}  {frame}")
            return
        names = list(args.only)
        if args.against is not None:
            names += [f"{name}@base" for name in args.only if name in ADAPTERS]
        rounds: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            figures = []
            for name in order:
                load = load_average()
                if name not in ADAPTERS and "@" not in name:
                    cpu = bare_run(name, args.actions, to)
                else:
                    effect, _, base = name.partition("@")
                    root = args.against if base else harness.ROOT
                    cpu = outbox_run(server, effect, args.actions, to, None, root)
                rounds[name].append(cpu / args.actions * 1e6)
                figures.append(f"{name} {rounds[name][-1]:.0f} µs (load {load})")
            print(f"round {r + 1}: " + ", ".join(figures), flush=True)
    for name, values in rounds.items():
        print(f"{name}: CPU per action {described(values)} µs")
    against_base = [(effect, f"{effect}@base") for effect in ADAPTERS]
    for name, reference in [*PAIRS, *against_base]:
        if name in rounds and reference in rounds:
            ratios = [a / b for a, b in zip(rounds[name], rounds[reference], strict=True)]
            each = " ".join(f"{x:.2f}" for x in ratios)
            print(f"{name} / {reference}, per round {each}: {described(ratios, 2)}x")


def described(values: list[float], digits: int = 0) -> str:
    """Median and spread (min-max) of the rounds."""
    return f"median {statistics.median(values):.{digits}f} (spread {min(values):.{digits}f}-{max(values):.{digits}f})"


if __name__ == "__main__":
    main()
