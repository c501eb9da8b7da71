"""A backlog through a real relay that throttles: Debian's Postfix with anvil's limits, two `outbox run` replicas.

Postfix (tests/postfix.py) accepts at most RATE messages per WINDOW from one client (`450 4.7.1 Error: too
much mail from 127.0.0.1` at MAIL FROM beyond it) and at most CONNECTIONS sessions at once (`421 4.7.0 ...
Error: too many connections` at connect beyond them), 127.0.0.1 not exempt, and delivers to one Maildir.
EMAILS verify-address emails over LANES lanes (one per account) go through two executors at their defaults
(no rate configured), more sessions than the relay allows at once and ten times what one window takes.

Every email must end DONE (an ideal drain takes 50 s: the executors find the relay's pace from its refusals;
DRAIN_SECONDS only bounds the wait for a backlog that never drains, the drain's speed is measured by
bench.throttle), none FAILED, each delivered once (distinct Message-IDs
in the Maildir = DONE);
the relay's refusals are counted as DEFER in action_attempts_total, and no action's `attempt` counts one:
the attempts the rows count are exactly the recorded attempts that were not deferred.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from examples.accounts import notices, schema
from outbox.email import message_id
from outbox.intake import enqueue_many
from outbox.metrics.exporter import registry_for
from tests import postfix
from tests.postfix import PostfixRelay
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
SENDER = "outbox@example.com"
LANES = 500
EMAILS = 2000  # four per lane
RATE, WINDOW = 200, "5s"  # 40 a second: an ideal drain takes ten windows, 50 s
CONNECTIONS = 20
LIMITS = {
    "smtpd_client_message_rate_limit": str(RATE),
    "anvil_rate_time_unit": WINDOW,
    "smtpd_client_connection_count_limit": str(CONNECTIONS),
    "smtpd_client_event_limit_exceptions": "",  # 127.0.0.1 is exempt by default (mynetworks)
}
DRAIN_SECONDS = 300


@pytest.fixture
def relay() -> Iterator[PostfixRelay]:
    why = postfix.missing()
    if why is not None:
        pytest.fail(why)
    started = PostfixRelay(LIMITS).start()
    try:
        yield started
    finally:
        started.stop()


def enqueue_backlog(engine: Engine) -> list[str]:
    """LANES accounts with an unverified address @example.test, EMAILS / LANES verify-address emails each (one
    lane per account), enqueued in one statement; the idempotency keys."""
    requests = [
        notices.VERIFY_ADDRESS.request({"account_id": account, "request": request})
        for request in range(1, EMAILS // LANES + 1)
        for account in range(1, LANES + 1)
    ]
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(
            text(
                "INSERT INTO app_account SELECT g, 'Account ' || g, 'user' || g || :domain, false"
                " FROM generate_series(1, :lanes) AS g"
            ),
            {"lanes": LANES, "domain": f"@{postfix.DOMAIN}"},
        )
        return [action.idempotency_key for action in enqueue_many(conn, requests)]


def start_executor(database_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SMTP_HOST": "127.0.0.1",
        "OUTBOX_SMTP_PORT": str(port),
        "OUTBOX_SMTP_SENDER": SENDER,
        "PYTHONPATH": str(ROOT),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "run", "--adapters", "examples.accounts:adapters"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def live_actions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM agent_action WHERE ended_at IS NULL")).scalar_one())


def progress(engine: Engine) -> str:
    """Where a drain that did not end stands: the actions by state, and what the destination holds."""
    with engine.connect() as conn:
        states = dict(conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all())
        destination = conn.execute(text("SELECT * FROM agent_destination WHERE name = 'smtp'")).mappings().first()
    return f"states {states}; destination {dict(destination or {})}"


def attempts_counted(engine: Engine) -> Counter[str]:
    """action_attempts_total{kind="EMAIL", recorded="true"} by result, as the exporter reads the tallies."""
    counted: Counter[str] = Counter()
    for metric in registry_for(engine, cache_seconds=0).collect():
        for sample in metric.samples:
            labels = sample.labels
            wanted = sample.name == "action_attempts_total" and labels.get("kind") == "EMAIL"
            if wanted and labels.get("recorded") == "true" and sample.value:
                counted[labels["result"]] += int(sample.value)
    return counted


def test_a_throttling_postfix_relay_ends_every_email_done_once_without_spending_attempts(
    engine: Engine, database_url: str, relay: PostfixRelay, tmp_path: Path
) -> None:
    keys = enqueue_backlog(engine)
    started = time.monotonic()
    executors = [start_executor(database_url, relay.port, tmp_path / f"executor-{n}.log") for n in (1, 2)]
    try:
        try:
            until(lambda: live_actions(engine) == 0, timeout=DRAIN_SECONDS, what=f"{EMAILS} emails to end")
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; {progress(engine)}") from None
        drained = time.monotonic() - started
    finally:
        for process in executors:
            process.send_signal(signal.SIGTERM)
        for process in executors:
            process.wait(timeout=30)

    with engine.connect() as conn:
        states: dict[str, int] = dict(
            conn.execute(text("SELECT state, count(*) FROM agent_action GROUP BY state")).all()
        )
        attempts, epochs = conn.execute(text("SELECT sum(attempt), sum(epoch) FROM agent_action")).one()
        rate, pace = conn.execute(text("SELECT rate, pace FROM agent_destination WHERE name = 'smtp'")).one()
    assert states == {"DONE": EMAILS}, states
    # no rate configured: the relay's slow-downs paused the destination and taught it a pace
    assert rate is None and pace is not None

    # each email delivered exactly once: the relay's Maildir holds every Message-ID, none twice
    expected = {message_id(key, "example.com") for key in keys}
    until(lambda: len(relay.message_ids()) >= EMAILS, timeout=60, what="postfix to deliver every message")
    delivered = Counter(relay.message_ids())
    assert set(delivered) == expected and max(delivered.values()) == 1

    # the relay did throttle, each refusal was a DEFER, and no deferral counts as an attempt
    log = relay.log()
    refused_rate = log.count("Message delivery request rate limit exceeded")
    refused_connections = log.count("Connection concurrency limit exceeded")
    counted = attempts_counted(engine)
    # Which limit refuses first depends on the machine's speed: a pace learned from the sessions' refusals may
    # keep every later message under the rate (a CI run: one 421 at connect, pace 10.8/s, no 450 logged). The
    # refusals are counted where outbox recorded them; the relay's log, whose lines postlogd may drop under
    # load, only bounds them from below.
    assert counted["DEFER"] > 0, log[-2000:]
    # every refusal the relay logged reached outbox as a DEFER (a log line lost under load only lowers the left)
    assert refused_rate + refused_connections <= counted["DEFER"], (refused_rate, refused_connections, counted)
    assert counted["FAILED"] == counted["UNCERTAIN"] == 0
    assert attempts == sum(n for result, n in counted.items() if result != "DEFER")
    assert epochs == sum(counted.values())
    print(
        f"\n{EMAILS} emails over {LANES} lanes through postfix at {RATE} per {WINDOW}, {CONNECTIONS} sessions:"
        f" drained in {drained:.1f} s; attempts {dict(counted)}; postfix refused {refused_rate} at MAIL FROM"
        f" (rate) and {refused_connections} at connect (sessions); the pace learned {pace:.1f}/s"
    )
