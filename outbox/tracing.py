"""OpenTelemetry, when the application uses it: the enqueuing trace carried through the action to the executor's
spans and on to the provider (docs/tracing.md).

    enqueue ──enqueue_context(): the active span's W3C traceparent (and tracestate)──▶ agent_action.trace_context
    claim ──attempt_span(): one span per attempt, named for the kind, a child of that context (else a root),
            current while the adapter runs, linked to the span that was current in the executor (a drain run);
            the application's sampler decides whether it records (a ParentBased one follows the stored flag)
              ├─ fence_event(): an event, granted or refused
              └─ provider_call(): a child span around the provider call when the attempt's records (the
                 webhook's `POST`, with the HTTP conventions: ProviderSpan.answered / failed); the adapter
                 sends its W3C headers on, or the stored context's when nothing records
    result ──AttemptSpan.finish(): result, why (the reason of every result but Done), state, stop reason, the
            adapter's trace fields; UNCERTAIN and FAILED set the span's status to error
    start ──described(): whether tracing is on, and the sampler, for the executor's start line

Every attempt runs through here, so the spans are plain context-manager classes started with the SDK's
`start_span` (no generator per span), the propagator is made once, and nothing is parsed twice:
bench.otel_share measures outbox's share against the same spans written with the SDK directly.

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
from collections.abc import Mapping
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

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


_provider_set = False


def sdk_configured() -> bool:
    """Whether the application has set a tracer provider: with the API alone, spans would record nothing, and
    starting them costs the executor tens of microseconds an attempt. Once set, a provider stays (the API
    refuses to replace it), so a yes is kept."""
    global _provider_set
    if not _provider_set:
        trace = _api()[1]  # asked at every attempt until a provider is set: no import statement each time
        _provider_set = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return _provider_set


def described() -> str:
    """Whether this process's attempts make spans, for an executor's start line: the sampler too, when the
    tracer provider has one (the SDK's)."""
    if not installed():
        return "tracing off (no OpenTelemetry)"
    if not sdk_configured():
        return "tracing off (no tracer provider set; stored trace contexts still reach the providers)"
    from opentelemetry import trace

    sampler = getattr(trace.get_tracer_provider(), "sampler", None)
    describe = getattr(sampler, "get_description", None)
    return f"tracing on (sampler {describe()})" if callable(describe) else "tracing on"


@cache
def _tracer() -> Tracer:
    """outbox's tracer: the application's provider once it sets one (until then, and without one, a proxy)."""
    from opentelemetry import trace

    return trace.get_tracer("outbox")


class AttemptSpan:
    """One attempt's span, current inside `with` (made by `attempt_span`); without OpenTelemetry, or with the
    API alone, it records nothing. A plain class, not a generator: it is entered for every attempt."""

    __slots__ = ("_attributes", "_name", "_span", "_stored", "_token", "action_id")

    def __init__(self, name: str, action_id: int, stored: object, attributes: Mapping[str, AttributeValue]) -> None:
        self._name, self.action_id, self._stored, self._attributes = name, action_id, stored, attributes
        self._span: Span | None = None
        self._token: object = None

    def __enter__(self) -> AttemptSpan:
        if not installed():
            return self
        context, trace = _api()
        stored = self._stored
        if not sdk_configured():
            # nothing would record: no span, only the stored context made current, for the provider call
            if stored is not None:
                self._token = context.attach(_parent_context(self.action_id, stored))
            return self
        executor_span = trace.get_current_span().get_span_context()
        self._span = span = _tracer().start_span(
            self._name,
            context=_parent_context(self.action_id, stored) if stored is not None else _empty(),
            kind=trace.SpanKind.CONSUMER,
            attributes=self._attributes,
            links=(trace.Link(executor_span),) if executor_span.is_valid else (),
        )
        self._token = context.attach(trace.set_span_in_context(span))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _: object) -> None:
        _leave(self._token, self._span, error)

    @property
    def recording(self) -> bool:
        """Whether this span records: its closing attributes are worth making."""
        return self._span is not None and self._span.is_recording()

    def finish(self, attributes: Mapping[str, AttributeValue | None], error: str | None) -> None:
        """The attempt's outcome on its span (None values left out); `error`: the span's status is an error
        with this description."""
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attributes({name: value for name, value in attributes.items() if value is not None})
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))


def attempt_span(name: str, action_id: int, stored: object, attributes: Mapping[str, AttributeValue]) -> AttemptSpan:
    """The span of one attempt, current inside the `with` block: a child of the `stored` trace context, a root
    when none was stored; a malformed one is ignored with a warning. The span current where the block starts
    (a drain run's, say) becomes a link. The sampler of the application's tracer provider decides whether it
    records: a ParentBased one (the SDK's default) follows the stored context's sampled flag."""
    return AttemptSpan(name, action_id, stored, attributes)


