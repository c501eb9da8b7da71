"""`outbox demo` itself, as the README's first command runs it: an embedded PostgreSQL, the SMTP sink, the
Prefect server, deployments, the exporter and workers; a small workload; its summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_runs_every_email_to_its_end_without_duplicates(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PREFECT_"))}
    env.update({"OUTBOX_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT), "COLUMNS": "160"})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "outbox.cli",
            "demo",
            "--emails",
            "60",
            "--lanes",
            "10",
            "--workers",
            "2",
            "--timeout",
            "400",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "60/60" in output, output[-4000:]
    lines = {line.strip("│ ").split("│")[0].strip(): line for line in output.splitlines() if "│" in line}
    assert "│ 0" in lines["duplicates at the sink"].replace("  ", " ")
    pickup = lines["pickup p50 / p95 / p99 (due to fence)"]
    assert re.search(r"[\d,]+ ms / [\d,]+ ms / [\d,]+ ms over \d+ actions", pickup), pickup
    for name in ("Prefect UI answers", "metrics answers", "mailbox answers"):
        assert "yes" in lines[name], lines.get(name)
    assert "using an embedded PostgreSQL" in output
