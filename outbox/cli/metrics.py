"""`outbox metrics serve`: the metrics exporter (run one or two per installation, not one per worker)."""

from __future__ import annotations

import typer

from outbox.cli.options import DATABASE_URL_OPTION, required

app = typer.Typer(no_args_is_help=True, help="Serve outbox metrics to Prometheus.")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(9464, min=1, max=65535, help="Port to listen on."),
    cache_seconds: float = typer.Option(5.0, min=0, help="Reuse a database snapshot this long between scrapes."),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Serve /metrics, read from the outbox database at scrape time, until SIGTERM."""
    from outbox.cli.common import err
    from outbox.db import sync_engine
    from outbox.metrics import exporter

    # no schema check: the exporter starts with its database down, and says so (`outbox_exporter_up 0`)
    engine = sync_engine(required(database_url), pool_size=2)
    err.print(f"serving outbox metrics on http://{host}:{port}/metrics")
    try:
        exporter.serve(engine, host, port, cache_seconds)
    finally:
        engine.dispose()