def _leave(token: object, span: Span | None, error: BaseException | None) -> None:
    """Leave a span's block: its context detached (`token`, when it was attached), `span` ended (when one was
    started); an exception that left the block makes it an error named by the exception's class only (its
    message may hold anything: a recipient, a URL)."""
    if token is not None:
        _api()[0].detach(token)
    if span is None:
        return
    if isinstance(error, Exception) and span.is_recording():
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", type(error).__qualname__)
        span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
    span.end()


@cache
def _api() -> tuple[ModuleType, ModuleType]:
    """The API's context and trace modules, imported once: an attempt would otherwise import them five times."""
    from opentelemetry import context, trace

    return context, trace


@cache
def _empty() -> Context:
    """The context of an attempt with no stored trace: its span is a root (never a child of the executor's)."""
    from opentelemetry.context import Context

    return Context()


@cache
def _propagator() -> TraceContextTextMapPropagator:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def _parent_context(action_id: int, stored: object) -> Context:
    """The context `stored` names, or an empty one (the attempt a root) when it is not a W3C trace context."""
    empty = _empty()
    try:
        if not (isinstance(stored, dict) and isinstance(stored.get("traceparent"), str)):
            raise ValueError
        if not isinstance(stored.get("tracestate", ""), str):
            stored = {"traceparent": stored["traceparent"]}
        # the propagator gives back the context it was handed when the traceparent is not valid
        parent = _propagator().extract(stored, context=empty)
    except Exception:  # a propagator that chokes on odd text must not fail the attempt
        parent = empty
    if parent is empty:
        log.warning(
            "action %s: its stored trace context is not a W3C trace context (%.120s): the attempt's span starts"
            " a trace of its own",
            action_id,
            json.dumps(stored, default=str),
        )
        return _empty()
    return parent


def fence_event(refusal: str | None) -> None:
    """The fence's answer as an event of the current span (the attempt's)."""
    if "opentelemetry.trace" not in sys.modules:
        return
    span = _api()[1].get_current_span()
    if span.is_recording():
        span.add_event(
            "outbox.fence",
            _GRANTED if refusal is None else {"outbox.fence.granted": False, "outbox.fence.refusal": refusal},
        )


_GRANTED: Mapping[str, AttributeValue] = {"outbox.fence.granted": True}


class ProviderSpan:
    """A provider call's span (made by `provider_call`), current inside `with`: a child of the attempt's span
    when that one records; `headers` are the W3C headers that carry the call's trace on (the attempt's stored
    context when no span records; none without OpenTelemetry or a trace). `answered` and `failed` put the
    outcome of an HTTP call on it, as the HTTP semantic conventions of a client span ask."""

    __slots__ = ("_attributes", "_name", "_producer", "_span", "_token", "headers")

    def __init__(self, name: str, producer: bool, attributes: Mapping[str, AttributeValue] | None) -> None:
        self._name, self._producer, self._attributes = name, producer, attributes
        self._span: Span | None = None
        self._token: object = None
        self.headers: dict[str, str] = {}

    def __enter__(self) -> ProviderSpan:
        if "opentelemetry.trace" not in sys.modules:
            return self
        context, trace = _api()
        if trace.get_current_span().is_recording():
            kind = trace.SpanKind.PRODUCER if self._producer else trace.SpanKind.CLIENT
            self._span = span = _tracer().start_span(self._name, kind=kind, attributes=self._attributes)
            self._token = context.attach(trace.set_span_in_context(span))
        _propagator().inject(self.headers)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _: object) -> None:
        _leave(self._token, self._span, error)

    def answered(self, status: int) -> None:
        """The HTTP response's status; 4xx and 5xx make the span an error (`error.type`: the status)."""
        span = self._span
        if span is None:
            return
        span.set_attribute("http.response.status_code", status)
        if status >= 400:
            self.failed(str(status))

    def failed(self, error_type: str) -> None:
        """The call failed: `error_type` (an exception's class, or an HTTP status) and an error status."""
        span = self._span
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR))


def provider_call(
    name: str, *, producer: bool = False, attributes: Mapping[str, AttributeValue] | None = None
) -> ProviderSpan:
    """A child span of the current one (the attempt's) around the provider call, client or producer."""
    return ProviderSpan(name, producer, attributes)


def context_headers() -> dict[str, str]:
    """The current span's W3C headers (traceparent, tracestate); none without OpenTelemetry or an active trace."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    headers: dict[str, str] = {}
    _propagator().inject(headers)
    return headers
