"""What the operator commands share: the database connection, durations, states, and JSON or table output.

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
from sqlalchemy import Connection

from outbox.cli.database import database_url
from outbox.db import sync_engine
from outbox.states import ActionState

# markup off: lane keys, kinds and payloads are printed as they are, never read as rich markup
out = Console(markup=False, highlight=False)
# where `database_url` says that it started an embedded PostgreSQL, away from the output
err = Console(stderr=True)

JSON_OPTION = typer.Option(False, "--json", help="Print JSON for scripts instead of tables.")

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


@contextmanager
def connect(*, read_only: bool = False) -> Iterator[Connection]:
    """One transaction on the outbox database; a read-only one sees a single snapshot."""
    engine = sync_engine(database_url(err))
    try:
        with engine.connect() as conn:
            if read_only:
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
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
