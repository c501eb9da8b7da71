"""The plots beside the headline table of docs/benchmarks.md, drawn from the same figures.

    figures below (each copied from the bench/RESULTS.md section named beside it) ─▶ matplotlib ─▶ docs/img/*.png

    .venv-bench/bin/python -m bench.headline [--out docs/img]

Nothing is measured here: the figures are those of the log, so the plots say no more than the table. When
a newer section of bench/RESULTS.md replaces a figure, change it here and in the table, and run this again.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.peers import ROOT

# -- "Side by side with pgqueuer, procrastinate and DBOS, on the code of 2026-12-04 (busy machine)" (10fa7cb,
# load 4 to 15): burn-down of 30,000 no-op jobs by 2 workers, jobs/s, its 3 rounds (procrastinate cut at 60 s)
BURN_DOWN: dict[str, list[float]] = {
    "outbox, defaults": [1960, 1640, 1687],
    "outbox, 256 / 200": [2680, 2321, 2290],
    "pgqueuer-10": [941, 984, 1721],
    "pgqueuer-50": [3980, 4280, 3204],
    "procrastinate": [106, 103, 107],
    "DBOS": [685, 881, 959],
}
# pickup at 50 jobs/s, enqueue commit to job start: p50, p95, p99 in ms (the same run)
PICKUP: dict[str, tuple[float, float, float]] = {
    "outbox": (6.6, 17.5, 29.8),
    "pgqueuer-10": (3.6, 15.0, 62.8),
    "pgqueuer-50": (5.1, 20.1, 62.9),
    "procrastinate": (43.4, 995.2, 1041.7),
    "DBOS": (84.4, 183.4, 252.8),
}
# the SQL-only loops of the same run: backend CPU µs per job, the median of 3 rounds
LOOPS: dict[str, float] = {"bare table": 35.0, "contract-minimal": 76.0, "outbox": 101.0}
LOOPS_TARGET = 1.3  # outbox's loop at most this times contract-minimal's

# -- "Throttled relays: the opening shortened" (2026-12-03): the cases a first pace changes on 2cb87a2,
# the others on 9ece861 (the same code for them). 5,000 emails, a relay of 20/s: refused in all, refused
# after the first 10 s (both as % of the 5,000 accepted), the drain against the ideal 250 s
THROTTLE: dict[str, tuple[float, float, float]] = {
    "500 lanes, 454, 2 ex.": (1.6, 0.7, 1.00),
    "5,000 lanes, 454, 2 ex.": (1.8, 0.7, 1.00),
    "500 lanes, 421, 2 ex.": (3.4, 0.7, 1.00),
    "5,000 lanes, 421, 2 ex.": (2.5, 0.6, 1.00),
    "500 lanes, 454, 3 ex.": (3.9, 0.8, 1.02),
    "5,000 lanes, 454, 3 ex.": (2.6, 0.9, 1.00),
    "500 lanes, 421, 3 ex.": (2.8, 0.8, 1.00),
    "5,000 lanes, 421, 3 ex.": (2.3, 0.8, 1.00),
    "500 lanes, 454, rate given": (0.0, 0.0, 1.00),
    "5,000 lanes, 454, rate given": (0.0, 0.0, 1.00),
}
THROTTLE_TARGET = 5.0  # refused, % of the accepted

# -- "Tracing: outbox's own share, against a no-op attempt and a webhook delivery (busy machine)" (2026-12-04,
# 7c3ccbf, load 6.2 to 9.8): the in-process executor's CPU per no-op action in its burn-down, µs, median of 5 rounds
TRACING: dict[str, float] = {
    "no OpenTelemetry": 84,
    "the API alone": 95,
    "SDK, 1 trace in 10": 209,
    "SDK, every trace": 240,
}


def bars(ax: Any, labels: list[str], values: list[float], ends: list[float] | None = None, **kwargs: Any) -> None:
    """Horizontal bars, the first label on top, each value written past its bar (or past its end in `ends`)."""
    positions = list(range(len(labels)))[::-1]
    ax.barh(positions, values, **kwargs)
    ax.set_yticks(positions)
    ax.set_yticklabels(labels)
    for y, value, end in zip(positions, values, ends or values, strict=True):
        ax.text(end, y, f" {value:,.1f}" if value < 100 else f" {value:,.0f}", va="center", fontsize=8)


def plot_peers(plt: Any, out: Path) -> None:
    fig, (burn, pickup) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = list(BURN_DOWN)
    medians = [sorted(r)[len(r) // 2] for r in BURN_DOWN.values()]
    spans = [
        [m - min(r) for m, r in zip(medians, BURN_DOWN.values(), strict=True)],
        [max(r) - m for m, r in zip(medians, BURN_DOWN.values(), strict=True)],
    ]
    bars(burn, names, medians, [max(r) for r in BURN_DOWN.values()], xerr=spans, capsize=3, color="#4c72b0")
    burn.set_xlabel("jobs/s, median of the rounds (the line spans them)")
    burn.set_title("Burn-down: 30,000 no-op jobs, 2 workers (2026-12-04, load 4 to 15)", fontsize=10)
    burn.grid(alpha=0.3, axis="x")
    systems = list(PICKUP)
    width = 0.27
    for i, (q, color) in enumerate(zip(("p50", "p95", "p99"), ("#4c72b0", "#dd8452", "#c44e52"), strict=True)):
        values = [PICKUP[s][i] for s in systems]
        pickup.bar([x + (i - 1) * width for x in range(len(systems))], values, width, label=q, color=color)
    pickup.set_xticks(range(len(systems)))
    pickup.set_xticklabels(systems, fontsize=8)
    pickup.set_yscale("log")
    pickup.set_ylabel("ms (log)")
    pickup.set_title("Pickup at 50 jobs/s: enqueue commit to job start (same run)", fontsize=10)
    pickup.grid(alpha=0.3, axis="y")
    pickup.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "peers.png", dpi=100)
    plt.close(fig)


def plot_limits(plt: Any, out: Path) -> None:
    fig, (loops, tracing) = plt.subplots(1, 2, figsize=(11, 3.2))
    bars(loops, list(LOOPS), list(LOOPS.values()), color="#55a868")
    limit = LOOPS_TARGET * LOOPS["contract-minimal"]
    loops.axvline(limit, color="#c44e52", linestyle="--", label=f"target: {LOOPS_TARGET}x contract-minimal")
    loops.set_xlabel("backend CPU µs per job (median of the rounds)")
    loops.set_title("SQL-only loops, 2 processes (2026-12-04, load 8 to 12)", fontsize=10)
    loops.legend(fontsize=8, loc="upper right")
    loops.grid(alpha=0.3, axis="x")
    bars(tracing, list(TRACING), list(TRACING.values()), color="#8172b3")
    tracing.set_xlabel("executor CPU µs per action (median of 5 rounds)")
    tracing.set_title("Tracing, a no-op burn-down (2026-12-04, load 6 to 10)", fontsize=10)
    tracing.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(out / "limits-tracing.png", dpi=100)
    plt.close(fig)


def plot_throttle(plt: Any, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 3.6))
    cases = list(THROTTLE)
    positions = list(range(len(cases)))[::-1]
    total = [THROTTLE[c][0] for c in cases]
    after = [THROTTLE[c][1] for c in cases]
    ax.barh([p + 0.2 for p in positions], total, 0.4, label="refused in all", color="#dd8452")
    ax.barh([p - 0.2 for p in positions], after, 0.4, label="refused after the first 10 s", color="#4c72b0")
    for y, refused, later in zip(positions, total, after, strict=True):
        ax.text(refused, y + 0.2, f" {refused:.1f} %", va="center", fontsize=7)
        ax.text(later, y - 0.2, f" {later:.1f} %", va="center", fontsize=7)
    ax.axvline(THROTTLE_TARGET, color="#c44e52", linestyle="--", label=f"target: at most {THROTTLE_TARGET:.0f} %")
    ax.set_yticks(positions)
    ax.set_yticklabels([f"{c} (drain {THROTTLE[c][2]:.2f}x)" for c in cases], fontsize=8)
    ax.set_xlabel("% of the 5,000 emails accepted")
    ax.set_title(
        "5,000 emails through a relay that takes 20/s and refuses the rest (2026-12-03, load 0.5 to 1.5)", fontsize=10
    )
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(out / "throttle.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder of the plots (made if new)")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    plot_peers(plt, args.out)
    plot_limits(plt, args.out)
    plot_throttle(plt, args.out)
    for png in sorted(args.out.glob("*.png")):
        print(png.relative_to(ROOT))


if __name__ == "__main__":
    main()
