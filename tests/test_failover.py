"""outbox across a PostgreSQL failover: a primary and a streaming standby of the tests' own (tests.replication).

    3 executors (`outbox run`, EMAIL, the multi-host URL) + a steady enqueue (the multi-host URL)
      ─▶ the primary killed (SIGKILL) at a seeded moment while fences commit ─▶ the standby promoted
      ─▶ enqueueing goes on on the new primary ─▶ every action ends ─▶ the new primary and the sink checked

Synchronous replication keeps the promise: no email twice, no acknowledged enqueue lost, every executor
back within seconds. With the standby's WAL receiver paused before the kill (a standby that fell behind),
a synchronous primary sends nothing meanwhile, while an asynchronous one loses its tail: the last test
shows what that costs (emails sent twice, acknowledged actions gone), so the checks can fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.replication import Failover, FailoverConfig, FailoverResult

SEED = int(os.environ.get("OUTBOX_FAILOVER_SEED", "11"))
# loose: an executor is back at its next sweep (every second) once the new primary accepts writes
RECONNECT_SECONDS = 30.0


def figures(result: FailoverResult) -> str:
    reconnects = ", ".join(f"{s:.2f}" if s is not None else "never" for s in result.reconnect_seconds.values())
    first = f"{result.first_email_seconds:.2f}" if result.first_email_seconds is not None else "none"
    return (
        f"{'sync' if result.config.synchronous else 'async'} seed {result.config.seed}: {result.acked} enqueues"
        f" acknowledged ({result.acked_before_kill} before the kill, {result.enqueue_errors} attempts failed and"
        f" were tried again), {result.emails} emails, {len(result.duplicates)} sent twice, {len(result.lost)} lost,"
        f" {result.emails_last_second_before_kill} emails in the second before the kill,"
        f" {result.executing_at_promotion} EXECUTING at the promotion; promote {result.promote_seconds:.2f} s,"
        f" first heartbeat on the new primary after {reconnects} s, first email after {first} s;"
        f" settled {result.settle_seconds:.1f} s after the promotion; work dir {result.work_dir}"
    )


def check_promise(result: FailoverResult) -> None:
    """What outbox promises across a failover that lost nothing acknowledged."""
    assert result.settled and not result.not_ended, f"actions never ended: {result.not_ended[:10]}"
    assert not result.unexpected_exits and result.exit_codes == [0] * result.config.executors, (
        result.unexpected_exits,
        result.exit_codes,
    )
    assert result.duplicates == {}, f"emails sent more than once: {result.duplicates}"
    assert result.lost == [], f"acknowledged enqueues missing on the new primary: {result.lost[:10]}"
    assert result.sent_for_lost == [] and result.unknown_emails == 0
    assert result.done_without_email == [], f"DONE, yet the relay never got them: {result.done_without_email[:10]}"
    # an email whose result could not be told ends UNCERTAIN with the reason; it was sent at most once (above)
    assert set(result.states) <= {"DONE", "UNCERTAIN"}, result.states
    assert all(reason and error for _, reason, error in result.uncertain), result.uncertain
    assert result.acked > result.acked_before_kill > 0  # enqueueing went on on the new primary
    assert len(result.reconnect_seconds) == result.config.executors
    assert all(s is not None and s <= RECONNECT_SECONDS for s in result.reconnect_seconds.values()), figures(result)


def test_synchronous_failover_sends_every_email_once_and_loses_no_enqueue(tmp_path: Path) -> None:
    result = Failover(FailoverConfig(synchronous=True, seed=SEED, work_dir=tmp_path)).run()
    print(figures(result))
    check_promise(result)
    assert result.emails_last_second_before_kill > 0, "the primary was not killed while emails were going out"
    assert result.states["DONE"] + result.states["UNCERTAIN"] == result.acked


def test_synchronous_primary_sends_nothing_while_its_standby_lags(tmp_path: Path) -> None:
    result = Failover(FailoverConfig(synchronous=True, seed=SEED, lost_tail=True, work_dir=tmp_path)).run()
    print(figures(result))
    check_promise(result)
    assert result.pending_at_pause > 0
    # no commit returned while the standby's receiver was paused (a commit already on its way back when the
    # pause began may return just after it): no claim, no fence, no email, no enqueue in the last second
    assert result.acked_last_second_before_kill == 0 and result.emails_last_second_before_kill == 0
    assert result.acked_in_tail <= 2


def test_asynchronous_failover_with_a_lost_tail_sends_again_and_loses_enqueues(tmp_path: Path) -> None:
    result = Failover(FailoverConfig(synchronous=False, seed=SEED, lost_tail=True, work_dir=tmp_path)).run()
    print(figures(result))
    assert result.settled and not result.unexpected_exits
    # the actions the standby had as never claimed were sent during the tail, and again after the promotion
    assert result.duplicates and set(result.duplicates.values()) == {2}
    assert len(result.duplicates) <= result.pending_at_pause
    # the enqueues acknowledged during the tail are gone from the new primary, some of them already sent
    # (and the few acknowledged between the standby catching up and the pause)
    assert result.lost and len(result.lost) <= result.acked_in_tail + 3
    assert result.sent_for_lost
    with pytest.raises(AssertionError, match="emails sent more than once"):
        check_promise(result)  # the checks of the synchronous runs see it
