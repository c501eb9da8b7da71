"""One trace from the request to the provider, through the outbox: OpenTelemetry's SDK exporting over OTLP/HTTP.

    FastAPI request (a server span) ─ enqueue a webhook and an event ─▶ agent_action.trace_context
    drain (a real executor) ─▶ attempt spans ─▶ webhook receiver (continues the trace from `traceparent`)
                                            └─▶ nats-server ─▶ a JetStream consumer reads the headers
    every span ─ OTLPSpanExporter ─▶ Collector, an OTLP/HTTP receiver of the test's own (protobuf decoded)

The tracer provider is the one docs/tracing.md configures (its example `tracing-setup`), set once for this
process; each test finds its own spans by trace or action id.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import nats
import psycopg
import pytest
from fastapi import FastAPI
from nats.js.api import StreamConfig
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from demo.nats import NatsServer
from outbox._internal.config.credentials import Sources
from outbox.nats import NatsEvent, enqueue_event_async
from outbox.nats import events as nats_registry
from outbox.nats import register as register_event
from outbox.requests import ActionRequest
from outbox.testing import drain
from outbox.webhook import WebhookEvent, enqueue_webhook_async, register, register_endpoint
from outbox.webhook import endpoints as endpoint_registry
from outbox.webhook import events as event_registry
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.support import until
from tests.test_docs import example
from tests.test_enqueue_psycopg import libpq_url

ROOT = Path(__file__).resolve().parent.parent
SECRET = "whsec_" + "a2trLWtrLWtrLWtrLWtrLWtrLWtrLWtrLWtrLWtrLWs="
SPAN_SECONDS = 30.0
QUERY_TOKEN = "q7-s3cr3t-t0k3n"


@dataclass
class Collector:
    """An OTLP/HTTP trace receiver on a free port: every span it was sent, decoded from protobuf."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def add(self, request: ExportTraceServiceRequest) -> None:
        found = [
            {
                "trace_id": span.trace_id.hex(),
                "span_id": span.span_id.hex(),
                "parent_id": span.parent_span_id.hex(),
                "name": span.name,
                "kind": span.kind,
                "status": span.status.code,
                "status_message": span.status.message,
                "attributes": {a.key: _value(a.value) for a in span.attributes},
                "events": [(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events],
                "links": [link.trace_id.hex() for link in span.links],
            }
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self.lock:
            self.spans += found

    def matching(self, **attributes: Any) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if all(s["attributes"].get(k) == v for k, v in attributes.items())]

    def in_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    """The collector, and this process's tracer provider exporting to it, as docs/tracing.md sets one up."""
    running = Collector().start()
    saved = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = running.url
    namespace: dict[str, Any] = {}
    code, page = example("tracing-setup")
    exec(compile(code, page, "exec"), namespace)
    namespace["export_traces"]("outbox-tests")
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another tracer provider was set in this process first"
    running.flush = provider.force_flush  # type: ignore[attr-defined]
    running.setup = namespace  # type: ignore[attr-defined]
    yield running
    provider.shutdown()  # the later tests' spans are dropped, not sent to a receiver that is gone
    if saved is None:
        del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    else:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = saved
    running.server.shutdown()
    running.server.server_close()


@pytest.fixture(autouse=True)
def fresh_spans(collector: Collector) -> None:
    """Each test's databases number their actions from 1 again: each test reads only its own spans."""
    collector.flush()  # type: ignore[attr-defined]
    with collector.lock:
        collector.spans.clear()


@pytest.fixture(scope="module")
def memory(collector: Collector) -> InMemorySpanExporter:
    """Every span of this process, as the SDK ends it (beside the OTLP export to the collector)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def ended(memory: InMemorySpanExporter) -> InMemorySpanExporter:
    """The spans ended during the test."""
    memory.clear()
    return memory


def ancestors(collector: Collector, trace_id: str, span: dict[str, Any]) -> list[str]:
    """The ids of `span`'s parent, its parent's parent, ... as far as the collector holds them."""
    by_id = {s["span_id"]: s for s in collector.in_trace(trace_id)}
    found = []
    while span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        found.append(span["span_id"])
    return found


def spans_of(collector: Collector, count: int, **attributes: Any) -> list[dict[str, Any]]:
    """The spans with these attributes, once at least `count` of them have arrived."""
    collector.flush()  # type: ignore[attr-defined]
    until(lambda: len(collector.matching(**attributes)) >= count, SPAN_SECONDS, f"{count} spans {attributes}")
    return collector.matching(**attributes)


# -- the webhook and the event of the test's application


class OrderPaidHook(WebhookEvent):
    name = "order.paid"
    endpoint = "shop"
    workspace_scoped = False
    query = None

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {}

    def compose(self, event: dict[str, Any], rows: Any) -> dict[str, Any]:
        return {"order_id": event["order_id"]}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"order.paid:{event['order_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"order:{event['order_id']}:webhook"


class OrderPaidEvent(NatsEvent):
    name = "order.paid"
    workspace_scoped = False
    query = None

    def subject(self, event: dict[str, Any]) -> str:
        return "shop.orders.paid"

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {}

    def compose(self, event: dict[str, Any], rows: Any) -> dict[str, Any]:
        return {"order_id": event["order_id"]}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"order.paid.event:{event['order_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"order:{event['order_id']}:event"


class WebhookReceiver:
    """Answers each delivery with the next of `answers` (a status and its headers; by default 500, then 200
    to every later one); continues the trace of each from its `traceparent` in a span of its own (a service of
    its own, with the test's provider)."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.answers: list[tuple[int, dict[str, str]]] = [(500, {})]
        receiver = self
        tracer = trace.get_tracer("webhook-receiver")

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                headers = {name.lower(): value for name, value in self.headers.items()}
                receiver.headers.append(headers)
                parent = TraceContextTextMapPropagator().extract(headers)
                with tracer.start_as_current_span("receive order.paid", context=parent, kind=trace.SpanKind.SERVER):
                    status, extra = receiver.answers.pop(0) if receiver.answers else (200, {})
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookReceiver]:
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(endpoint_registry, "_SOURCES", Sources("secret"))
    monkeypatch.setattr(event_registry, "_EVENTS", {})
    monkeypatch.setattr(nats_registry, "_EVENTS", {})
    running = WebhookReceiver()
    # a token in the query, as many receivers ask: it must reach no span
    register_endpoint("shop", f"{running.url}?token={QUERY_TOKEN}", secret=SECRET)
    register(OrderPaidHook())
    yield running
    running.stop()


def shop_app(collector: Collector, aengine: AsyncEngine) -> FastAPI:
    """The application: a request span (docs/tracing.md's `trace_requests`) around a route that enqueues the
    order's webhook and event in its transaction."""
    # FastAPI's own request spans off: the docs' `trace_requests` makes the one under test
    shop = FastAPI(title="shop", lifespan=collector.setup["traces_sent_at_shutdown"], telemetry={"tracing": False})  # type: ignore[attr-defined]
    app = collector.setup["trace_requests"](shop)  # type: ignore[attr-defined]
    hook, event = event_registry.event_named("order.paid"), register_event(OrderPaidEvent())

    @app.post("/orders/{order_id}/paid")
    async def order_paid(order_id: int) -> dict[str, Any]:
        async with aengine.begin() as conn:
            delivered = await enqueue_webhook_async(conn, hook, {"order_id": order_id}, max_attempts=3)
            published = await enqueue_event_async(conn, event, {"order_id": order_id})
        return {
            "webhook": delivered.id,
            "event": published.id,
            "trace_id": format(trace.get_current_span().get_span_context().trace_id, "032x"),
        }

    return app


async def test_one_trace_holds_the_request_both_attempts_of_a_retried_webhook_and_the_receiver(
    collector: Collector,
    aengine: AsyncEngine,
    engine: Engine,
    receiver: WebhookReceiver,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_NATS_URL", nats_server.url)
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="SHOP", subjects=["shop.>"]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=shop_app(collector, aengine))) as client:
        answer = (await client.post("http://shop/orders/7/paid")).json()
    trace_id = answer["trace_id"]
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT id, trace_context FROM agent_action WHERE id IN (:w, :e)"),
            {"w": answer["webhook"], "e": answer["event"]},
        ).all()
    assert {row.trace_context["traceparent"].split("-")[1] for row in stored} == {trace_id}

    adapters = collector.setup["adapters"](aengine)  # type: ignore[attr-defined]
    outcomes = await drain(aengine, adapters)
    for adapter in adapters:
        await (adapter.aclose() if hasattr(adapter, "aclose") else adapter.close())
    assert outcomes.attempted == 3, "the webhook twice (a 500, then a 200), the event once"

    [request] = [s for s in spans_of(collector, 1) if s["name"] == "POST /orders/{order_id}/paid"]
    attempts = spans_of(collector, 2, **{"outbox.action.id": answer["webhook"]})
    [published] = spans_of(collector, 1, **{"outbox.action.id": answer["event"]})
    received = [s for s in collector.in_trace(trace_id) if s["name"] == "receive order.paid"]
    assert len(received) == 2 and len(receiver.headers) == 2
    assert {s["trace_id"] for s in [request, *attempts, published]} == {trace_id}
    # children of the span current where the endpoint enqueued: the request's, or one under it
    for attempt in [*attempts, published]:
        assert request["span_id"] in ancestors(collector, trace_id, attempt)
    first, second = sorted(attempts, key=lambda s: s["attributes"]["outbox.attempt"])
    assert (first["attributes"]["outbox.result"], second["attributes"]["outbox.result"]) == ("RETRY", "DONE")
    assert first["name"] == "WEBHOOK attempt" and published["name"] == "NATS_EVENT attempt"
    assert second["attributes"]["outbox.stop_reason"] == "CONFIRMED"
    assert second["attributes"]["outbox.trace.event_type"] == "order.paid"
    assert ("outbox.fence", {"outbox.fence.granted": True}) in second["events"]
    # each delivery's span continues from its POST's span, a child of its attempt
    posts = {s["span_id"]: s for s in collector.in_trace(trace_id) if s["name"] == "POST"}
    assert {posts[r["parent_id"]]["parent_id"] for r in received} == {first["span_id"], second["span_id"]}
    assert all("lane" not in name for a in attempts for name in a["attributes"])

    # the event's headers carry the same trace, from its publish span
    consumer = await js.pull_subscribe("shop.orders.paid.*", durable="reader")
    [message] = await consumer.fetch(1, timeout=10)
    await nc.close()
    [publish] = [s for s in collector.in_trace(trace_id) if s["name"] == "NATS_EVENT publish"]
    assert message.headers is not None
    assert message.headers["traceparent"].split("-")[1:3] == [trace_id, publish["span_id"]]
    assert publish["parent_id"] == published["span_id"]


