"""A script of steps a local provider process reads from a file, so that another process can script it.

    the runner ──writes──▶ FILE (one step a line) ──each post takes the first line──▶ the API server's answer

`take` removes the first line and writes the rest back (atomically, by a rename); an absent or empty file
gives None, and the server answers as it would without a script. The caller holds its own lock around it.
"""

from __future__ import annotations

import os
from pathlib import Path


def take(path: Path | None) -> str | None:
    """The first step of the file at `path`, taken out of it; None when there is none."""
    if path is None or not path.exists():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return None
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(f"{line}\n" for line in lines[1:]))
    os.replace(partial, path)
    return lines[0].strip()


def write(path: Path, steps: list[str]) -> None:
    """Replace the file's steps with `steps` (atomically: a server reads either the old ones or these)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(f"{step}\n" for step in steps))
    os.replace(partial, path)
