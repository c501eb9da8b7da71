"""The exporter process: one long-lived HTTP server on 127.0.0.1 that serves OutboxCollector's metrics.

Prometheus ──GET /metrics──▶ prometheus_client server thread ──▶ OutboxCollector ──▶ PostgreSQL
"""

from __future__ import annotations

import signal
import threading

from prometheus_client import CollectorRegistry, start_http_server
from sqlalchemy import Engine

from outbox.metrics.collector import OutboxCollector


def registry_for(engine: Engine, cache_seconds: float = 5.0) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector(engine, cache_seconds=cache_seconds))
    return registry


def serve(engine: Engine, host: str, port: int, cache_seconds: float = 5.0) -> None:
    """Serve /metrics until SIGTERM or SIGINT."""
    server, thread = start_http_server(port, addr=host, registry=registry_for(engine, cache_seconds))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(5)
