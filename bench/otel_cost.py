"""What OpenTelemetry costs outbox: enqueue and burn-down without the API, with the API alone, with an SDK;
and outbox's own share of an attempt's tracing, against the CPU of a no-op attempt and of a webhook's.

    python -m bench.otel_cost [--actions 2000] [--rounds 5] [--kinds noop,webhook]

Each round runs, for each kind, the four modes, in a rotated order, each in a process of its own on a fresh
database; then outbox's share (bench.otel_share, a process of its own). The kinds: `noop`, an adapter that
calls nothing; `webhook`, the WebhookAdapter delivering to a local receiver (WebhookReceiver, in this process:
its CPU is not the executor's), a real HTTP request each, signed, answered 200. The modes:

    absent       no OpenTelemetry module can be imported (what a process without the `otel` extra finds)
    noop         the API, no SDK configured: spans are non-recording
    sdk          the SDK: a TracerProvider sampling every trace, a BatchSpanProcessor and the OTLP/HTTP exporter
                 sending to a receiver this process runs (it decodes and counts the spans)
    sdk-sampled  the same, sampling one request in ten (ParentBased(TraceIdRatioBased(0.1))): the attempts of
                 the other nine carry their context on without recording

In each: `--actions` enqueues of one action, one per transaction, each inside a request span of its own
(an instrumented web application's; none in `absent`), then one executor in the process burns them down
(fence and result written, an attempt span each, their export included). Printed per kind and mode: the
median over the rounds of each phase's rate and of the process's CPU time per action (user and system, the
SDK's export thread included; less disturbed by a busy machine than the rates, which wait on the database's
commits), the spread (lowest to highest), the ratio to `absent`, and the load average at each round's start.
Then outbox's share per attempt (its tracing code against the same spans made with the SDK directly), and
that share as a part of each kind's burn-down CPU per action without OpenTelemetry (`absent`) and with the
SDK (`sdk`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench import harness, otel_share

MODES = ("absent", "noop", "sdk", "sdk-sampled")
KINDS = ("noop", "webhook")
WEBHOOK_SECRET = "whsec_" + "YmVuY2gtYmVuY2gtYmVuY2gtYmVuY2gtYmVuY2g="
LANES = 100
# the share of requests the sdk-sampled mode traces (the attempts follow their request's decision)
SAMPLED_RATIO = 0.1

# a process without `opentelemetry-api`: every import of it fails
_NOT_INSTALLED = """
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
"""


class SpanCounter:
    """An OTLP/HTTP receiver that counts the spans it is sent."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans = 0
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                counter.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class WebhookReceiver:
    """A local HTTP receiver that answers 200 to every webhook, in the benchmark's process (its CPU is not the
    executor's); a listen queue deep enough for the executor's 64 concurrent requests."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 256
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def child(mode: str, kind: str, url: str, actions: int, receiver: str | None) -> dict[str, Any]:
    """One measurement, in this process: enqueue `actions` of `kind`, then burn them down."""
    if mode == "absent":
        namespace: dict[str, Any] = {}
        exec(_NOT_INSTALLED, namespace)
        sys.meta_path.insert(0, namespace["NotInstalled"]())
    from outbox.db import async_engine, sync_engine
    from outbox.executor import ActionAdapter, Executor

    enqueue, adapters = _kind(kind, receiver)
    request_span = _request_span(mode)
    engine = sync_engine(url)
    started, cpu_started = time.perf_counter(), time.process_time()
    for i in range(actions):
        with request_span(), engine.begin() as conn:
            enqueue(conn, i)
    enqueue_seconds, enqueue_cpu = time.perf_counter() - started, time.process_time() - cpu_started

    async def burn_down() -> float:
        executor_engine = async_engine(url)
        made: list[ActionAdapter] = adapters(executor_engine)
        executor = Executor(executor_engine, made, listen=False)
        began = time.perf_counter()
        outcomes = await executor.run(until_idle=True)
        seconds = time.perf_counter() - began
        for adapter in made:
            close = getattr(adapter, "aclose", None)
            if close is not None:
                await close()
        await executor_engine.dispose()
        assert outcomes.attempted == actions, outcomes.attempts
        done = sum(n for (_, result, recorded), n in outcomes.attempts.items() if result == "DONE" and recorded)
        assert done == actions, outcomes.attempts
        return seconds

    cpu_started = time.process_time()
    burn_seconds = asyncio.run(burn_down())
    _flush(mode)  # the spans' export is part of the burn-down's cost
    burn_cpu = time.process_time() - cpu_started
    return {
        "enqueue_per_s": actions / enqueue_seconds,
        "burn_per_s": actions / burn_seconds,
        "enqueue_cpu_us": enqueue_cpu / actions * 1e6,
        "burn_cpu_us": burn_cpu / actions * 1e6,
        "opentelemetry_imported": any(m.split(".")[0] == "opentelemetry" for m in sys.modules),
    }


def _kind(kind: str, receiver: str | None) -> tuple[Callable[[Any, int], object], Callable[[Any], list[Any]]]:
    """How to enqueue the i-th action of `kind` in a transaction, and its adapters for an executor's engine."""
    import outbox
    from bench import kinds

    if kind == "noop":
        from bench.adapters import NoopAdapter

        def enqueue_noop(conn: Any, i: int) -> object:
            return outbox.enqueue(
                conn,
                outbox.ActionRequest(
                    kind=kinds.NOOP,
                    lane_key=f"lane-{i % LANES}",
                    idempotency_key=f"job-{i}",
                    payload={},
                    workspace_id=1,
                ),
            )

        return enqueue_noop, lambda engine: [NoopAdapter(kinds.NOOP)]
    from outbox.webhook import WebhookAdapter, enqueue_webhook, register_endpoint, register_webhook_event
    from tests.webhook_events import NumberedHook

    class Pinged(NumberedHook):
        name = "bench.pinged"
        endpoint = "bench"

        def lane_key(self, event: dict[str, Any]) -> str:
            return f"lane-{event['n'] % LANES}"

    assert receiver is not None
    register_endpoint("bench", receiver, secret=WEBHOOK_SECRET)
    pinged = register_webhook_event(Pinged())
    return (lambda conn, i: enqueue_webhook(conn, pinged, {"n": i})), lambda engine: [WebhookAdapter(engine)]


