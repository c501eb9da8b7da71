"""Which database a command talks to: OUTBOX_DATABASE_URL, or an embedded PostgreSQL it starts."""

from __future__ import annotations

from rich.console import Console

from outbox.db import psycopg_url, start_embedded_postgres
from outbox.settings import load_settings


def database_url(console: Console) -> str:
    settings = load_settings()
    if settings.database_url:
        return psycopg_url(settings.database_url)
    url = start_embedded_postgres(settings.data_dir)
    console.print(
        f"[dim]OUTBOX_DATABASE_URL is unset: using an embedded PostgreSQL in {settings.data_dir / 'pg'}[/dim]"
    )
    return url
