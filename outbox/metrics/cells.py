"""CellsCollector: one exporter for several cells, each metric with a `cell` label (the cells file's names).

    a scrape ──▶ every cell's OutboxCollector.begin, at once: its fresh snapshot, or its flight (a snapshot
                 read on a thread of its own, as for a single database)
             ──▶ each cell's answer, waited for against the same clock: a cell whose database is down or slow
                 gives `outbox_exporter_up{cell="x"} 0` once its own `wait_seconds` have passed
             ──▶ each family once, its samples from every cell, each with cell="<name>" added

The cells are read side by side, never one after the other: a scrape answers within the longest
`wait_seconds` of its cells (5 s), whatever the number of cells and however many of them hang, which is
inside Prometheus's default scrape timeout (10 s); give a scrape job a `scrape_timeout` of at least 6 s.
A cell that does not answer costs the others nothing: their snapshots are read by their own threads, on
their own connections, each with its own timeouts (connect 2 s, statement 2 s).

A single database's exporter does not use this module: its series carry no `cell` label.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from outbox.metrics.collector import OutboxCollector

CELL_LABEL = "cell"


class CellsCollector(Collector):
    """Every metric of every cell's collector, in one exposition, each sample labelled with its cell."""

    def __init__(self, collectors: Mapping[str, OutboxCollector]) -> None:
        self._collectors = dict(collectors)

    def describe(self) -> Iterable[Metric]:
        return []  # no query when the collector is registered

    def collect(self) -> Iterable[Metric]:
        started, now = time.perf_counter(), time.monotonic()
        deadlines = {name: now + collector.wait_seconds for name, collector in self._collectors.items()}
        begun = {name: collector.begin() for name, collector in self._collectors.items()}
        merged: dict[str, Metric] = {}
        for name, collector in self._collectors.items():
            found = collector.finish(begun[name], deadlines[name])
            for family in collector.answer(found, started):
                labelled(merged, family, name)
        return list(merged.values())


def labelled(merged: dict[str, Metric], family: Metric, cell: str) -> None:
    """Add `family`'s samples to its family in `merged` (made on first sight), each with cell=`cell`."""
    into = merged.get(family.name)
    if into is None:
        into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
    into.samples.extend(s._replace(labels={**s.labels, CELL_LABEL: cell}) for s in family.samples)
