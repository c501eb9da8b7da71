"""The `outbox` command as the demo prints it, so that it runs as printed: `outbox` when that name on PATH
is this environment's, else the path of this environment's own (`.venv/bin/outbox` after `make demo`,
relative to the working folder when it lies under it)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def outbox_command() -> str:
    mine = Path(sys.executable).parent / "outbox"
    found = shutil.which("outbox")
    if found is not None and Path(found).resolve() == mine.resolve():
        return "outbox"
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)
