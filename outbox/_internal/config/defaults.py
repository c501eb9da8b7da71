"""outbox's settings, their defaults and the OUTBOX_ variables that set them, in one place that imports
nothing heavy.

    SETTINGS (the defaults) ─┬─▶ outbox.settings.Settings (pydantic: the library, the flows, the demo)
    setting_variable(name)  ─┴─▶ the options of the `outbox` commands (typer: --database-url,
                                 --connect-timeout, --statement-timeout), read without loading pydantic

The variable of a setting is OUTBOX_ and its name in capitals: `connect_timeout_seconds` is set by
OUTBOX_CONNECT_TIMEOUT_SECONDS. The email kind's SMTP settings live with it (`outbox.email.settings`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

ENV_PREFIX = "OUTBOX_"
# a claim's lease, in seconds: the executor's default (outbox.executor.ExecutorConfig) and the drain flow's
LEASE_SECONDS = 300.0


@dataclass(frozen=True)
class SettingDefaults:
    # SQLAlchemy URL of the outbox database; unset, every command but `outbox demo` refuses to start
    database_url: str | None = None
    # URL the executors LISTEN on for new actions when OUTBOX_DATABASE_URL goes through a connection pooler
    # in transaction mode (where LISTEN does not last): a direct connection, or the pooler in session mode.
    # Unset behind such a pooler, the executors poll every second instead
    listen_database_url: str | None = None
    # seconds to wait for a connection to the database (libpq waits at least 2)
    connect_timeout_seconds: int = 10
    # seconds one statement may run (0: no limit)
    statement_timeout_seconds: float = 30.0
    # where `outbox demo` keeps its embedded PostgreSQL, data and logs when it is given no database
    data_dir: Path = Path(".outbox")
    # a claim's lease in the drain flow's executor (more than the 60 s write window)
    lease_seconds: float = LEASE_SECONDS
    # names this installation in the drain runs' Prefect tags (`env:<environment>`)
    environment: str = "default"


SETTINGS = SettingDefaults()


def setting_variable(name: str) -> str:
    """The environment variable that sets the setting `name`."""
    if name not in {field.name for field in fields(SettingDefaults)}:
        raise KeyError(f"no setting {name!r}")
    return f"{ENV_PREFIX}{name.upper()}"
