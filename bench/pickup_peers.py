"""Pickup against pgqueuer at its default batch size, in samples of 100, the systems alternated in every round.

    .venv-bench/bin/python -m bench.pickup_peers [--rounds 5] [--jobs 100] [--rate 50] [--only outbox pgqueuer-10]

    every round, in a rotated order, for each system (bench.compare's: outbox tuned, outbox-defaults, pgqueuer-10):
      a fresh database, two idle workers, a producer enqueueing `--jobs` jobs one per transaction at `--rate`/s
      (bench.compare.produce_run) ─▶ each job's pickup: its enqueue's commit to its start in a worker
    ─▶ per round and system: p50, p95 of the sample; per system: the median of the rounds' p50 and p95 and their
       spread; outbox / pgqueuer-10 per round and the median of those ratios; the load average before and after
       every sample

One sample of 100 tells a p95 by its sixth-slowest job: the rounds' spread says how far one sample may be off.
A producer stamps a commit once its call returned: a producer process waiting for a core (a loaded machine) stamps
late, and a job then starts "before" its commit; the rounds say how many, and such a sample tells nothing.
The server is OUTBOX_BENCH_DATABASE_URL or the benchmarks' embedded PostgreSQL (bench.harness).
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench import harness
from bench.compare import DEFAULTS, SYSTEMS, Server, produce_run, quantile

REFERENCE = "pgqueuer-10"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--only", nargs="*", default=["outbox", DEFAULTS.name, REFERENCE])
    args = parser.parse_args()
    systems = [s for s in [*SYSTEMS, DEFAULTS] if s.name in args.only]
    if REFERENCE not in [s.name for s in systems]:
        parser.error(f"--only must name {REFERENCE}, the reference")
    db = Server(harness.server_url())
    print(f"load average at the start: {load()}", flush=True)
    samples: dict[str, list[tuple[float, float]]] = {s.name: [] for s in systems}
    for rnd in range(args.rounds):
        for system in systems[rnd % len(systems) :] + systems[: rnd % len(systems)]:
            before = load()
            run = produce_run(db, system, args.rate, args.jobs / args.rate, "pickup")
            picked = run.latencies_ms
            if len(picked) != args.jobs:
                raise RuntimeError(f"{system.name}: {len(picked)} of {args.jobs} jobs picked up")
            samples[system.name].append((quantile(picked, 50), quantile(picked, 95)))
            p50, p95 = samples[system.name][-1]
            early = sum(ms < 0 for ms in picked)
            print(
                f"  round {rnd + 1} {system.name:15} p50 {p50:6.1f} ms, p95 {p95:6.1f} ms"
                f"{f', {early} before their commit stamp' if early else ''} (load {before}, then {load()})",
                flush=True,
            )
    print(f"load average at the end: {load()}\n")
    print(f"pickup, enqueue commit to job start: {args.jobs} jobs at {args.rate:g}/s a sample, {args.rounds} rounds")
    print(f"| system | p50 ms, median (spread) | p95 ms, median (spread) | p50 / {REFERENCE} | p95 / {REFERENCE} |")
    print("| --- | ---: | ---: | ---: | ---: |")
    reference = samples[REFERENCE]
    for name, rounds in samples.items():
        cells = []
        for i in (0, 1):
            values = [r[i] for r in rounds]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        for i in (0, 1):
            ratios = [a[i] / b[i] for a, b in zip(rounds, reference, strict=True)]
            cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
