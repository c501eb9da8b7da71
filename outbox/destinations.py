"""Destinations, the operator's layer: what an operator reads and changes of them: the list, a pause, a resume.

    destinations(conn) ──DESTINATION_ROWS──▶ every destination with a row or an action not ended
    pause(conn, name)  ──PAUSE (its row made first by ADD_DESTINATION, of the kind its live actions have)──▶
                         paused by the operator, for a time or until resumed: no executor claims for it
    resume(conn, name) ──RESUME──▶ open: its pause, its breaker, its refused credentials and its learned pace
                         gone (a configured rate stays)

Each function runs on the caller's connection, inside its transaction; the CLI (`outbox destinations`, `outbox
status`) prints what they return, and the metrics exporter reads the same rows (outbox.metrics.collector).
Times are the database clock's.

Destinations are one concept in three layers: the operator's (outbox.destinations), the executor's
(outbox.executor.destinations, pacing and turns) and the store's (outbox.store.destinations and destination_rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from outbox.errors import InvalidRequest, OutboxError
from outbox.executor.pacing import PACE
from outbox.kinds import ActionKind, is_destination_name
from outbox.store import destination_rows as rows
from outbox.store import destinations as store

# the longest reason a pause keeps (agent_destination.pause_reason)
MAX_REASON = 500

OPEN, PACED, PAUSED, BROKEN, REFUSED = "open", "paced", "paused", "broken", "refused"


class UnknownDestination(OutboxError, LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"destination {name!r} is unknown: it has no row (never paced, paused or broken), no action"
            " waiting or executing names it, and it is no declared kind's own destination"
        )
        self.name = name


@dataclass(frozen=True)
class Destination:
    name: str
    kind: str
    # paused (no executor claims for it), refused (the provider refused its credentials: one probe every few
    # minutes), broken (one probe at a time), paced (a provider's slow-down lowered its pace) or open; a paused
    # destination that is also broken or refused is paused
    state: str
    # while paused: when the pause ends, or None with `until_resumed` (an operator's pause without a time)
    paused_until: datetime | None
    until_resumed: bool
    # while paused: "provider" (a slow-down) or "operator", and why
    paused_by: str | None
    pause_reason: str | None
    broken_since: datetime | None
    broken_seconds: float | None
    # since when the provider refuses its credentials, and what it answered; None: it does not
    credentials_refused_at: datetime | None
    credentials_reason: str | None
    # the configured rate and the learned pace, in attempts a second; None: none
    rate: float | None
    pace: float | None
    # its actions not ended: waiting (PROPOSED or ADMITTED), due lane heads, executing
    waiting: int
    due: int
    executing: int
    # how long its oldest due lane head has waited (0: none)
    oldest_due_seconds: float

    @property
    def is_open(self) -> bool:
        return self.state == OPEN


def _destination(row: Any) -> Destination:
    paused = bool(row.paused)
    state = (
        PAUSED
        if paused
        else REFUSED
        if row.credentials_refused_at
        else BROKEN
        if row.broken_since
        else PACED
        if row.pace is not None
        else OPEN
    )
    return Destination(
        name=row.name,
        kind=row.kind,
        state=state,
        paused_until=row.paused_until if paused else None,
        until_resumed=bool(row.until_resumed),
        paused_by=row.paused_by if paused else None,
        pause_reason=row.pause_reason if paused else None,
        broken_since=row.broken_since,
        broken_seconds=row.broken_seconds,
        credentials_refused_at=row.credentials_refused_at,
        credentials_reason=row.credentials_reason,
        rate=row.rate,
        pace=row.pace,
        waiting=row.waiting,
        due=row.due,
        executing=row.executing,
        oldest_due_seconds=row.oldest_due_seconds,
    )


def destinations(conn: Connection) -> tuple[Destination, ...]:
    """Every destination with a row or an action not ended, by kind and name."""
    return tuple(_destination(row) for row in conn.execute(rows.DESTINATION_ROWS, PACE))


def _find(conn: Connection, name: str) -> Destination:
    found = [d for d in destinations(conn) if d.name == name]
    if not found:
        raise UnknownDestination(name)
    return found[0]


def _checked(name: str) -> str:
    if not is_destination_name(name):
        raise InvalidRequest(
            "NAME", f"{name!r} is not a destination name (1 to 80 lower case letters, digits, _, -, . and :)"
        )
    return name


def pause(conn: Connection, name: str, *, lasting: timedelta | None = None, reason: str | None = None) -> Destination:
    """Pause `name` for `lasting`, or until resumed: no executor claims for it meanwhile (attempts already
    claimed finish). A destination without a row gets one, of the kind of the actions that name it, or else
    of the declared kind whose own destination it is (`smtp` before any email was enqueued: a maintenance
    window prepared on an idle system); one that has none of these is unknown. A provider's slow-down during
    the pause leaves it the operator's."""
    _checked(name)
    if lasting is not None and lasting.total_seconds() < 1:
        raise InvalidRequest("--for", "a pause lasts at least 1s")
    if reason is not None and len(reason) > MAX_REASON:
        raise InvalidRequest("--reason", f"at most {MAX_REASON} characters, not {len(reason)}")
    params = {"name": name, "seconds": lasting.total_seconds() if lasting else None, "reason": reason}
    if conn.execute(store.PAUSE, params).rowcount == 0:
        kind = conn.execute(rows.LIVE_DESTINATION_KIND, {"name": name}).scalar() or _declared_kind(conn, name)
        if kind is None:
            raise UnknownDestination(name)
        conn.execute(store.ADD_DESTINATION, {"name": name, "kind": kind})
        conn.execute(store.PAUSE, params)
    return _find(conn, name)


def _declared_kind(conn: Connection, name: str) -> str | None:
    """The declared kind whose own destination `name` is (the kinds' registry, else the kind's name in lower
    case), or None."""
    known = ActionKind.all()
    kinds = [kind.name for kind in known if kind.destination == name]
    registered = [kind.name for kind in known]
    found: str | None = conn.execute(
        rows.DECLARED_DESTINATION_KIND, {"name": name, "kinds": kinds, "registered": registered}
    ).scalar()
    return found


def resume(conn: Connection, name: str) -> Destination:
    """Open `name` again: its pause (the operator's or a provider's) ends, its breaker, refused credentials
    and learned pace are forgotten (after a secret was mended, its next attempt tries it at once); a configured
    rate stays. A destination without a row is open already."""
    _checked(name)
    conn.execute(store.RESUME, {"name": name})
    return _find(conn, name)