def _request_span(mode: str) -> Callable[[], AbstractContextManager[object]]:
    """A request span for each enqueue, as an instrumented web application has (none without OpenTelemetry)."""
    if mode == "absent":
        return contextlib.nullcontext
    from opentelemetry import trace

    if mode.startswith("sdk"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

        sampler = ParentBased(TraceIdRatioBased(SAMPLED_RATIO)) if mode == "sdk-sampled" else ALWAYS_ON
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("bench")
    return lambda: tracer.start_as_current_span("POST /bench", kind=trace.SpanKind.SERVER)


def _flush(mode: str) -> None:
    if mode.startswith("sdk"):
        from opentelemetry import trace

        trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]


def run_one(server: str, mode: str, kind: str, actions: int, collector: SpanCounter) -> dict[str, Any]:
    receiver = WebhookReceiver() if kind == "webhook" else None
    command = [sys.executable, "-m", "bench.otel_cost", "--child", mode, "--kinds", kind, "--actions", str(actions)]
    try:
        with harness.fresh_database(server, f"bench_otel_{mode}") as (url, _):
            env = {**os.environ, "PYTHONPATH": str(harness.ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
            done = subprocess.run(
                [*command, "--url", url, *(["--receiver", receiver.url] if receiver else [])],
                env=env,
                cwd=harness.ROOT,
                capture_output=True,
                text=True,
                timeout=900,
            )
    finally:
        if receiver is not None:
            receiver.stop()
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {mode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def share_round(calls: int, round_number: int) -> dict[str, dict[str, list[float]]]:
    """One round of bench.otel_share, in a process of its own (it sets its own tracer provider), its order
    rotated by the round's number."""
    command = [sys.executable, "-m", "bench.otel_share", "--calls", str(calls), "--rounds", "1", "--json"]
    done = subprocess.run(
        [*command, "--first-round", str(round_number)],
        env={**os.environ, "PYTHONPATH": str(harness.ROOT)},
        cwd=harness.ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    found: dict[str, dict[str, list[float]]] = json.loads(done.stdout)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(KINDS), help="noop, webhook or both (comma-separated)")
    parser.add_argument("--share-calls", type=int, default=20000, help="attempts timed per round of the share")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--receiver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chosen = [kind for kind in args.kinds.split(",") if kind]
    if not chosen or any(kind not in KINDS for kind in chosen):
        parser.error(f"--kinds: one or more of {', '.join(KINDS)}, not {args.kinds!r}")
    if args.child:
        print(json.dumps(child(args.child, chosen[0], args.url, args.actions, args.receiver)))
        return
    server = harness.server_url()
    collector = SpanCounter()
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(k, m): [] for k in chosen for m in MODES}
    shares: dict[str, dict[str, list[float]]] = {}
    loads = []
    for round_number in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = MODES[round_number % len(MODES) :] + MODES[: round_number % len(MODES)]
        for kind in chosen if round_number % 2 == 0 else chosen[::-1]:
            for mode in order:
                results[(kind, mode)].append(run_one(server, mode, kind, args.actions, collector))
                print(f"round {round_number + 1} {kind} {mode}: {results[(kind, mode)][-1]}", file=sys.stderr)
        for context, paths in share_round(args.share_calls, round_number).items():
            for path, values in paths.items():
                shares.setdefault(context, {}).setdefault(path, []).extend(values)
    print(f"PostgreSQL {harness.server_version(server)}, {args.actions} actions, {args.rounds} rounds alternated")
    print(f"load average (1 min) at each round's start: {', '.join(f'{load:.1f}' for load in loads)}")
    print(f"spans received by the OTLP receiver: {collector.spans}")
    for line in burn_table(chosen, results):
        print(line)
    imported = {f"{k} {m}": any(r["opentelemetry_imported"] for r in results[(k, m)]) for k, m in results}
    print(f"OpenTelemetry imported: {imported}")
    print()
    for line in otel_share.table(shares):
        print(line)
    print()
    share = statistics.median(otel_share.differences(shares["sampled"], "lean"))
    for kind in chosen:
        for mode in ("absent", "sdk"):
            cpu = statistics.median(r["burn_cpu_us"] for r in results[(kind, mode)])
            print(
                f"outbox's share of a sampled attempt (against start_span and attach), {share:.1f} µs, against a"
                f" {kind} attempt's CPU in `{mode}` ({cpu:,.0f} µs): {share / cpu:.1%}"
            )


def burn_table(chosen: list[str], results: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    keys = ("enqueue_per_s", "enqueue_cpu_us", "burn_per_s", "burn_cpu_us")
    lines = [
        "| kind | mode | enqueue/s median (spread) | vs absent | enqueue CPU µs/action | vs absent"
        " | burn-down/s median (spread) | vs absent | burn-down CPU µs/action | vs absent |",
        "| --- | --- |" + " ---: |" * 8,
    ]
    for kind in chosen:
        base = {k: statistics.median(r[k] for r in results[(kind, "absent")]) for k in keys}
        for mode in MODES:
            cells = []
            for key in keys:
                values = [r[key] for r in results[(kind, mode)]]
                median = statistics.median(values)
                cells.append(f"{median:,.0f} ({min(values):,.0f} to {max(values):,.0f})")
                cells.append(f"{median / base[key]:.3f}x")
            lines.append(f"| {kind} | {mode} | {' | '.join(cells)} |")
    return lines


if __name__ == "__main__":
    main()
