"""The drain relay's rule, over every arrangement of runs and workers: the newest runs, as many as there are
ONLINE workers, keep their executors; every older run hands over; nothing hands over without a worker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given
from hypothesis import strategies as st

from flows.drain import relieved_by

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

runs = st.lists(
    st.tuples(st.integers(0, 50).map(lambda s: EPOCH + timedelta(seconds=s)), st.uuids()),
    max_size=12,
    unique_by=lambda run: run[1],
)


@given(running=runs, workers=st.integers(0, 15))
def test_the_newest_runs_keep_their_executors_and_the_older_hand_over(
    running: list[tuple[datetime, UUID]], workers: int
) -> None:
    relieved = {run for _, run in running if relieved_by(run, running, workers) is not None}
    if workers == 0:
        assert not relieved
        return
    kept = [run for _, run in sorted(running, reverse=True)[:workers]]
    assert relieved == {run for _, run in running} - set(kept)
    assert len(running) - len(relieved) == min(workers, len(running))


def test_a_run_not_among_the_running_is_never_relieved() -> None:
    others = [(EPOCH + timedelta(seconds=s), UUID(int=s + 1)) for s in range(5)]
    assert relieved_by(UUID(int=99), others, 1) is None


def test_the_count_of_newer_runs_is_reported() -> None:
    running = [(EPOCH + timedelta(seconds=s), UUID(int=s + 1)) for s in range(4)]
    assert relieved_by(UUID(int=1), running, 2) == 3  # the oldest, with three newer
    assert relieved_by(UUID(int=3), running, 2) is None  # the second newest stays
