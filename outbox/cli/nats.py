"""`outbox nats ensure-stream`: make the JetStream stream the NATS_EVENT kind publishes to, or check it.

    OUTBOX_NATS_URL ─▶ outbox.nats.streams.ensure_stream ─▶ created (exit 0)
                                                         ─▶ present, what read-back needs is there (exit 0)
                                                         ─▶ present, it is not: each difference, exit 1

An existing stream is never changed. Bad input is one line and exit 2; a server that cannot be reached or
that refuses is one line and exit 1, the URL's password shown as ***.
"""

from __future__ import annotations

import typer

from outbox.cli.options import duration, parse_duration

app = typer.Typer(no_args_is_help=True, help="The NATS JetStream stream that NATS_EVENT actions are published to.")


@app.command("ensure-stream")
def ensure_stream(
    stream: str = typer.Option(..., "--stream", help="The stream's name, such as ORDERS."),
    subjects: list[str] = typer.Option(  # noqa: B008 (typer's way to declare a repeatable option)
        ..., "--subject", help="A subject the stream takes, such as 'orders.>' (repeatable)."
    ),
    duplicate_window: str = typer.Option(
        "2m", callback=duration("--duplicate-window"), help="How long JetStream drops a repeated Nats-Msg-Id."
    ),
    max_age: str | None = typer.Option(None, help="How long messages are kept (7d); unset: no limit by age."),
    replicas: int = typer.Option(1, min=1, max=5, help="Copies of the stream in a cluster."),
) -> None:
    """Create a limits-retention, file-storage stream if it is missing; if it exists, check that read-back
    can use it (limits retention, the subjects covered) and say what differs, changing nothing."""
    import asyncio

    from outbox.cli.common import out
    from outbox.cli.options import printable
    from outbox.nats.settings import load_config
    from outbox.nats.streams import StreamSpec
    from outbox.nats.streams import ensure_stream as ensure

    asked = StreamSpec(
        name=stream,
        subjects=tuple(subjects),
        duplicate_window_seconds=parse_duration("--duplicate-window", duplicate_window).total_seconds(),
        max_age_seconds=parse_duration("--max-age", max_age).total_seconds() if max_age is not None else None,
        replicas=replicas,
    )
    ensured = asyncio.run(ensure(load_config(), asked))
    if ensured.created:
        out.print(f"created stream {stream} taking {', '.join(asked.subjects)} (limits retention, file storage)")
        return
    for note in ensured.notes:
        out.print(f"note: stream {stream}: {printable(note)} (left as it is)")
    if ensured.problems:
        for problem in ensured.problems:
            out.print(f"stream {stream}: {printable(problem)}")
        out.print(f"stream {stream} exists and was not changed; read-back cannot rely on it as it is")
        raise typer.Exit(1)
    out.print(f"stream {stream} exists and takes {', '.join(asked.subjects)} with limits retention")