async def enqueue_order(aengine: AsyncEngine, order_id: int, parent: SpanContext | None) -> int:
    """The order.paid webhook, enqueued under a span with `parent`'s context (none: no span active)."""
    hook = event_registry.event_named("order.paid")
    with trace.use_span(NonRecordingSpan(parent)) if parent is not None else contextlib.nullcontext():
        async with aengine.begin() as conn:
            return (await enqueue_webhook_async(conn, hook, {"order_id": order_id}, max_attempts=3)).id


def attempts_of(ended: InMemorySpanExporter, action_id: int) -> list[ReadableSpan]:
    spans = [s for s in ended.get_finished_spans() if (s.attributes or {}).get("outbox.action.id") == action_id]
    return sorted(spans, key=lambda s: s.start_time or 0)


def children_of(ended: InMemorySpanExporter, span: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in ended.get_finished_spans() if s.parent is not None and s.parent.span_id == span.context.span_id]


async def test_a_webhooks_post_span_follows_the_http_conventions_and_each_attempt_says_why(
    ended: InMemorySpanExporter, aengine: AsyncEngine, receiver: WebhookReceiver
) -> None:
    receiver.answers = [(429, {"Retry-After": "1"}), (500, {})]  # then 200
    sampled = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(0x03))
    action_id = await enqueue_order(aengine, 1, sampled)
    adapters = collector_adapters(aengine)
    await drain(aengine, adapters)
    for adapter in adapters:
        await adapter.aclose()
    deferred, retried, done = attempts_of(ended, action_id)
    assert [a.attributes["outbox.result"] for a in (deferred, retried, done)] == ["DEFER", "RETRY", "DONE"]
    assert deferred.attributes["outbox.reason"] == "429: the receiver asked to wait 1 s"
    assert deferred.attributes["outbox.defer_seconds"] == 1.0
    assert retried.attributes["outbox.reason"] == "500: the receiver did not take the webhook"
    assert "outbox.reason" not in done.attributes and "outbox.defer_seconds" not in retried.attributes
    posts = [children_of(ended, attempt) for attempt in (deferred, retried, done)]
    assert all(len(found) == 1 for found in posts)
    port = int(receiver.url.split(":")[2].split("/")[0])
    for [post], status in zip(posts, (429, 500, 200), strict=True):
        assert post.name == "POST" and post.kind is trace.SpanKind.CLIENT
        assert dict(post.attributes or {}) == {
            "http.request.method": "POST",
            "server.address": "127.0.0.1",
            "server.port": port,
            "url.scheme": "http",
            "http.response.status_code": status,
            **({"error.type": str(status)} if status >= 400 else {}),
        }
        assert post.status.status_code is (StatusCode.ERROR if status >= 400 else StatusCode.UNSET)
    # the receiver continued each POST's span; the query's token is in no span, event or link
    assert [h["traceparent"].split("-")[2] for h in receiver.headers] == [
        format(post.context.span_id, "016x") for [post] in posts
    ]
    for span in ended.get_finished_spans():
        assert QUERY_TOKEN not in span.to_json() and "url.full" not in (span.attributes or {})


