"""`python -m demo`: what `outbox demo` runs once it has checked its options, the `demo` extra and the clone.

    --actions --lanes --workers --flaky --unsubscribe --timeout [--keep-running], and OUTBOX_DATABASE_URL
    ─▶ run.run_demo ─▶ exit 0; an error of outbox's or of the database ─▶ one line on stderr, its exit code

`outbox demo` passes every option on (the database URL in the environment, never on the command line),
so each one is required here. A failure is reported as every `outbox` command reports it: one line, no
password, exit 2 for an error of outbox's, 1 for the database.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from demo.run import run_demo
from outbox.cli.common import database_failure
from outbox.cli.options import hide_passwords, printable, remember_passwords
from outbox.errors import OutboxError


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(prog="python -m demo", description="Run by `outbox demo`.")
    for name, kind in (("actions", int), ("lanes", int), ("workers", int)):
        options.add_argument(f"--{name}", type=kind, required=True)
    for name in ("flaky", "unsubscribe", "timeout"):
        options.add_argument(f"--{name}", type=float, required=True)
    options.add_argument("--keep-running", action="store_true")
    return options


def failure(error: Exception) -> tuple[int, str] | None:
    """The exit code and line for `error`, or None for a fault of the demo's own (a traceback)."""
    if isinstance(error, OutboxError):
        return getattr(error, "exit_code", 2), str(error)
    return database_failure(error)


def main(argv: Sequence[str]) -> None:
    options = parser().parse_args(argv)
    remember_passwords(argv, os.environ)
    try:
        run_demo(
            actions=options.actions,
            lanes=options.lanes,
            workers=options.workers,
            flaky=options.flaky,
            unsubscribe=options.unsubscribe,
            timeout=options.timeout,
            keep_running=options.keep_running,
            given_url=os.environ.get("OUTBOX_DATABASE_URL") or None,
        )
    except Exception as error:
        reported = failure(error)
        if reported is None:
            raise
        code, message = reported
        print(f"error: {printable(hide_passwords(message))}", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
