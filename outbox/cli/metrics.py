"""`outbox metrics serve`: the metrics exporter (run one or two per installation, not one per worker).

--database-url / OUTBOX_DATABASE_URL ─▶ one database: its series as always, no `cell` label
--cell NAME / OUTBOX_CELL            ─▶ that cell's database: every series labelled cell="NAME"
--all-cells                          ─▶ every cell of OUTBOX_CELLS_FILE (every URL read and checked before
                                        serving), read side by side at each scrape: cell="<name>" on each
"""

from __future__ import annotations

import typer

from outbox.cli.options import (
    AllCells,
    Database,
    database_options,
    finite,
    printable,
)

app = typer.Typer(no_args_is_help=True, help="Serve outbox metrics to Prometheus.")


@app.command()
@database_options(all_cells=True)
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(9464, min=1, max=65535, help="Port to listen on."),
    cache_seconds: float = typer.Option(
        5.0, min=0, max=3600, callback=finite, help="Reuse a database snapshot this long between scrapes."
    ),
    *,
    db: Database | AllCells,
) -> None:
    """Serve /metrics, read from the outbox database at scrape time, until SIGTERM.

    With --cell or --all-cells, every series is labelled with its cell; the cells are read side by side."""
    from outbox.cli.all_cells import cell_databases
    from outbox.cli.common import engine, err, log_to_stderr
    from outbox.metrics import exporter

    if isinstance(db, AllCells):
        cells = cell_databases(db.connect_timeout, db.statement_timeout)[1]
    else:
        cells = {db.cell: db} if db.cell is not None else {}
    # no schema check: the exporter starts with its databases down, and says so (`outbox_exporter_up 0`);
    # each connects at the first scrape, and a URL that cannot be used fails here
    engines = {name: engine(cell, pool_size=2) for name, cell in cells.items()}
    if engines:
        registry = exporter.registry_for_cells(engines, cache_seconds)
        serving = f"the metrics of {len(engines)} cell{'s' if len(engines) > 1 else ''}"
    else:
        assert isinstance(db, Database)
        engines = {"": engine(db, pool_size=2)}
        registry = exporter.registry_for(engines[""], cache_seconds)
        serving = "outbox metrics"
    try:
        _check_address(host, port)
        log_to_stderr()
        err.print(f"serving {serving} on http://{printable(host)}:{port}/metrics")
        exporter.serve(registry, host, port)
    except OSError as error:  # taken between the check and the server's own bind
        raise ValueError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    finally:
        for made in engines.values():
            made.dispose()


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