async def test_a_post_that_reached_no_receiver_is_an_error_named_by_its_class(
    ended: InMemorySpanExporter, aengine: AsyncEngine, receiver: WebhookReceiver
) -> None:
    sampled = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(0x03))
    action_id = await enqueue_order(aengine, 4, sampled)
    receiver.stop()  # its port now refuses connections
    adapters = collector_adapters(aengine)
    await drain(aengine, adapters)
    for adapter in adapters:
        await adapter.aclose()
    attempts = attempts_of(ended, action_id)
    assert [a.attributes["outbox.result"] for a in attempts] == ["RETRY", "RETRY", "RETRY"]
    assert {a.attributes["outbox.reason"] for a in attempts} == {"connect: ConnectError; nothing was sent"}
    assert attempts[-1].attributes["outbox.stop_reason"] == "ATTEMPTS_EXHAUSTED"
    assert attempts[-1].status.status_code is StatusCode.ERROR
    for attempt in attempts:
        [post] = children_of(ended, attempt)
        assert post.attributes["error.type"] == "ConnectError" and post.status.status_code is StatusCode.ERROR
        assert "http.response.status_code" not in post.attributes


async def test_the_executor_follows_the_stored_sampling_decision(
    ended: InMemorySpanExporter, aengine: AsyncEngine, receiver: WebhookReceiver
) -> None:
    """The SDK's default sampler (ParentBased): an action enqueued under an unsampled request records nothing,
    yet its trace reaches the receiver, still unsampled; one enqueued with no span active is a root, sampled by
    the root sampler (every one, by default)."""
    receiver.answers = []
    unsampled = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, TraceFlags(0x02))
    quiet = await enqueue_order(aengine, 2, unsampled)
    alone = await enqueue_order(aengine, 3, None)
    adapters = collector_adapters(aengine)
    outcomes = await drain(aengine, adapters)
    for adapter in adapters:
        await adapter.aclose()
    assert outcomes.attempted == 2
    assert attempts_of(ended, quiet) == []
    [root] = attempts_of(ended, alone)
    assert root.parent is None and root.attributes["outbox.result"] == "DONE"
    [root_post] = children_of(ended, root)
    by_trace = {h["traceparent"].split("-")[1]: h["traceparent"] for h in receiver.headers}
    # test the sampled bit (bit 0 of the flags), never the whole byte: 02 and 03 carry the random bit too
    assert int(by_trace[format(unsampled.trace_id, "032x")].split("-")[3], 16) & 0x01 == 0
    assert int(by_trace[format(root.context.trace_id, "032x")].split("-")[3], 16) & 0x01 == 1
    assert by_trace[format(root.context.trace_id, "032x")].split("-")[2] == format(root_post.context.span_id, "016x")


