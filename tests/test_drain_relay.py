"""The drain relay's rule, over every arrangement of runs and workers: as many runs as there are ONLINE
workers keep their executors, one per worker first (each worker's newest), so runs never pile onto one
worker while another holds none; every other run hands over; nothing hands over without a worker."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given
from hypothesis import strategies as st

from flows.drain import relieved_by

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

runs = st.lists(
    st.tuples(
        st.integers(0, 50).map(lambda s: EPOCH + timedelta(seconds=s)),
        st.uuids(),
        st.sampled_from(["worker:a", "worker:b", "worker:c", "worker:d"]),
    ),
    max_size=12,
    unique_by=lambda run: run[1],
)


@given(running=runs, workers=st.integers(0, 6))
def test_one_run_per_worker_keeps_its_executor_and_the_others_hand_over(
    running: list[tuple[datetime, UUID, str]], workers: int
) -> None:
    relieved = {run for _, run, _ in running if relieved_by(run, running, workers) is not None}
    if workers == 0:
        assert not relieved
        return
    kept = [(start, run, worker) for start, run, worker in running if run not in relieved]
    assert len(kept) == min(workers, len(running))
    per_worker = Counter(worker for _, _, worker in kept)
    holding = {worker for _, _, worker in running}
    # no worker keeps two runs while another that holds runs keeps none
    assert max(per_worker.values(), default=0) <= 1 or set(per_worker) == holding, (per_worker, holding)
    # a worker's run kept is its newest
    for start, _, worker in kept:
        if per_worker[worker] == 1:
            assert start == max(s for s, _, w in running if w == worker)


@given(running=runs, workers=st.integers(1, 15))
def test_without_worker_tags_the_newest_runs_keep_their_executors(
    running: list[tuple[datetime, UUID, str]], workers: int
) -> None:
    """Runs each on a worker of their own (untagged runs count so): the newest `workers` are kept."""
    alone = [(start, run, str(run)) for start, run, _ in running]
    relieved = {run for _, run, _ in alone if relieved_by(run, alone, workers) is not None}
    kept = [run for _, run, _ in sorted(alone, reverse=True)[:workers]]
    assert relieved == {run for _, run, _ in alone} - set(kept)


def test_a_run_not_among_the_running_is_never_relieved() -> None:
    others = [(EPOCH + timedelta(seconds=s), UUID(int=s + 1), "worker:a") for s in range(5)]
    assert relieved_by(UUID(int=99), others, 1) is None


def test_a_worker_that_took_a_new_run_hands_its_older_one_over_not_the_oldest() -> None:
    """Worker a held run 2 and took the tick's run 3; worker b holds run 1, the oldest: run 2 hands over."""
    running = [
        (EPOCH, UUID(int=1), "worker:b"),
        (EPOCH + timedelta(seconds=300), UUID(int=2), "worker:a"),
        (EPOCH + timedelta(seconds=600), UUID(int=3), "worker:a"),
    ]
    assert relieved_by(UUID(int=2), running, 2) == 3  # handed over, with three claiming
    assert relieved_by(UUID(int=1), running, 2) is None
    assert relieved_by(UUID(int=3), running, 2) is None
