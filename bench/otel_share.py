"""outbox's own share of an attempt's tracing: outbox.tracing's spans against the same spans made directly with
the SDK, per attempt, in one process.

    python -m bench.otel_share [--calls 20000] [--rounds 7]

One attempt of a webhook, as the executor and the webhook adapter trace it: the attempt span under a stored
context (its attributes, the fence event, the closing attributes) and its `POST` child (the HTTP attributes,
the W3C headers injected, the status). `outbox` runs it through outbox.tracing; the two others write the same
spans with the SDK's own calls, as an application tracing its own code would: `direct` with its context
managers (`extract`, `start_as_current_span`, `add_event`, `inject`, `set_attributes`), `lean` with
`start_span`, `context.attach` and `end`, as outbox.tracing does (no generator per span). Against `lean`,
what remains is outbox's own code: its checks, its attribute dictionaries, the stored context's validation.
The tracer provider has no span processor, so none pays an export (the SDK's share, the same for all). The
stored context is each of: `sampled` (flags 03), `unsampled` (02: a ParentBased sampler records nothing) and
`none` (the attempt is a root). Each round times every (context, path) pair, in an order rotated by round;
printed: the median over the rounds of the CPU time (`time.process_time`) per attempt, its spread, and the
median of the rounds' differences (outbox's share).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

CONTEXTS = {
    "sampled": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"},
    "unsampled": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02"},
    "none": None,
}
HTTP = {"http.request.method": "POST", "server.address": "127.0.0.1", "server.port": 8080, "url.scheme": "http"}
TRACE = {"event_type": "invoice.paid", "endpoint": "billing", "webhook_id": "msg_2BqkW0RlCw2bGbbZfEyYvMjgU5r"}


def _opening(action_id: int) -> dict[str, Any]:
    return {
        "outbox.action.id": action_id,
        "outbox.action.kind": "WEBHOOK",
        "outbox.attempt": 1,
        "outbox.max_attempts": 8,
        "outbox.epoch": 1,
        "outbox.executor.id": "bench-1",
    }


def _closing() -> dict[str, Any]:
    closing: dict[str, Any] = {
        "outbox.result": "DONE",
        "outbox.reason": None,
        "outbox.defer_seconds": None,
        "outbox.recorded": True,
        "outbox.state": "DONE",
        "outbox.stop_reason": "CONFIRMED",
    }
    return closing | {f"outbox.trace.{name}": value for name, value in TRACE.items()}


def outbox_path(stored: dict[str, str] | None) -> Callable[[], None]:
    from outbox import tracing

    def attempt() -> None:
        with tracing.attempt_span("WEBHOOK attempt", 1, stored, _opening(1)) as span:
            tracing.fence_event(None)
            with tracing.provider_call("POST", attributes=HTTP) as call:
                headers = {"webhook-id": TRACE["webhook_id"], **call.headers}
                call.answered(200)
            span.finish(_closing(), None)
        assert headers

    return attempt


def direct_path(stored: dict[str, str] | None) -> Callable[[], None]:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = trace.get_tracer("direct")
    propagator = TraceContextTextMapPropagator()

    def attempt() -> None:
        parent = propagator.extract(stored) if stored is not None else Context()
        with tracer.start_as_current_span(
            "WEBHOOK attempt", context=parent, kind=trace.SpanKind.CONSUMER, attributes=_opening(1)
        ) as span:
            span.add_event("outbox.fence", {"outbox.fence.granted": True})
            with tracer.start_as_current_span("POST", kind=trace.SpanKind.CLIENT, attributes=HTTP) as post:
                headers = {"webhook-id": TRACE["webhook_id"]}
                propagator.inject(headers)
                post.set_attribute("http.response.status_code", 200)
            span.set_attributes({name: value for name, value in _closing().items() if value is not None})
        assert headers

    return attempt


def lean_path(stored: dict[str, str] | None) -> Callable[[], None]:
    from opentelemetry import context, trace
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = trace.get_tracer("lean")
    propagator = TraceContextTextMapPropagator()

    def attempt() -> None:
        parent = propagator.extract(stored) if stored is not None else Context()
        span = tracer.start_span(
            "WEBHOOK attempt", context=parent, kind=trace.SpanKind.CONSUMER, attributes=_opening(1)
        )
        token = context.attach(trace.set_span_in_context(span))
        span.add_event("outbox.fence", {"outbox.fence.granted": True})
        post = tracer.start_span("POST", kind=trace.SpanKind.CLIENT, attributes=HTTP)
        post_token = context.attach(trace.set_span_in_context(post))
        headers = {"webhook-id": TRACE["webhook_id"]}
        propagator.inject(headers)
        post.set_attribute("http.response.status_code", 200)
        context.detach(post_token)
        post.end()
        span.set_attributes({name: value for name, value in _closing().items() if value is not None})
        context.detach(token)
        span.end()
        assert headers

    return attempt


PATHS = {"outbox": outbox_path, "direct": direct_path, "lean": lean_path}


def measure(calls: int, rounds: int, first_round: int = 0) -> dict[str, dict[str, list[float]]]:
    """CPU µs per attempt for every (context, path), `rounds` times, the order rotated by round (from
    `first_round`: a caller running one round per process carries the rotation on). Each timing starts after
    a garbage collection, so that no case pays for the garbage of the one before."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    trace.set_tracer_provider(TracerProvider(sampler=ParentBased(ALWAYS_ON)))
    cases = [(context, path) for context in CONTEXTS for path in PATHS]
    runs = {(context, path): PATHS[path](CONTEXTS[context]) for context, path in cases}
    found: dict[str, dict[str, list[float]]] = {context: {path: [] for path in PATHS} for context in CONTEXTS}
    for run in runs.values():
        for _ in range(calls // 10):  # warm up
            run()
    for round_number in range(first_round, first_round + rounds):
        shift = round_number % len(cases)
        for context, path in cases[shift:] + cases[:shift]:
            run = runs[(context, path)]
            gc.collect()
            started = time.process_time()
            for _ in range(calls):
                run()
            found[context][path].append((time.process_time() - started) / calls * 1e6)
    return found


def table(found: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = [
        "| stored context | outbox.tracing | the SDK, its context managers | the SDK, start_span and attach"
        " | outbox's share against the first | against the second |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for context, paths in found.items():
        cells = [f"{statistics.median(paths[p]):.1f} ({min(paths[p]):.1f} to {max(paths[p]):.1f})" for p in PATHS]
        for baseline in ("direct", "lean"):
            share = differences(paths, baseline)
            cells.append(f"{statistics.median(share):.1f} ({min(share):.1f} to {max(share):.1f})")
        lines.append(f"| {context} | {' | '.join(cells)} |")
    lines.append("(CPU µs per attempt: the median over the rounds, and the spread; a share is the median of the")
    lines.append("rounds' differences)")
    return lines


def differences(paths: dict[str, list[float]], baseline: str) -> list[float]:
    """outbox's share in each round: its time less the baseline's, measured in the same round."""
    return [a - b for a, b in zip(paths["outbox"], paths[baseline], strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    parser.add_argument("--first-round", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    found = measure(args.calls, args.rounds, args.first_round)
    print(json.dumps(found) if args.json else "\n".join(table(found)))


if __name__ == "__main__":
    main()
