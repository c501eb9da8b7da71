"""The chaos run of tests/test_chaos.py behind a PgBouncer in transaction pooling: the same invariants, each
read from the report of one short seeded run. A module of its own, so that `make test` runs it beside the
direct one."""

from __future__ import annotations

import pytest

from tests.test_chaos import (  # noqa: F401 (the invariants, collected here against this module's run)
    Run,
    chaos_run,
    test_a_reclaimed_event_was_read_back_by_its_subject,
    test_every_blackholed_executor_noticed_within_seconds,
    test_every_breach_is_explained_by_a_late_write,
    test_every_cut_off_executor_beat_again_after_the_network_came_back,
    test_every_executor_stopped_with_exit_0,
    test_every_fault_kind_was_injected,
    test_every_holder_frozen_after_the_provider_accepted_left_one_effect,
    test_every_kill_recovered,
    test_no_action_took_effect_twice,
    test_no_executor_exited_on_its_own,
    test_no_two_writes_overlapped_in_a_lane,
    test_nothing_was_lost,
    test_posts_ran_and_ended,
    test_the_brink_late_write_was_seen,
    test_the_receiver_absorbed_webhooks_sent_again,
    test_the_store_holds_each_marker_once,
    test_the_stream_holds_each_event_once,
    test_webhooks_and_events_ran_and_ended,
)


@pytest.fixture(scope="module", params=[pytest.param("short-pooler", marks=pytest.mark.chaos)])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return chaos_run(request.param, tmp_path_factory)