def collector_adapters(aengine: AsyncEngine) -> list[Any]:
    """The webhook's adapter, built after the test registered its endpoint."""
    from outbox.webhook import webhook_adapters

    return list(webhook_adapters(aengine))


async def test_every_enqueue_route_stores_the_active_spans_context_and_nothing_without_one(
    collector: Collector, engine: Engine, aengine: AsyncEngine, database_url: str
) -> None:
    tracer = trace.get_tracer("routes")

    def request(key: str) -> ActionRequest:
        return ActionRequest(kind=kinds.READBACK, lane_key=key, idempotency_key=key, payload={})

    with tracer.start_as_current_span("sync"):
        with engine.begin() as conn:
            outbox.enqueue(conn, request("sync"))
            outbox.enqueue_many(conn, [request("many-1"), request("many-2")])
        with psycopg.connect(libpq_url(database_url)) as conn:
            outbox.enqueue(conn, request("psycopg"))
    with tracer.start_as_current_span("async"):
        async with aengine.begin() as aconn:
            await outbox.enqueue_async(aconn, request("async"))
            await outbox.enqueue_many_async(aconn, [request("async-many")])
    with engine.begin() as conn:
        outbox.enqueue(conn, request("no-span"))
        stored = dict(conn.execute(text("SELECT idempotency_key, trace_context FROM agent_action")).all())
    assert stored.pop("no-span") is None
    trace_ids = {key: context["traceparent"].split("-")[1] for key, context in stored.items()}
    assert len(trace_ids) == 6 and len(set(trace_ids.values())) == 2
    assert trace_ids["sync"] == trace_ids["many-2"] == trace_ids["psycopg"] != trace_ids["async"]


