"""What OpenTelemetry costs outbox: enqueue and burn-down without the API, with the API alone, with an SDK.

    python -m bench.otel_cost [--actions 2000] [--rounds 5]

Each round runs the four modes, in a rotated order, each in a process of its own on a fresh database:

    absent       no OpenTelemetry module can be imported (what a process without the `otel` extra finds)
    noop         the API, no SDK configured: spans are non-recording
    sdk          the SDK: a TracerProvider sampling every trace, a BatchSpanProcessor and the OTLP/HTTP exporter
                 sending to a receiver this process runs (it decodes and counts the spans)
    sdk-sampled  the same, sampling one request in ten (ParentBased(TraceIdRatioBased(0.1))): the attempts of
                 the other nine carry their context on without recording

In each: `--actions` enqueues of one no-op action, one per transaction, each inside a request span of its own
(an instrumented web application's; none in `absent`), then one executor in the process burns them down
(fence and result written, an attempt span each, their export included). Printed per mode: the median over
the rounds of each phase's rate and of the process's CPU time per action (user and system, the SDK's export
thread included; less disturbed by a busy machine than the rates, which wait on the database's commits), the
spread (lowest to highest), the ratio to `absent`, and the load average at each round's start.
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

from bench import harness

MODES = ("absent", "noop", "sdk", "sdk-sampled")
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


def child(mode: str, url: str, actions: int) -> dict[str, Any]:
    """One measurement, in this process: enqueue `actions`, then burn them down."""
    if mode == "absent":
        namespace: dict[str, Any] = {}
        exec(_NOT_INSTALLED, namespace)
        sys.meta_path.insert(0, namespace["NotInstalled"]())
    import outbox
    from bench import kinds
    from bench.adapters import NoopAdapter
    from outbox.db import async_engine, sync_engine
    from outbox.executor import Executor

    request_span = _request_span(mode)
    engine = sync_engine(url)
    started, cpu_started = time.perf_counter(), time.process_time()
    for i in range(actions):
        with request_span(), engine.begin() as conn:
            outbox.enqueue(
                conn,
                outbox.ActionRequest(
                    kind=kinds.NOOP,
                    lane_key=f"lane-{i % LANES}",
                    idempotency_key=f"job-{i}",
                    payload={},
                    workspace_id=1,
                ),
            )
    enqueue_seconds, enqueue_cpu = time.perf_counter() - started, time.process_time() - cpu_started

    async def burn_down() -> float:
        executor_engine = async_engine(url)
        executor = Executor(executor_engine, [NoopAdapter(kinds.NOOP)], listen=False)
        began = time.perf_counter()
        outcomes = await executor.run(until_idle=True)
        seconds = time.perf_counter() - began
        await executor_engine.dispose()
        assert outcomes.attempted == actions, outcomes.attempted
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


def run_one(server: str, mode: str, actions: int, collector: SpanCounter) -> dict[str, Any]:
    with harness.fresh_database(server, f"bench_otel_{mode}") as (url, _):
        env = {**os.environ, "PYTHONPATH": str(harness.ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
        done = subprocess.run(
            [sys.executable, "-m", "bench.otel_cost", "--child", mode, "--url", url, "--actions", str(actions)],
            env=env,
            cwd=harness.ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.url, args.actions)))
        return
    server = harness.server_url()
    collector = SpanCounter()
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    loads = []
    for round_number in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = MODES[round_number % len(MODES) :] + MODES[: round_number % len(MODES)]
        for mode in order:
            results[mode].append(run_one(server, mode, args.actions, collector))
            print(f"round {round_number + 1} {mode}: {results[mode][-1]}", file=sys.stderr)
    print(f"PostgreSQL {harness.server_version(server)}, {args.actions} actions, {args.rounds} rounds alternated")
    print(f"load average (1 min) at each round's start: {', '.join(f'{load:.1f}' for load in loads)}")
    print(f"spans received by the OTLP receiver: {collector.spans}")
    keys = ("enqueue_per_s", "enqueue_cpu_us", "burn_per_s", "burn_cpu_us")
    print(
        "| mode | enqueue/s median (spread) | vs absent | enqueue CPU µs/action | vs absent"
        " | burn-down/s median (spread) | vs absent | burn-down CPU µs/action | vs absent |"
    )
    print("| --- |" + " ---: |" * 8)
    base = {k: statistics.median(r[k] for r in results["absent"]) for k in keys}
    for mode in MODES:
        cells = []
        for key in keys:
            values = [r[key] for r in results[mode]]
            median = statistics.median(values)
            cells.append(f"{median:,.0f} ({min(values):,.0f} to {max(values):,.0f})")
            cells.append(f"{median / base[key]:.3f}x")
        print(f"| {mode} | {' | '.join(cells)} |")
    imported = {mode: any(r["opentelemetry_imported"] for r in results[mode]) for mode in MODES}
    print(f"OpenTelemetry imported: {imported}")


if __name__ == "__main__":
    main()
