"""Every command's --help, read through a pipe from the console script: no word of it is cut.

The commands are found by walking the command line's own tree, so a command added later is read too. A
word counts as whole when it appears, unbroken, in what the command printed: the words of the command's
help, of the first paragraph of each subcommand's help, of each option's help and its environment
variable's name.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from outbox.cli import app

OUTBOX = Path(sys.executable).parent / "outbox"


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command under `command` (a click command of typer's), by its path of names."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


COMMANDS = dict(commands(typer.main.get_command(app)))


def words(command: Any) -> set[str]:
    """What the help of `command` must hold, word by word."""
    texts = [inspect.cleandoc(command.help or "")]
    texts += [inspect.cleandoc(sub.help or "").split("\n\n")[0] for sub in getattr(command, "commands", {}).values()]
    for param in command.params:
        texts.append(getattr(param, "help", None) or "")
        if getattr(param, "show_envvar", False) and isinstance(param.envvar, str):
            texts.append(param.envvar)
    return {word for text in texts for word in text.split()}


def help_through_a_pipe(path: tuple[str, ...], columns: str | None) -> str:
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [str(OUTBOX), *path, "--help"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout


@pytest.mark.parametrize("columns", [None, "30"], ids=["pipe", "pipe-30-columns"])
@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda path: " ".join(path) or "outbox")
def test_no_word_of_any_help_is_cut(path: tuple[str, ...], columns: str | None) -> None:
    shown = help_through_a_pipe(path, columns)
    assert "…" not in shown
    cut = sorted(word for word in words(COMMANDS[path]) if word not in shown)
    assert not cut, (cut, shown)


def test_the_options_of_the_database_read_whole_in_a_pipe() -> None:
    shown = " ".join(help_through_a_pipe(("status",), None).split())
    for whole in (
        "OUTBOX_CONNECT_TIMEOUT_SECONDS",
        "OUTBOX_STATEMENT_TIMEOUT_SECONDS",
        "postgresql://user:password@host/db",
    ):
        assert whole in shown
    assert max(len(line) for line in help_through_a_pipe(("status",), None).splitlines()) <= 80


def test_a_group_lists_every_command_with_its_whole_summary() -> None:
    shown = " ".join(help_through_a_pipe((), None).split())
    assert "..." not in shown.replace("[ARGS]...", "")
    worker = COMMANDS[("worker",)]
    assert " ".join(inspect.cleandoc(worker.help or "").split("\n\n")[0].split()) in shown


@pytest.mark.parametrize("path", [(), ("db",)], ids=["outbox", "db"])
def test_a_group_without_a_command_prints_its_help_and_exits_2(path: tuple[str, ...]) -> None:
    done = subprocess.run([str(OUTBOX), *path], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "")
    assert done.stdout.startswith(f"Usage: outbox {' '.join(path)}".rstrip() + " [OPTIONS] COMMAND")
