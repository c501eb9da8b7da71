"""Proof under faults: a seeded chaos run (`tests/chaos/`) breaks no invariant.

The default run includes two short runs: 105 s of faults against 4 executor processes, a real SMTP sink, a nats-
server with JetStream, a webhook receiver process behind a relay, and PostgreSQL (its own, restartable, unless
OUTBOX_TEST_DATABASE_URL names a server: then every fault but the restart), each executor reaching it through a
network relay of its own that drops, delays or resets its packets at times; the workload holds EMAIL,
TEST_READBACK, WEBHOOK, NATS_EVENT, SLACK_MESSAGE, GITHUB_POST and GITLAB_POST actions (the last three against
the local Slack, GitHub and GitLab APIs, each a process of its own); then up to a few minutes for the leases of
killed, frozen and cut-off holders to expire and the store to settle: about 3 minutes each. The second run puts
a PgBouncer in transaction pooling between the relays and PostgreSQL (tests/test_chaos_pooler.py reads the same
invariants from it). Each run happens once, in a module-scoped fixture; each test below reads one invariant from
its report. A long run is `python -m tests.chaos --seed N --minutes 30`, or these tests' `chaos_long` instances
with OUTBOX_CHAOS_MINUTES and OUTBOX_CHAOS_SEED set.

Every breach the checks find must be explained by a late write: a holder frozen after its window check
and woken past its lease, which no fence can stop. The run injects that case on purpose and the tests
assert it was seen, counted apart, and is the only cause of the breaches found. It also freezes WEBHOOK,
NATS_EVENT, SLACK_MESSAGE, GITHUB_POST and GITLAB_POST holders right after their provider accepted, the case
read-back exists for: the tests assert the next claim found each such effect and made no second one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.chaos.records import ChaosConfig
from tests.chaos.report import Report, render
from tests.chaos.runner import run_chaos

SHORT_SEED = 20261130
# long enough for both past-the-lease faults (75 s each) besides the two brinks (68 s each): 4 executors; and
# for the first round of faults, every kind once, on a busy machine
SHORT_MINUTES = 1.75
PROCESS_FAULTS = ("SIGKILL", "SIGSTOP short", "SIGSTOP past the lease")
NETWORK_FAULTS = ("network cut", "network delay", "network blackhole short", "network blackhole past the lease")
PROVIDER_FAULTS = (
    "NATS server SIGKILL",
    "webhook relay cut",
    "webhook relay blackhole",
    "webhook receiver SIGKILL",
    "webhook receiver throttling",
    *(
        f"{api} API {fault}"
        for api in ("Slack", "GitHub", "GitLab")
        for fault in ("answers lost after the write", "SIGKILL", "rate limit")
    ),
)
POST_KINDS = ["SLACK_MESSAGE", "GITHUB_POST", "GITLAB_POST"]
# a blackholed executor's statements are bounded client-side (10 s): it finds the database unreachable within this
NOTICE_SECONDS = 15.0
# and once the network is back, it beats again within this
BEAT_AGAIN_SECONDS = 30.0
BRINK_LATE_WRITE = "read-back write by a holder that had lost its lease (brink, on purpose)"


@dataclass(frozen=True)
class Run:
    report: Report
    restartable: bool  # our own PostgreSQL, which the run may restart

    @property
    def table(self) -> str:
        return render(self.report)


LONG = pytest.mark.skipif("OUTBOX_CHAOS_MINUTES" not in os.environ, reason="a long run: set OUTBOX_CHAOS_MINUTES")


def chaos_run(name: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One chaos run: the short seeded one (`short`, or `short-pooler` behind a transaction pooler), or the long
    one OUTBOX_CHAOS_MINUTES asks for (`long`; OUTBOX_CHAOS_POOLER: behind a pooler in that mode)."""
    pooler = os.environ.get("OUTBOX_CHAOS_POOLER") or None
    if name == "short":
        seed, minutes, pooler = SHORT_SEED, SHORT_MINUTES, None
    elif name == "short-pooler":
        seed, minutes, pooler = SHORT_SEED, SHORT_MINUTES, "transaction"
    else:
        seed, minutes = int(os.environ.get("OUTBOX_CHAOS_SEED", "1")), float(os.environ["OUTBOX_CHAOS_MINUTES"])
    server = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    work_dir = tmp_path_factory.mktemp(f"chaos-{name}")
    config = ChaosConfig(
        seed=seed, minutes=minutes, server_url=server, pooler=pooler, work_dir=work_dir, log=lambda _: None
    )
    report = run_chaos(config)
    print(render(report))
    return Run(report, restartable=server is None)


