"""The chaos run in cells: three cells, each its own PostgreSQL server, drained by 4 executor processes that each
run `outbox run --all-cells` (one executor per cell in one process, as a fleet serving every cell runs them). The
workload's lanes are spread over the cells (each lane lives in one); among the faults of tests/test_chaos.py, a
cell's primary is SIGKILLed (its postmaster: no shutdown) and started again through crash recovery, a cell's
server restarted, a cell's connections terminated, while the other cells carry on. The invariants are read from
the report of one short seeded run, overall and per cell: no duplicate, no lane overlap, nothing lost in any
cell. A long run: `python -m tests.chaos --seed N --minutes M --cells 3`."""

from __future__ import annotations

import os

import pytest

from tests.chaos.records import CELL_NAMES, ChaosConfig
from tests.chaos.report import render
from tests.chaos.runner import run_chaos
from tests.test_chaos import (  # noqa: F401 (the invariants, collected here against this module's run)
    NETWORK_FAULTS,
    PROCESS_FAULTS,
    SHORT_MINUTES,
    SHORT_SEED,
    Run,
    test_every_breach_is_explained_by_a_late_write,
    test_every_executor_stopped_with_exit_0,
    test_every_kill_recovered,
    test_no_action_took_effect_twice,
    test_no_executor_exited_on_its_own,
    test_no_two_writes_overlapped_in_a_lane,
    test_nothing_was_lost,
    test_the_brink_late_write_was_seen,
    test_the_store_holds_each_marker_once,
    test_the_stream_holds_each_event_once,
    test_webhooks_and_events_ran_and_ended,
)

CELLS = 3


@pytest.fixture(scope="module", params=[pytest.param("short-cells", marks=pytest.mark.chaos)])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    server = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    config = ChaosConfig(
        seed=SHORT_SEED,
        minutes=SHORT_MINUTES,
        server_url=server,
        cells=CELLS,
        work_dir=tmp_path_factory.mktemp("chaos-cells"),
        log=lambda _: None,
    )
    report = run_chaos(config)
    print(render(report))
    return Run(report, restartable=server is None)


def test_every_cell_had_work_and_drained_it(run: Run) -> None:
    """Every cell held a share of the workload, and most of each cell's actions ended DONE."""
    cells = run.report.by_cell
    assert set(cells) == set(CELL_NAMES[:CELLS]), run.table
    for figures in cells.values():
        assert figures["actions"] >= 100, run.table
        assert figures["ended DONE"] >= figures["actions"] // 2, run.table


@pytest.mark.parametrize("cell", CELL_NAMES[:CELLS])
def test_no_cell_has_a_duplicate_an_overlap_or_a_lost_action(run: Run, cell: str) -> None:
    figures = run.report.by_cell[cell]
    assert figures["duplicates"] == 0 and figures["overlaps"] == 0 and figures["lost"] == 0, run.table
    assert figures["breaches not explained by a late write"] == 0, run.table


def test_the_cells_faults_were_injected(run: Run) -> None:
    """The executors' faults, and the cells' own: a primary SIGKILLed and started again, a server restarted,
    connections terminated (each in some cell)."""
    injected = {name.split(" (")[0].split(":")[0] for name, n in run.report.faults.items() if n}
    expected = {*PROCESS_FAULTS, *NETWORK_FAULTS, "pg_terminate_backend", "brink", "erasure"}
    if run.restartable:
        expected |= {"cell primary SIGKILL", "PostgreSQL restart"}
    assert expected <= injected, run.table
    by_cell = run.report.cell_faults
    if run.restartable:
        assert sum(counts["cell primary SIGKILL"] for counts in by_cell.values()) >= 1, run.table
