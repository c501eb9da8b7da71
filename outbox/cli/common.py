"""What the operator commands share once they run: the database connection, durations, states, and JSON
or table output. Commands import it in their bodies, never at the top (see `outbox.cli.options`).

Bad input raises ValueError naming the option, which `outbox.cli.main` prints as one line (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.console import Console
from sqlalchemy import Connection, Engine, text
from sqlalchemy.pool import NullPool

from outbox.db import sync_engine
from outbox.errors import OutboxError
from outbox.states import ActionState

# markup off: lane keys, kinds and payloads are printed as they are, never read as rich markup
out = Console(markup=False, highlight=False)
# what a command says about itself (progress, where it listens), away from its output
err = Console(stderr=True)

SCHEMA_EXISTS = text("SELECT to_regclass('agent_action') IS NOT NULL")

_DURATION = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(option: str, value: str) -> timedelta:
    """`30d`, `24h`, `15m`, `90s`: a whole number and one unit."""
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"{option}: {value!r} is not a duration; write a whole number and s, m, h or d (30d, 24h)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def parse_state(value: str) -> ActionState:
    try:
        return ActionState(value.strip().upper())
    except ValueError:
        known = ", ".join(ActionState)
        raise ValueError(f"--state: unknown state {value!r} (one of {known})") from None


def format_age(seconds: float | None) -> str:
    """12s, 3m 12s, 2h 5m, 1d 3h."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


class NotMigrated(OutboxError):
    def __init__(self) -> None:
        super().__init__("the database has no outbox schema: run `outbox db upgrade` first")


def require_schema(conn: Connection) -> None:
    if not conn.execute(SCHEMA_EXISTS).scalar_one():
        raise NotMigrated()


def migrated_engine(url: str, **options: Any) -> Engine:
    """An engine on a database that holds the outbox schema (checked once, now)."""
    engine = sync_engine(url, **options)
    try:
        with engine.connect() as conn:
            require_schema(conn)
    except BaseException:
        engine.dispose()
        raise
    return engine


@contextmanager
def connect(url: str, *, read_only: bool = False) -> Iterator[Connection]:
    """One transaction on the outbox database; a read-only one sees a single snapshot."""
    engine = sync_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            if read_only:
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                require_schema(conn)
                yield conn
    finally:
        engine.dispose()


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot print {type(value).__name__} as JSON")


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, default=_plain, indent=2))
