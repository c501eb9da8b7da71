"""The exporter process: one long-lived HTTP server (127.0.0.1 by default) that serves OutboxCollector's metrics.

    Prometheus ──GET /metrics──▶ MetricsServer: a listen queue of 1024, one daemon thread per request
        ──▶ prometheus_client's exposition (text or OpenMetrics, as asked) ──▶ OutboxCollector
        ──▶ the cached snapshot, or the one in flight ──▶ PostgreSQL (read only)

Hundreds of scrapes at once wait in the listen queue instead of being refused, and share one snapshot;
each answers within the collector's `wait_seconds`, with `outbox_exporter_up 0` when the database does not.
Serving cells (`registry_for_cells`), one OutboxCollector per cell sits behind `outbox.metrics.cells`, which
reads them side by side and labels every sample with its cell.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Mapping
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler
from sqlalchemy import Engine

from outbox.metrics.cells import CellsCollector
from outbox.metrics.collector import OutboxCollector

# connections the kernel queues before the server accepts them (prometheus_client's own server: 5)
REQUEST_QUEUE_SIZE = 1024
# a client that connects and sends no request releases its thread after this long
REQUEST_TIMEOUT_SECONDS = 30.0


def registry_for(engine: Engine, cache_seconds: float = 5.0) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector(engine, cache_seconds=cache_seconds))
    return registry


def registry_for_cells(engines: Mapping[str, Engine], cache_seconds: float = 5.0) -> CollectorRegistry:
    """Every cell's metrics, labelled cell="<name>"; `engines` by cell name, in the cells file's order."""
    registry = CollectorRegistry(auto_describe=False)
    collectors = {
        name: OutboxCollector(engine, cache_seconds=cache_seconds, cell=name) for name, engine in engines.items()
    }
    registry.register(CellsCollector(collectors))
    return registry


class MetricsServer(ThreadingHTTPServer):
    """/metrics of `registry` on (host, port): IPv4 or IPv6 as the host resolves, port 0 picks a free one."""

    request_queue_size = REQUEST_QUEUE_SIZE
    daemon_threads = True

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        handler = type(
            "OutboxMetricsHandler", (MetricsHandler,), {"registry": registry, "timeout": REQUEST_TIMEOUT_SECONDS}
        )
        super().__init__((str(address[0]), int(address[1])), handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def start(
    registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 9464
) -> tuple[MetricsServer, threading.Thread]:
    """Serve on a daemon thread; stop with `server.shutdown()` then `server.server_close()`."""
    server = MetricsServer(host, port, registry)
    thread = threading.Thread(target=server.serve_forever, name="outbox-metrics-server", daemon=True)
    thread.start()
    return server, thread


def serve(registry: CollectorRegistry, host: str, port: int) -> None:
    """Serve /metrics until SIGTERM or SIGINT, logging to stderr (unless logging is configured already)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    server, thread = start(registry, host, port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    server.server_close()
    thread.join(5)