async def test_an_action_enqueued_without_a_span_makes_a_root_attempt_span_linked_to_the_executors(
    collector: Collector, engine: Engine, aengine: AsyncEngine
) -> None:
    with engine.begin() as conn:
        action = outbox.enqueue(
            conn, ActionRequest(kind=kinds.READBACK, lane_key="root", idempotency_key="root", payload={})
        )
        stored = conn.execute(text("SELECT trace_context FROM agent_action WHERE id = :id"), {"id": action.id})
        assert stored.scalar_one() is None
    # the span current where the executor runs (a drain run's, say): a link, not a parent
    with trace.get_tracer("worker").start_as_current_span("drain run") as run:
        await drain(aengine, [ScriptedAdapter(kinds.READBACK)])
    [span] = spans_of(collector, 1, **{"outbox.action.id": action.id})
    assert span["parent_id"] == "" and span["trace_id"] != format(run.get_span_context().trace_id, "032x")
    assert span["links"] == [format(run.get_span_context().trace_id, "032x")]
    assert span["attributes"]["outbox.result"] == "DONE"


async def test_a_malformed_stored_context_is_ignored_with_one_warning(
    collector: Collector, engine: Engine, aengine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with engine.begin() as conn:
        action = outbox.enqueue(
            conn, ActionRequest(kind=kinds.READBACK, lane_key="bad", idempotency_key="bad", payload={})
        )
        conn.execute(
            text("UPDATE agent_action SET trace_context = CAST(:bad AS jsonb) WHERE id = :id"),
            {"bad": json.dumps({"traceparent": "00-not-a-trace-01", "tracestate": 7}), "id": action.id},
        )
    with caplog.at_level(logging.WARNING, logger="outbox.tracing"):
        outcomes = await drain(aengine, [ScriptedAdapter(kinds.READBACK)])
    assert outcomes.attempted == 1
    warnings = [r for r in caplog.records if r.name == "outbox.tracing"]
    assert len(warnings) == 1 and f"action {action.id}:" in warnings[0].getMessage()
    [span] = spans_of(collector, 1, **{"outbox.action.id": action.id})
    assert span["parent_id"] == "" and span["attributes"]["outbox.result"] == "DONE"


async def test_an_uncertain_attempt_sets_the_spans_status_to_error(
    collector: Collector, engine: Engine, aengine: AsyncEngine
) -> None:
    from tests.adapters import UncertainAdapter

    with engine.begin() as conn:
        action = outbox.enqueue(
            conn, ActionRequest(kind=kinds.READBACK, lane_key="u", idempotency_key="uncertain", payload={})
        )
    await drain(aengine, [UncertainAdapter(kinds.READBACK)])
    [span] = spans_of(collector, 1, **{"outbox.action.id": action.id})
    assert span["status"] == 2  # STATUS_CODE_ERROR
    assert span["status_message"] == "the provider timed out after the write"
    assert span["attributes"]["outbox.stop_reason"] == "PROVIDER_UNCERTAIN"


def test_the_stored_context_is_bounded(engine: Engine) -> None:
    with engine.begin() as conn:
        action = outbox.enqueue(
            conn, ActionRequest(kind=kinds.READBACK, lane_key="b", idempotency_key="bounded", payload={})
        )
    with pytest.raises(Exception, match="ck_agent_action_trace_context"), engine.begin() as conn:
        conn.execute(
            text("UPDATE agent_action SET trace_context = CAST(:big AS jsonb) WHERE id = :id"),
            {"big": json.dumps({"tracestate": "x" * 1100}), "id": action.id},
        )


# -- without the extra

# what a process without `opentelemetry-api` finds: no module of it can be imported
NO_OPENTELEMETRY = """
import sys


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NotInstalled())
"""
ENQUEUE_AND_DRAIN = """
import asyncio, json, sys

import outbox
from sqlalchemy import text

from outbox.db import async_engine, sync_engine
from outbox.requests import ActionRequest
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter

url = sys.argv[1]
with sync_engine(url).begin() as conn:
    outbox.enqueue(conn, ActionRequest(kind=kinds.READBACK, lane_key="a", idempotency_key="a", payload={}))
after_enqueue = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
if sys.argv[2] == "drain":
    engine = async_engine(url)
    asyncio.run(drain(engine, [ScriptedAdapter(kinds.READBACK)]))
with sync_engine(url).connect() as conn:
    row = conn.execute(text("SELECT state, trace_context FROM agent_action")).one()
print(json.dumps({
    "after_enqueue": after_enqueue,
    "at_end": sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"),
    "state": row.state,
    "trace_context": row.trace_context,
}))
"""


def run_script(database_url: str, prelude: str, mode: str, script: str = ENQUEUE_AND_DRAIN) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", prelude + script, database_url, mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_without_the_extra_an_enqueue_and_a_drain_import_no_opentelemetry(database_url: str) -> None:
    found = run_script(database_url, NO_OPENTELEMETRY, "drain")
    assert found == {"after_enqueue": [], "at_end": [], "state": "DONE", "trace_context": None}


def test_an_application_that_never_imported_opentelemetry_enqueues_without_importing_it(database_url: str) -> None:
    found = run_script(database_url, "", "enqueue")
    assert found["after_enqueue"] == found["at_end"] == [] and found["trace_context"] is None


API_ONLY = """
import asyncio, json, sys

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from sqlalchemy import text

import outbox
from outbox import tracing
from outbox.db import async_engine, sync_engine
from outbox.executor import Done
from outbox.requests import ActionRequest
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter

url = sys.argv[1]
incoming = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1))
with trace.use_span(NonRecordingSpan(incoming)), sync_engine(url).begin() as conn:
    outbox.enqueue(conn, ActionRequest(kind=kinds.READBACK, lane_key="a", idempotency_key="a", payload={}))
sent = []


async def call_provider(attempt):
    (await attempt.fence().begin_write()).check()
    with tracing.provider_call("TEST_READBACK call") as call:
        sent.append(call.headers)
    return Done("sent")


asyncio.run(drain(async_engine(url), [ScriptedAdapter(kinds.READBACK, call_provider)]))
with sync_engine(url).connect() as conn:
    stored = conn.execute(text("SELECT trace_context FROM agent_action")).scalar_one()
print(json.dumps({"stored": stored, "sent": sent, "sdk": tracing.sdk_configured()}))
"""


def test_with_the_api_alone_the_stored_context_still_reaches_the_provider(database_url: str) -> None:
    """No tracer provider set (a process that has the API through another package): no span is started, and the
    provider call carries the enqueuing context on as it was stored."""
    found = run_script(database_url, "", "", API_ONLY)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert found == {"stored": {"traceparent": traceparent}, "sent": [{"traceparent": traceparent}], "sdk": False}


# -- `outbox run`


def traced_adapters(engine: AsyncEngine) -> list[ScriptedAdapter]:
    """`outbox run --adapters tests.test_tracing:traced_adapters`: docs/tracing.md's set-up in the executor's
    process, exporting to OTEL_EXPORTER_OTLP_ENDPOINT, and a test kind's adapter."""
    namespace: dict[str, Any] = {}
    code, page = example("tracing-setup")
    exec(compile(code, page, "exec"), namespace)
    # the stored flag decides an enqueued trace's attempts; the root sampler, the attempts stored without one
    namespace["export_traces"]("outbox-run", ParentBased(ALWAYS_OFF))
    return [ScriptedAdapter(kinds.READBACK)]


def test_outbox_run_exports_the_attempt_spans_under_the_enqueuing_trace(
    collector: Collector, engine: Engine, database_url: str
) -> None:
    with trace.get_tracer("app").start_as_current_span("POST /pings") as request, engine.begin() as conn:
        action = outbox.enqueue(
            conn, ActionRequest(kind=kinds.READBACK, lane_key="run", idempotency_key="run", payload={})
        )
    with engine.begin() as conn:
        alone = outbox.enqueue(
            conn, ActionRequest(kind=kinds.READBACK, lane_key="alone", idempotency_key="alone", payload={})
        )
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": database_url,
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.test_tracing:traced_adapters"]
    # it ends on its own after --max-seconds; the SDK sends what is left as the process exits
    done = subprocess.run(
        [*command, "--max-seconds", "8"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [span] = spans_of(collector, 1, **{"outbox.action.id": action.id})
    assert span["trace_id"] == format(request.get_span_context().trace_id, "032x")
    assert span["parent_id"] == format(request.get_span_context().span_id, "016x")
    assert span["name"] == "TEST_READBACK attempt" and span["attributes"]["outbox.result"] == "DONE"
    # the process exported everything as it exited: the action stored without a trace made no span
    assert collector.matching(**{"outbox.action.id": alone.id}) == []
    [started] = [line for line in done.stderr.splitlines() if "carrying out" in line]
    assert "; tracing on (sampler ParentBased{root:AlwaysOffSampler,remoteParentSampled:AlwaysOnSampler," in started


# -- the application's own flush when its server stops

UVICORN_APP = """
from fastapi import FastAPI

from tests.test_docs import example

setup = {}
code, page = example("tracing-setup")
exec(compile(code, page, "exec"), setup)
setup["export_traces"]("shop-uvicorn")
# FastAPI's own request spans off: the docs' `trace_requests` makes one span per request
app = setup["trace_requests"](FastAPI(lifespan=setup["traces_sent_at_shutdown"], telemetry={"tracing": False}))


@app.get("/orders/{order_id}")
async def order(order_id: int) -> dict[str, int]:
    return {"order_id": order_id}
"""


def test_uvicorn_stopped_by_sigterm_sends_every_request_span_through_the_docs_shutdown_hook(
    collector: Collector, tmp_path: Path
) -> None:
    """uvicorn ends its process by the signal once its graceful shutdown is done, so the SDK's exit handler
    never runs: the batch's spans go only through the lifespan hook of docs/tracing.md's set-up."""
    (tmp_path / "shop_uvicorn.py").write_text(UVICORN_APP)
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(64)
    port = listening.getsockname()[1]
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    uvicorn = [sys.executable, "-m", "uvicorn", "shop_uvicorn:app", "--fd", str(listening.fileno())]
    server = subprocess.Popen(uvicorn, env=env, cwd=ROOT, pass_fds=[listening.fileno()], stderr=subprocess.PIPE)
    try:
        # requests queue on the socket until the server is up
        answers = [httpx.get(f"http://127.0.0.1:{port}/orders/{n}", timeout=60).status_code for n in range(9)]
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=60)
        listening.close()
    assert answers == [200] * 9, stderr.decode()[-2000:]
    assert b"Application shutdown complete" in stderr, stderr.decode()[-2000:]
    # the export ended before the process did: every span is here
    received = [s for s in collector.spans if s["name"] == "GET /orders/{order_id}"]
    assert len(received) == 9, stderr.decode()[-2000:]
    assert {s["attributes"]["http.route"] for s in received} == {"/orders/{order_id}"}