# The run behind a pooler is tests/test_chaos_pooler.py's, so that `make test` runs it beside this one.
@pytest.fixture(
    scope="module",
    params=[pytest.param("short", marks=pytest.mark.chaos), pytest.param("long", marks=[pytest.mark.chaos_long, LONG])],
)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One chaos run per module, read by every test below."""
    return chaos_run(request.param, tmp_path_factory)


def test_every_fault_kind_was_injected(run: Run) -> None:
    faults = run.report.faults
    injected = {name.split(" (")[0].split(":")[0] for name, n in faults.items() if n and "skipped" not in name}
    expected = {*PROCESS_FAULTS, *NETWORK_FAULTS, *PROVIDER_FAULTS, "relay", "relay throttling"}
    expected |= {"pg_terminate_backend", "brink", "erasure"}
    if run.restartable:
        expected.add("PostgreSQL restart")
    assert expected <= injected, run.table


def test_every_kill_recovered(run: Run) -> None:
    """Every action a killed executor held was taken back or ended."""
    kills = run.report.kills
    assert kills and all(k.recovery is not None for k in kills), run.table


def test_the_brink_late_write_was_seen(run: Run) -> None:
    """The one case no fence can stop happened, and was seen as late."""
    assert run.report.late_writes[BRINK_LATE_WRITE] >= 1, run.table


@pytest.mark.parametrize("kind", ["WEBHOOK", "NATS_EVENT"])
def test_webhooks_and_events_ran_and_ended(run: Run, kind: str) -> None:
    """Both kinds ran through the faults: most of their actions ended DONE, each checked against its provider."""
    figures = run.report.figures(kind)
    assert figures["actions"] >= 40, run.table
    assert figures["ended DONE"] >= figures["actions"] // 2, run.table


@pytest.mark.parametrize("kind", ["WEBHOOK", "NATS_EVENT", *POST_KINDS])
def test_every_holder_frozen_after_the_provider_accepted_left_one_effect(run: Run, kind: str) -> None:
    """The brink read-back exists for: the provider took the effect, its holder froze before recording it
    (then was SIGKILLed, or woken past its lease); the next claim found the effect and made no second one."""
    figures = run.report.figures(kind)
    brinks = [b for b in run.report.brinks if b.kind == kind]
    assert brinks, run.table
    # a post's read-back looks from its first attempt's `since`, by that executor's wall clock: one hours ahead
    # (a skewed executor) hides the post, counted apart (Slack reads time.time, which the skew moves)
    missed = figures["brinks whose read-back began after the post (a clock ahead)"]
    assert figures["brinks whose next claim found the effect"] + missed == len(brinks), run.table


@pytest.mark.parametrize("kind", POST_KINDS)
def test_posts_ran_and_ended(run: Run, kind: str) -> None:
    """Slack, GitHub and GitLab posts ran through the faults (their APIs killed, answers lost after the write,
    rate limits): most ended DONE, and some DONE by a read-back that found the post an earlier attempt made."""
    figures = run.report.figures(kind)
    assert figures["actions"] >= 40, run.table
    assert figures["ended DONE"] >= figures["actions"] // 2, run.table
    assert figures["DONE by a read-back that found the event"] >= 1, run.table


@pytest.mark.parametrize("kind", POST_KINDS)
def test_the_store_holds_each_marker_once(run: Run, kind: str) -> None:
    """Every post the API stored carries an enqueued action's marker, and no marker twice."""
    figures = run.report.figures(kind)
    assert figures["posts in the store"] >= figures["ended DONE"] > 0, run.table
    # but for a second post after a read-back that looked from after the first (an executor clock hours ahead)
    again = figures["stored twice: read-back began after the post (a clock ahead)"]
    assert figures["posts in the store"] - again == figures["distinct markers in the store"], run.table
    assert figures["duplicates"] == 0 and figures["lost"] == 0 and figures["lane overlaps"] == 0, run.table


def test_a_reclaimed_event_was_read_back_by_its_subject(run: Run) -> None:
    """Past the stream's duplicate window (shorter than the lease), a reclaim found the event by its subject."""
    assert run.report.figures("NATS_EVENT")["DONE by a read-back that found the event"] >= 1, run.table


def test_the_stream_holds_each_event_once(run: Run) -> None:
    figures = run.report.figures("NATS_EVENT")
    assert figures["messages in the stream"] == figures["distinct Nats-Msg-Id in the stream"], run.table


def test_the_receiver_absorbed_webhooks_sent_again(run: Run) -> None:
    """A webhook sent again after its answer was lost is a second delivery, never a second effect."""
    figures = run.report.figures("WEBHOOK")
    assert figures["webhook-ids delivered more than once (absorbed)"] >= 1, run.table
    assert figures["deliveries at the receiver"] > figures["effects at the receiver"], run.table


def test_every_breach_is_explained_by_a_late_write(run: Run) -> None:
    assert not run.report.unexplained, run.table


def test_nothing_was_lost(run: Run) -> None:
    """Every action not erased ended, or is legitimately waiting (a parked proposal, a backoff)."""
    assert not run.report.lost, run.table


def test_no_action_took_effect_twice(run: Run) -> None:
    """No email delivered twice, no read-back written twice, but for a late write (counted apart)."""
    assert run.report.duplicates == 0, run.table


def test_no_two_writes_overlapped_in_a_lane(run: Run) -> None:
    assert run.report.overlaps == 0, run.table


def test_every_executor_stopped_with_exit_0(run: Run) -> None:
    codes = run.report.stop_codes
    assert codes == [0] * len(codes), run.table


def test_no_executor_exited_on_its_own(run: Run) -> None:
    assert not run.report.unexpected_exits, run.table


def test_every_blackholed_executor_noticed_within_seconds(run: Run) -> None:
    """Cut off with no RST and no FIN, an executor finds the database unreachable (it logs so) within seconds:
    its statements are bounded client-side."""
    blackholes = [p for p in run.report.partitions if p.kind.startswith("blackhole")]
    assert blackholes, run.table
    for partition in blackholes:
        assert partition.noticed_after is not None, run.table
        assert partition.noticed_after <= NOTICE_SECONDS, run.table


def test_every_cut_off_executor_beat_again_after_the_network_came_back(run: Run) -> None:
    partitions = run.report.partitions
    assert {p.kind for p in partitions} >= {"blackhole past the lease", "blackhole short", "delay", "cut"}, run.table
    for partition in partitions:
        assert partition.beat_after_end is not None, run.table
        assert partition.beat_after_end <= BEAT_AGAIN_SECONDS, run.table
