"""Start-up of the `outbox` command beside its peers' commands, alternated within every round.

    python -m bench.cli_startup --database-url postgresql://... [--rounds 30]

Each round runs every command once, in a new shuffled order, each a fresh process (what an operator who
runs `outbox status` in a loop pays every time): `outbox --help`, `outbox status` and `outbox list` on the
given database, and, when the peers are installed in this virtualenv (the `bench` extra),
`procrastinate --help` and `pgq --help`. It prints the median and the p10-p90 spread of each command's
wall time, and the load average before and after the run.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def commands(database_url: str) -> dict[str, list[str]]:
    outbox = str(BIN / "outbox")
    chosen = {
        "outbox --help": [outbox, "--help"],
        "outbox status": [outbox, "status", "--database-url", database_url],
        "outbox list": [outbox, "list", "--database-url", database_url],
    }
    for name, argv in (("procrastinate --help", ["procrastinate", "--help"]), ("pgq --help", ["pgq", "--help"])):
        found = shutil.which(argv[0], path=str(BIN))
        if found:
            chosen[name] = [found, *argv[1:]]
    return chosen


def timed(argv: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True, help="a migrated outbox database")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    chosen = commands(args.database_url)
    for argv in chosen.values():  # warm the file cache; a failing command stops the run here
        timed(argv)
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {name: [] for name in chosen}
    rng = random.Random(1)
    for _ in range(args.rounds):
        order = list(chosen)
        rng.shuffle(order)
        for name in order:
            seconds[name].append(timed(chosen[name]))
    load_after = os.getloadavg()
    print(f"{args.rounds} rounds; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"{'command':<22} {'median s':>9} {'p10 s':>7} {'p90 s':>7}")
    for name, values in seconds.items():
        deciles = statistics.quantiles(values, n=10)
        print(f"{name:<22} {statistics.median(values):>9.3f} {deciles[0]:>7.3f} {deciles[-1]:>7.3f}")


if __name__ == "__main__":
    main()
