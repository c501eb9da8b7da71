"""How `outbox --help` and every command's `--help` read: plain text, broken only between words.

Rich help cuts a word longer than its column with an ellipsis (an environment variable's name, a URL),
and it is 80 columns wide whenever the output is not a terminal; click's plain help breaks a long word,
and a word at its hyphens, across two lines. Here the help is click's layout with lines broken only at
spaces (a word longer than its line stands whole on a line of its own), `help_width()` wide: the
terminal's width held between 80 and 100 columns, 80 in a pipe or a file. A group lists each of its
commands with the whole first paragraph of its help, where click would shorten it to end in "...";
a group given no command prints its help on stdout and exits 2.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap
from collections.abc import Iterable
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:  # the click that typer runs on: its own copy of click in the releases outbox installs
    from typer._click import Command, Context, HelpFormatter
else:
    Context = TyperGroup.context_class
    HelpFormatter = Context.formatter_class

MIN_WIDTH, MAX_WIDTH = 80, 100


def help_width() -> int:
    """The terminal's width (COLUMNS when set; 80 off a terminal), held between 80 and 100."""
    return max(MIN_WIDTH, min(shutil.get_terminal_size().columns, MAX_WIDTH))


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """The lines of `text`, its paragraphs filled to `width` and broken only at spaces."""
    lines: list[str] = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if lines:
            lines.append("")
        lines += textwrap.wrap(
            " ".join(paragraph.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return lines


class WholeWordsFormatter(HelpFormatter):
    """Click's help layout, its text broken only at spaces."""

    def write_text(self, text: str) -> None:
        self.write("".join(line + "\n" for line in wrap(text, self.width, " " * self.current_indent)))

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_width = min(max((len(first) for first, _ in rows), default=0), col_max) + col_spacing
        indent = " " * self.current_indent
        beside = indent + " " * first_width
        for first, text in rows:
            lines = wrap(text, max(self.width - len(beside), 10))
            if not lines:
                self.write(f"{indent}{first}\n")
                continue
            head = f"{indent}{first:<{first_width}}" if len(first) <= first_width - col_spacing else None
            if head is None:  # a long option and its type: the text starts on the next line
                self.write(f"{indent}{first}\n")
                head = beside
            self.write(head + lines[0] + "\n" + "".join(beside + line + "\n" for line in lines[1:]))


class WholeHelpContext(Context):
    formatter_class = WholeWordsFormatter


def summary(command: Command) -> str:
    """The first paragraph of `command`'s help, on one line, whole."""
    if command.short_help:
        return command.short_help
    text = inspect.cleandoc(command.help or "").split("\f")[0]
    return " ".join(text.split("\n\n")[0].split())


class WholeHelpGroup(TyperGroup):
    """A command group whose help, and its commands' help, is broken only between words, and which lists
    each command with the whole first paragraph of its help."""

    context_class = WholeHelpContext

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        for command in self.commands.values():
            command.context_class = WholeHelpContext

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:  # the help itself, exit 2
            typer.echo(ctx.get_help())
            raise typer.Exit(2)
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        rows = [(name, summary(command)) for name, command in commands if command and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
