"""`outbox worker`: one replica of the Prefect deployments, a process worker that stops in order.

    outbox worker [options] [-- prefect worker options] ─exec─▶ python -m outbox_flows.worker (the supervisor)

The options are checked here; the supervisor (outbox_flows.worker, which imports Prefect) replaces this
process, so it has its PID and the signals sent to it."""

from __future__ import annotations

import socket

import typer

# the longest `outbox worker` waits for its runs to hand back: a fenced write has 60 s to finish
MAX_GRACE_SECONDS = 3_600


def worker(
    ctx: typer.Context,
    pool: str = typer.Option("outbox", help="The Prefect work pool (type process) to take runs from."),
    name: str | None = typer.Option(
        None, help="The worker's name in Prefect, and in its drain runs' names. Default: outbox-<hostname>."
    ),
    grace: float = typer.Option(
        90.0,
        min=0,
        max=MAX_GRACE_SECONDS,
        help="On SIGTERM, seconds the worker's runs get to hand back and end before they are killed.",
    ),
) -> None:
    """Run a Prefect process worker for outbox's deployments. On SIGTERM its drain runs hand back their
    actions and end Completed; runs not started yet end Cancelled. Options after `--` go to
    `prefect worker start`."""
    import importlib.util
    import os
    import sys

    missing = [module for module in ("prefect", "psutil") if importlib.util.find_spec(module) is None]
    if missing:
        raise ValueError(
            f"outbox worker needs the prefect extra ({', '.join(missing)} missing): pip install 'outbox[prefect]'"
        )
    if importlib.util.find_spec("outbox_flows") is None:
        raise ValueError("outbox worker cannot find outbox_flows (installed with outbox; in a clone, a link to flows/)")
    worker_name = name or f"outbox-{socket.gethostname()}"
    sys.stdout.flush()
    sys.stderr.flush()
    # the supervisor lives with the flows, which import Prefect: it takes this process over, so the signals
    # sent to `outbox worker` are its own
    supervisor = ["-m", "outbox_flows.worker", "--pool", pool, "--name", worker_name, "--grace", str(grace)]
    os.execv(sys.executable, [sys.executable, *supervisor, "--", *ctx.args])
