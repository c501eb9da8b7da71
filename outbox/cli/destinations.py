"""`outbox destinations [pause NAME | resume NAME]`: where actions go, what holds each back, and an
operator's pause and resume.

The list reads one snapshot; pause and resume each run in one transaction through `outbox.destinations`.
A name that is not a destination's, a name nothing knows, a bad duration or a reason too long is one line
(exit 2) and nothing is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from outbox.cli.options import (
    JSON_OPTION,
    Database,
    NoDatabase,
    database_options,
    duration,
    parse_duration,
    printable,
)

if TYPE_CHECKING:
    from outbox.destinations import Destination

app = typer.Typer(invoke_without_command=True)

NAME_ARGUMENT = typer.Argument(..., metavar="NAME", help="The destination: smtp, nats, webhook:<endpoint>, ...")


@app.callback()
@database_options(optional=True)
def destinations(
    context: typer.Context,
    json_output: bool = JSON_OPTION,
    *,
    db: Database | None,
) -> None:
    """Where actions go and what holds each back; `pause NAME` and `resume NAME` steer one.

    Without a command: each destination that has a row or that an action not ended names, with its kind, its
    state (open; paced; paused until a time, or until resumed, by a provider or an operator; broken since a
    time), its configured rate and learned pace (attempts a second), and its actions waiting, due and
    executing."""
    if context.invoked_subcommand is not None:
        return
    if db is None:
        raise NoDatabase()
    from rich.table import Table

    from outbox import destinations as operator
    from outbox.cli.common import connect, print_json, print_table

    with connect(db, read_only=True) as conn:
        found = operator.destinations(conn)
    if json_output:
        print_json(found)
        return
    table = Table(title="destinations")
    for column in ("destination", "kind", "state", "rate", "pace", "waiting", "due", "executing"):
        table.add_column(column, justify="right" if column in ("waiting", "due", "executing") else "left")
    for d in found:
        table.add_row(
            printable(d.name),
            printable(d.kind),
            state_text(d),
            _per_second(d.rate),
            _per_second(d.pace),
            f"{d.waiting:,}",
            f"{d.due:,}",
            f"{d.executing:,}",
        )
    print_table(table)


def state_text(d: Destination) -> str:
    """open; paced; paused until <UTC time> (or until resumed) by <who>: <reason>; broken since <UTC time>;
    credentials refused since <UTC time>: <what the provider answered>."""
    from outbox.cli.common import utc

    parts = []
    if d.state == "paused":
        until = "until resumed" if d.until_resumed or d.paused_until is None else f"until {utc(d.paused_until)} UTC"
        reason = f": {d.pause_reason}" if d.pause_reason else ""
        parts.append(f"paused {until} by {d.paused_by}{reason}")
    if d.credentials_refused_at is not None:
        parts.append(f"credentials refused since {utc(d.credentials_refused_at)} UTC: {d.credentials_reason}")
    elif d.broken_since is not None:
        parts.append(f"broken since {utc(d.broken_since)} UTC")
    if d.state == "paced":
        parts.append("paced")
    return printable("; ".join(parts) or d.state)


def _per_second(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}/s"


@app.command()
@database_options()
def pause(
    name: str = NAME_ARGUMENT,
    for_: str | None = typer.Option(
        None, "--for", callback=duration("--for"), help="How long: 90s, 10m, 2h, 1d. Without it: until resumed."
    ),
    reason: str | None = typer.Option(None, help="Why, shown with the pause (at most 500 characters)."),
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """Pause a destination: no executor claims for it until the time given, or until resumed (attempts already
    claimed finish). A destination without a row gets one, of the kind of the actions that name it."""
    from outbox import destinations as operator
    from outbox.cli.common import connect, out, print_json

    lasting = parse_duration("--for", for_) if for_ is not None else None
    with connect(db) as conn:
        paused = operator.pause(conn, name.strip(), lasting=lasting, reason=reason)
    if json_output:
        print_json(paused)
    else:
        out.print(f"destination {printable(paused.name)} is {state_text(paused)}")


@app.command()
@database_options()
def resume(
    name: str = NAME_ARGUMENT,
    json_output: bool = JSON_OPTION,
    *,
    db: Database,
) -> None:
    """Resume a destination: its pause (an operator's or a provider's) ends, and its breaker and learned pace
    are forgotten; a configured rate stays."""
    from outbox import destinations as operator
    from outbox.cli.common import connect, out, print_json

    with connect(db) as conn:
        resumed = operator.resume(conn, name.strip())
    if json_output:
        print_json(resumed)
    else:
        out.print(f"destination {printable(resumed.name)} is {state_text(resumed)}")
