"""`outbox metrics serve`: the metrics exporter (run one or two per installation, not one per worker)."""

from __future__ import annotations

import typer

from outbox.cli.options import (
    Database,
    database_options,
    finite,
    printable,
)

app = typer.Typer(no_args_is_help=True, help="Serve outbox metrics to Prometheus.")


@app.command()
@database_options()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(9464, min=1, max=65535, help="Port to listen on."),
    cache_seconds: float = typer.Option(
        5.0, min=0, max=3600, callback=finite, help="Reuse a database snapshot this long between scrapes."
    ),
    *,
    db: Database,
) -> None:
    """Serve /metrics, read from the outbox database at scrape time, until SIGTERM."""
    from outbox.cli.common import engine, err, log_to_stderr
    from outbox.metrics import exporter

    # no schema check: the exporter starts with its database down, and says so (`outbox_exporter_up 0`)
    serving = engine(db, pool_size=2)  # connects at the first scrape; a URL that cannot be used fails here
    try:
        _check_address(host, port)
        log_to_stderr()
        err.print(f"serving outbox metrics on http://{printable(host)}:{port}/metrics")
        exporter.serve(serving, host, port, cache_seconds)
    except OSError as error:  # taken between the check and the server's own bind
        raise ValueError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    finally:
        serving.dispose()


def _check_address(host: str, port: int) -> None:
    """Refuse, before serving, an address that does not resolve and a port that is taken or not ours."""
    import socket

    if not host.strip():
        raise ValueError("--host must name an address to listen on (127.0.0.1, ::1, 0.0.0.0)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
            probe.bind(address)
    except (OSError, UnicodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ValueError(f"cannot listen on {host}:{port}: {reason}") from None
