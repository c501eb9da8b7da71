"""OpenTelemetry, when the application uses it: the enqueuing trace carried through the action to the executor's
spans and on to the provider (docs/tracing.md).

    enqueue ──enqueue_context(): the active span's W3C traceparent (and tracestate)──▶ agent_action.trace_context
    claim ──attempt_span(): one span per attempt, named for the kind, a child of that context (else a root),
            current while the adapter runs, linked to the span that was current in the executor (a drain run)
              ├─ fence_event(): an event, granted or refused
              └─ provider_call(): a child span around the provider call; the adapter sends its W3C headers on
    result ──AttemptSpan.finish(): result, state, stop reason, the adapter's trace fields; UNCERTAIN and FAILED
            set the span's status to error

Only `opentelemetry-api` is used, and only when it is installed (`outbox[otel]`): without it nothing here
imports it and every function does nothing. The SDK, its exporter and where spans go are the application's
choice; with the API alone (no tracer provider set) no span is started, yet a stored context still reaches the
provider. Only the
W3C trace context is carried (never baggage, which may hold anything); no span holds a payload, a recipient,
a lane key (it may name a person) or a secret.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("outbox.tracing")

AttributeValue = str | bool | int | float
# W3C Trace Context: a tracestate longer than this is not stored (the traceparent still is); the column's
# check (revision 0016) bounds the JSON text of both
TRACESTATE_LIMIT = 512
_HEADERS = ("traceparent", "tracestate")


@cache
def installed() -> bool:
    """Whether the OpenTelemetry API can be imported (the `otel` extra); tried once."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def enqueue_context() -> str | None:
    """The active span's W3C trace context as the JSON text `trace_context` stores; None when no valid span is
    active. An application that never imported OpenTelemetry has none, so nothing is imported to find out."""
    if "opentelemetry.context" not in sys.modules or not installed():
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    if len(carrier.get("tracestate", "")) > TRACESTATE_LIMIT:
        del carrier["tracestate"]
    return json.dumps(carrier) if "traceparent" in carrier else None


def sdk_configured() -> bool:
    """Whether the application has set a tracer provider: with the API alone, spans would record nothing, and
    starting them costs the executor tens of microseconds an attempt."""
    from opentelemetry import trace

    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@cache
def _tracer() -> Tracer:
    """outbox's tracer: the application's provider once it sets one (until then, and without one, a proxy)."""
    from opentelemetry import trace

    return trace.get_tracer("outbox")


class AttemptSpan:
    """One attempt's span; without OpenTelemetry, or with the API alone, it records nothing."""

    def __init__(self, span: Span | None) -> None:
        self._span = span

    def finish(self, attributes: Mapping[str, AttributeValue | None], error: str | None) -> None:
        """The attempt's outcome on its span (None values left out); `error`: the span's status is an error
        with this description."""
        if self._span is None or not self._span.is_recording():
            return
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attributes({name: value for name, value in attributes.items() if value is not None})
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))


_NO_SPAN = AttemptSpan(None)


@contextmanager
def attempt_span(
    name: str, action_id: int, stored: object, attributes: Mapping[str, AttributeValue]
) -> Iterator[AttemptSpan]:
    """The span of one attempt, current inside the block: a child of the `stored` trace context, a root when
    none was stored; a malformed one is ignored with a warning. The span current here (a drain run's, say)
    becomes a link."""
    if not installed():
        yield _NO_SPAN
        return
    from opentelemetry import context, trace
    from opentelemetry.context import Context

    if not sdk_configured():
        # nothing would record: no span, only the stored context made current, for the provider call
        token = context.attach(_parent_context(action_id, stored)) if stored is not None else None
        try:
            yield _NO_SPAN
        finally:
            if token is not None:
                context.detach(token)
        return
    executor_span = trace.get_current_span().get_span_context()
    links = [trace.Link(executor_span)] if executor_span.is_valid else []
    parent = _parent_context(action_id, stored) if stored is not None else Context()
    with _tracer().start_as_current_span(
        name, context=parent, kind=trace.SpanKind.CONSUMER, attributes=dict(attributes), links=links
    ) as span:
        yield AttemptSpan(span)


def _parent_context(action_id: int, stored: object) -> Context:
    """The context `stored` names, or an empty one (the attempt a root) when it is not a W3C trace context."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = stored if isinstance(stored, dict) else {}
    headers = {name: value for name, value in carrier.items() if name in _HEADERS and isinstance(value, str)}
    try:
        parent = TraceContextTextMapPropagator().extract(headers, context=Context())
    except Exception:  # a propagator that chokes on odd text must not fail the attempt
        parent = Context()
    if not trace.get_current_span(parent).get_span_context().is_valid:
        log.warning(
            "action %s: its stored trace context is not a W3C trace context (%.120s): the attempt's span starts"
            " a trace of its own",
            action_id,
            json.dumps(stored, default=str),
        )
        return Context()
    return parent


def fence_event(refusal: str | None) -> None:
    """The fence's answer as an event of the current span (the attempt's)."""
    if "opentelemetry.trace" not in sys.modules:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        granted: dict[str, AttributeValue] = {"outbox.fence.granted": refusal is None}
        span.add_event("outbox.fence", granted if refusal is None else {**granted, "outbox.fence.refusal": refusal})


@contextmanager
def provider_call(name: str, *, producer: bool = False) -> Iterator[dict[str, str]]:
    """A child span of the current one (the attempt's) around the provider call; yields the W3C headers
    (traceparent, tracestate) that carry it to the provider: none without OpenTelemetry or an active trace."""
    if not installed():
        yield {}
        return
    from opentelemetry import trace

    if not sdk_configured():
        yield context_headers()  # the attempt's stored context, as it was enqueued
        return
    kind = trace.SpanKind.PRODUCER if producer else trace.SpanKind.CLIENT
    with _tracer().start_as_current_span(name, kind=kind):
        yield context_headers()


def context_headers() -> dict[str, str]:
    """The current span's W3C headers (traceparent, tracestate); none without OpenTelemetry or an active trace."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    headers: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(headers)
    return headers
