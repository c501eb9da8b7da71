"""Pickup behind PgBouncer: what polling costs against LISTEN, alternated within every round.

    python -m bench.pooled_pickup [--rounds 3] [--actions 200] [--rate 20]

Each round runs, in turn, one idle executor (`outbox run`, the no-op pickup adapter) reached
  direct          straight to PostgreSQL, woken by LISTEN/NOTIFY;
  pooled          through PgBouncer in transaction pooling: no LISTEN there, so it polls every second;
  pooled+listen   through the pooler, with OUTBOX_LISTEN_DATABASE_URL a direct connection,
and enqueues `--actions` actions one per transaction at `--rate` per second; the pickup of one action is
its enqueue's commit to its adapter's start. Prints p50/p95/max per set-up, the median over rounds, and the
load average. PgBouncer is Debian's (`/usr/sbin/pgbouncer`), started and stopped here.
"""

from __future__ import annotations

import argparse
import os
import statistics

from sqlalchemy.engine import make_url

from bench import harness
from bench.executor import pickup
from tests.pgbouncer import PgBouncer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    server = harness.server_url()
    bouncer = PgBouncer(server, "transaction", pool_size=4)

    def pooled(url: str) -> str:
        return bouncer.url(make_url(url).database or "")

    setups = {
        "direct": {"through": str, "listens": True},
        "pooled": {"through": pooled, "listens": False},
        "pooled+listen": {"through": pooled, "listens": True, "listen_direct": True},
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in setups}
    loads = [os.getloadavg()[0]]
    try:
        for _ in range(args.rounds):
            for name, setup in setups.items():
                env = {}
                if setup.get("listen_direct"):
                    env["OUTBOX_LISTEN_DATABASE_URL"] = (
                        make_url(server).set(database="bench_pickup").render_as_string(hide_password=False)
                    )
                ms = pickup(
                    server,
                    args.actions,
                    args.rate,
                    through=setup["through"],  # type: ignore[arg-type]
                    extra_env=env,
                    listens=bool(setup["listens"]),
                )
                q = statistics.quantiles(ms, n=100)
                results[name].append((q[49], q[94], max(ms)))
                loads.append(os.getloadavg()[0])
    finally:
        bouncer.stop()
    print(f"pickup, enqueue commit to adapter start: {args.actions} actions at {args.rate:g}/s, {args.rounds} rounds")
    print(f"load average (1 min) during the run: {min(loads):.2f}-{max(loads):.2f}\n")
    print("| set-up | p50 ms (median, rounds) | p95 ms (median, rounds) | max ms (worst round) |")
    print("| --- | --- | --- | --- |")
    for name, rounds in results.items():
        p50s, p95s, maxes = zip(*rounds, strict=True)
        print(
            f"| {name} | {statistics.median(p50s):.1f} ({min(p50s):.1f}-{max(p50s):.1f})"
            f" | {statistics.median(p95s):.1f} ({min(p95s):.1f}-{max(p95s):.1f}) | {max(maxes):.1f} |"
        )


if __name__ == "__main__":
    main()
