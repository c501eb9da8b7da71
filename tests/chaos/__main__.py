"""`python -m tests.chaos --seed N --minutes M [--pooler transaction|session | --cells 3] [--json out.json]`: one
chaos run, its report on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import tests.chaos
from tests.chaos.records import ChaosConfig
from tests.chaos.report import as_json, render
from tests.chaos.runner import run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description=tests.chaos.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, required=True, help="how long faults are injected")
    parser.add_argument("--rate", type=float, default=15.0, help="actions enqueued per second")
    parser.add_argument("--fault-gap", type=float, default=3.0, help="mean seconds between faults")
    parser.add_argument(
        "--pooler",
        choices=["transaction", "session"],
        default=None,
        help="executors reach PostgreSQL through a PgBouncer in this pool mode",
    )
    parser.add_argument(
        "--cells",
        type=int,
        choices=range(2, 4),
        default=0,
        help="this many cells, each its own PostgreSQL server, drained by executors that run outbox run --all-cells",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="journals and executor logs (kept)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON")
    args = parser.parse_args(argv)
    config = ChaosConfig(
        seed=args.seed,
        minutes=args.minutes,
        rate=args.rate,
        mean_fault_gap=args.fault_gap,
        server_url=os.environ.get("OUTBOX_CHAOS_DATABASE_URL"),
        pooler=args.pooler,
        cells=args.cells,
        work_dir=args.work_dir,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    report = run_chaos(config)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(as_json(report), indent=1))
    ok = not report.unexplained and not report.lost
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
