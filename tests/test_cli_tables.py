"""The operator commands' tables off a terminal (captured, or a pipe to a real `outbox` process): at their
natural width when COLUMNS is not set, within COLUMNS when it is and the words fit; never a word or a
header cut in the middle, whatever the width."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.conftest import CliResult
from tests.test_executor_results import enqueue

Cli = Callable[..., CliResult]
ROOT = Path(__file__).resolve().parent.parent
# a lane key with no space: one word of 58 characters
LANE = "account:4815162342-workspace:1088-notification-preferences"
# a payload of forty distinct words: where each one ends up shows whether a line break cut one
NOTE = " ".join(f"word{n:02d}" for n in range(40))
HEADERS = ["id", "created (UTC)", "state", "stop reason", "kind", "lane", "attempts"]


def outbox(database_url: str, *args: str, columns: str | None) -> str:
    """A real `outbox` process, its stdout a pipe; COLUMNS as given (none when None)."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env |= {"OUTBOX_DATABASE_URL": database_url} | ({"COLUMNS": columns} if columns else {})
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout


def words(output: str) -> list[str]:
    """The words of a printed text, without the table's borders and the payload's quotes and braces."""
    return re.findall(r"[^\s'{}\u2500-\u257f]+", output)


def widest(output: str) -> int:
    return max(len(line) for line in output.splitlines())


def assert_whole(output: str, *expected: str) -> None:
    found = words(output)
    for text in expected:
        for word in words(text):
            assert word in found, f"{word!r} cut:\n{output}"


@pytest.fixture
def action(engine: Engine) -> int:
    return enqueue(engine, lane=LANE, payload={"note": NOTE})


def test_captured_tables_keep_their_natural_width_with_no_columns(
    cli: Cli, action: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    listed = cli("list").out
    assert_whole(listed, LANE, *HEADERS)
    assert widest(listed) > 80
    assert len([line for line in listed.splitlines() if LANE in line]) == 1
    shown = cli("show", str(action)).out
    assert any(NOTE in line for line in shown.splitlines()), shown  # the payload on one line


def test_captured_tables_fit_columns_between_words(cli: Cli, action: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "150")
    listed = cli("list").out
    assert_whole(listed, LANE, *HEADERS)
    assert 80 < widest(listed) <= 150
    monkeypatch.setenv("COLUMNS", "100")
    shown = cli("show", str(action)).out
    assert_whole(shown, NOTE, LANE)
    assert widest(shown) <= 100
    # narrower than its words: the table is wider than COLUMNS, every word and header whole
    monkeypatch.setenv("COLUMNS", "60")
    listed = cli("list").out
    assert_whole(listed, LANE, *HEADERS)
    assert widest(listed) > 60


# COLUMNS, and whether `list` and `show` fit in it with every word whole (the lane key alone is 58 wide)
@pytest.mark.parametrize(
    ("columns", "list_fits", "show_fits"), [("150", True, True), ("100", False, True), ("60", False, False)]
)
def test_a_piped_outbox_fits_columns_and_never_cuts_a_word(
    database_url: str, action: int, columns: str, list_fits: bool, show_fits: bool
) -> None:
    listed = outbox(database_url, "list", columns=columns)
    shown = outbox(database_url, "show", str(action), columns=columns)
    assert_whole(listed, LANE, *HEADERS)
    assert_whole(shown, NOTE, LANE)
    assert (widest(listed) <= int(columns), widest(shown) <= int(columns)) == (list_fits, show_fits)


def test_a_piped_outbox_with_no_columns_prints_tables_at_their_natural_width(database_url: str, action: int) -> None:
    listed = outbox(database_url, "list", columns=None)
    shown = outbox(database_url, "show", str(action), columns=None)
    assert_whole(listed, LANE, *HEADERS)
    assert widest(listed) > 80 and len([line for line in listed.splitlines() if LANE in line]) == 1
    assert any(NOTE in line for line in shown.splitlines()), shown
