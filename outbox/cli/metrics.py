"""`outbox metrics serve`: the metrics exporter (run one or two per installation, not one per worker)."""

from __future__ import annotations

import typer
from rich.console import Console

from outbox.cli.database import database_url
from outbox.db import sync_engine
from outbox.metrics import exporter

app = typer.Typer(no_args_is_help=True, help="Serve outbox metrics to Prometheus.")
console = Console(stderr=True)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(9464, min=1, max=65535, help="Port to listen on."),
    cache_seconds: float = typer.Option(5.0, min=0, help="Reuse a database snapshot this long between scrapes."),
) -> None:
    """Serve /metrics, read from the outbox database at scrape time, until SIGTERM."""
    engine = sync_engine(database_url(console), pool_size=2)
    console.print(f"serving outbox metrics on http://{host}:{port}/metrics")
    exporter.serve(engine, host, port, cache_seconds)
    engine.dispose()
