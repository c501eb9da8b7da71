"""Failover of a primary to its streaming standby, repeated: what synchronous replication keeps and what
asynchronous replication loses.

    python -m bench.failover --trials 5 --mode sync|async [--scenario kill|tail|both] [--seed 1]

    each trial (tests.replication.Failover, a fresh primary and standby, seed + trial number):
      kill  3 executors (`outbox run`, EMAIL, the multi-host URL) and a steady enqueue (25/s); the primary
            killed (SIGKILL) at a seeded moment while fences commit; the standby promoted 1 s later;
            enqueueing goes on on the new primary until every action there has ended
      tail  the same, with a deterministic lost tail first: the executors stopped for 1 s while enqueues
            pile up, the standby caught up, its WAL receiver paused (SIGSTOP), the executors resumed for 2 s
            (their claims, fences and results reach the primary alone), then the kill, the WAL the paused
            receiver still held dropped, and the promotion
    ─▶ one Markdown row per scenario: emails sent twice, acknowledged enqueues missing after the promotion,
       and the seconds from the promotion to each executor's first heartbeat on the new primary

Every server and process is the trial's own and stopped by PID or data folder when the trial ends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tests.replication import Failover, FailoverConfig, FailoverResult


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def trial(mode: str, scenario: str, seed: int) -> FailoverResult:
    config = FailoverConfig(synchronous=mode == "sync", seed=seed, lost_tail=scenario == "tail")
    result = Failover(config).run()
    reconnects = ", ".join(f"{s:.2f}" for s in result.reconnects)
    print(
        f"  {mode} {scenario} seed {seed}: {result.acked} acknowledged, {result.emails} emails,"
        f" {len(result.duplicates)} sent twice, {len(result.lost)} lost, {result.pending_at_pause} waiting at"
        f" the pause, heartbeats after {reconnects} s, settled {result.settle_seconds:.1f} s after the promotion"
        f" ({result.wall_seconds:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return result


def row(mode: str, scenario: str, results: list[FailoverResult]) -> str:
    reconnects = [s for r in results for s in r.reconnects]
    missing = sum(len(r.reconnect_seconds) - len(r.reconnects) for r in results)
    firsts = [r.first_email_seconds for r in results if r.first_email_seconds is not None]
    twice = [len(r.duplicates) for r in results]
    lost = [len(r.lost) for r in results]
    promote = statistics.median(r.promote_seconds for r in results)
    settle = max(r.settle_seconds for r in results)
    return (
        f"| {mode} | {scenario} | {len(results)} | {sum(r.acked for r in results)} | {sum(r.emails for r in results)}"
        f" | {sum(twice)} ({_spread(twice)}) | {sum(lost)} ({_spread(lost)})"
        f" | {sum(r.pending_at_pause for r in results) if scenario == 'tail' else '-'}"
        f" | {_seconds(reconnects)}{f' ({missing} never)' if missing else ''} | {_seconds(firsts)}"
        f" | {promote:.2f} | {settle:.1f} | {sum(len(r.uncertain) for r in results)} |"
    )


HEADER = (
    "| replication | scenario | trials | enqueues acknowledged | emails received | sent twice (per trial)"
    " | acknowledged, lost (per trial) | waiting at the pause | promotion to first heartbeat, s: median / max"
    " | promotion to first email, s: median / max | promote, s | settled after, s (max) | UNCERTAIN |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def _spread(values: list[int]) -> str:
    return f"{min(values)}-{max(values)}" if values else "-"


def _seconds(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mode", choices=["sync", "async"], required=True)
    parser.add_argument("--scenario", choices=["kill", "tail", "both"], default="both")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    scenarios = ["kill", "tail"] if args.scenario == "both" else [args.scenario]
    started, load_before = time.monotonic(), load_average()
    rows = []
    for scenario in scenarios:
        results = [trial(args.mode, scenario, args.seed + n) for n in range(args.trials)]
        rows.append(row(args.mode, scenario, results))
    print(HEADER)
    print("\n".join(rows))
    print(
        f"\n{args.trials} trials per scenario, seeds {args.seed}-{args.seed + args.trials - 1};"
        f" {time.monotonic() - started:.0f} s wall; load average {load_before} at the start,"
        f" {load_average()} at the end."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
