"""The adapters of a chaos executor process: `outbox run --adapters tests.chaos.adapters:adapters`.

    EMAIL          ─▶ the real EmailAdapter (examples.accounts notices, SMTP to the runner's SmtpSink)
    TEST_READBACK  ─▶ ReadbackAdapter: its "provider" is the table chaos_provider_write, one row per write
                      (reached directly, OUTBOX_CHAOS_PROVIDER_URL, not through the executor's network)
    WEBHOOK        ─▶ the real WebhookAdapter (examples.accounts webhooks: ACCOUNTS_ALERTS_WEBHOOK_URL, the
                      runner's relay to its receiver process; OUTBOX_WEBHOOK_SECRET_ALERTS)
    NATS_EVENT     ─▶ the real NatsAdapter (examples.accounts events: OUTBOX_NATS_URL, the runner's nats-server)
    SLACK_MESSAGE, GITHUB_POST, GITLAB_POST ─▶ the real Slack, GitHub and GitLab adapters, the workspace, account
                      and host of the run at the runner's local APIs (tests.chaos.posts: OUTBOX_CHAOS_*_URL)

Each is wrapped by a journal: one JSON line per attempt start and end (action, epoch, attempt, whether the
claim found an earlier write, the result and a Done's reference, whether the attempt returned past its
write window), appended to the file OUTBOX_CHAOS_JOURNAL, so the runner knows what a killed process held.
OUTBOX_TEST_CLOCK_SKEW_SECONDS moves this process's wall clock (time.time), as in tests/adapters.py: no lease
or due time may read it.

The read-back adapter follows the README: when `attempt.write_started()`, it looks for an earlier write
(by action id) before it fences, and reports Done with that write instead of writing again. Every provider
write records the database clock when it started and ended, the writer's pid and epoch, and how much of the
writer's window was left just before and just after the write (negative: the write came late).

An action whose payload says `"brink": true` freezes its own process (SIGSTOP) on its first attempt right
after `window.check()` passed and before the provider write: the one case no fence can stop. The runner
sees the stopped process, keeps it stopped past its lease and window, then wakes it; the write then
happens late, and is counted apart.

A WEBHOOK, NATS_EVENT, SLACK_MESSAGE, GITHUB_POST or GITLAB_POST action whose idempotency key is a line of the
file OUTBOX_CHAOS_BRINKS freezes its process (SIGSTOP) right after the provider accepted it (the real adapter
returned Done) and before the executor records the result: the case read-back exists for. The runner sees the
stopped process, takes the key out of the file, then SIGKILLs the process or keeps it stopped past its lease and
wakes it; the next claim must find the effect (NATS: by the event's subject, past the stream's duplicate window;
webhook: the receiver holds the webhook-id and answers without a second effect; Slack, GitHub, GitLab: read back
by the post's marker).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from examples.accounts import events, notices, webhooks
from outbox.email import email_adapters
from outbox.executor import ActionAdapter, ActionAttempt, Done, Result, Retry, Uncertain
from outbox.executor.results import result_name
from outbox.github import github_adapters
from outbox.gitlab import gitlab_adapters
from outbox.kinds import ActionKind
from outbox.nats import nats_adapters
from outbox.slack import slack_adapters
from outbox.webhook import WebhookAdapter
from tests import kinds
from tests.chaos import posts

# the kinds whose brink comes after the provider accepted (the keys in OUTBOX_CHAOS_BRINKS)
AFTER_ACCEPT = ("WEBHOOK", "NATS_EVENT", *posts.KINDS)

PROVIDER_TABLE = """
CREATE TABLE IF NOT EXISTS chaos_provider_write (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id        bigint NOT NULL,
    epoch            bigint NOT NULL,
    lane_key         text NOT NULL,
    pid              integer NOT NULL,
    brink            boolean NOT NULL,
    remaining_before float8 NOT NULL,
    remaining_after  float8,
    -- did the writer still hold the action (its epoch EXECUTING, its lease not expired) at the write and
    -- at its end: live, expired, superseded (a newer claim or the end) or erased. An observer's note,
    -- not a fence: the write happens whatever it says.
    holder_at_start  text NOT NULL,
    holder_at_end    text,
    started_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at         timestamptz
);
CREATE INDEX IF NOT EXISTS ix_chaos_provider_write_action ON chaos_provider_write (action_id);
"""

HOLDER = """(SELECT CASE WHEN a.id IS NULL THEN 'erased'
                    WHEN a.epoch <> :epoch OR a.state <> 'EXECUTING' THEN 'superseded'
                    WHEN a.lease_expires_at <= clock_timestamp() THEN 'expired'
                    ELSE 'live' END
               FROM (SELECT 1) AS one LEFT JOIN agent_action AS a ON a.id = :id)"""
FIND_WRITE = text("SELECT id FROM chaos_provider_write WHERE action_id = :id ORDER BY id LIMIT 1")
WRITE = text(f"""
INSERT INTO chaos_provider_write (action_id, epoch, lane_key, pid, brink, remaining_before, holder_at_start)
VALUES (:id, :epoch, :lane, :pid, :brink, :remaining, {HOLDER}) RETURNING id
""")
WRITE_ENDED = text(f"""
UPDATE chaos_provider_write SET ended_at = clock_timestamp(), remaining_after = :remaining, holder_at_end = {HOLDER}
 WHERE id = :write
""")


class Journal:
    """One JSON line per event, written at once (line-buffered): a SIGKILL loses nothing written."""

    def __init__(self, path: str | None) -> None:
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - lives as long as the process

    def write(self, event: str, attempt: ActionAttempt, **fields: Any) -> None:
        if self._file is None:
            return
        action = attempt.action
        entry = {"e": event, "id": action.id, "epoch": action.epoch, "attempt": action.attempt, **fields}
        self._file.write(json.dumps(entry) + "\n")


def brink_keys(path: str | None) -> set[str]:
    """The idempotency keys whose actions freeze their process once the provider accepted them."""
    if not path or not os.path.exists(path):
        return set()
    with open(path) as file:
        return {line.strip() for line in file if line.strip()}


class Journaled:
    """Wraps an adapter: journals each attempt's start and end; the adapter's behaviour is unchanged, but for
    the brink after the provider accepted (WEBHOOK and NATS_EVENT, keys in `brinks`)."""

    def __init__(self, inner: ActionAdapter, journal: Journal, brinks: str | None = None) -> None:
        self._inner = inner
        self._journal = journal
        self._brinks = brinks if inner.kind.name in AFTER_ACCEPT else None

    @property
    def kind(self) -> ActionKind:
        return self._inner.kind

    async def execute(self, attempt: ActionAttempt) -> Result:
        self._journal.write(
            "start", attempt, kind=self.kind.name, lane=attempt.action.lane_key, prior=attempt.write_started()
        )
        outcome, ref = "raised", None
        try:
            result = await self._inner.execute(attempt)
            outcome = result_name(result)
            if isinstance(result, Done):
                ref = result.readback_ref
                if attempt.action.idempotency_key in brink_keys(self._brinks):
                    # accepted by the provider, not recorded yet: descheduled here until the runner decides
                    self._journal.write("brink", attempt, kind=self.kind.name, pid=os.getpid(), ref=ref)
                    os.kill(os.getpid(), signal.SIGSTOP)
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            window = attempt.window
            late = window is not None and window.remaining() <= 0
            self._journal.write("end", attempt, result=outcome, ref=ref, fenced=window is not None, past_window=late)


class ReadbackAdapter:
    """An at-least-once kind that reads back: it looks for an earlier write before it writes again."""

    def __init__(self, provider: AsyncEngine, journal: Journal, *, work_seconds: float = 0.3) -> None:
        self._provider = provider
        self._journal = journal
        self._work = work_seconds
        self._rng = random.Random()

    @property
    def kind(self) -> ActionKind:
        return kinds.READBACK

    async def _find(self, action_id: int) -> int | None:
        async with self._provider.connect() as conn:
            found = (await conn.execute(FIND_WRITE, {"id": action_id})).scalar_one_or_none()
            await conn.commit()
        return None if found is None else int(found)

    async def execute(self, attempt: ActionAttempt) -> Result:
        action = attempt.action
        if attempt.write_started():
            # an earlier attempt may have written: look before writing again (a failure here raises,
            # before the fence: the executor retries, and nothing was written by this attempt)
            earlier = await self._find(action.id)
            if earlier is not None:
                return Done(f"found write {earlier}")
        window = await attempt.fence().begin_write()
        brink = bool(isinstance(action.payload, dict) and action.payload.get("brink")) and action.attempt == 1
        if brink:
            window.check()
            self._journal.write("brink", attempt, kind=self.kind.name, pid=os.getpid())
            os.kill(os.getpid(), signal.SIGSTOP)  # descheduled between the check and the call
        try:
            async with self._provider.connect() as conn:
                if not brink:
                    window.check()  # immediately before the provider call, once connected to it
                params = {
                    "id": action.id,
                    "epoch": action.epoch,
                    "lane": action.lane_key,
                    "pid": os.getpid(),
                    "brink": brink,
                    "remaining": window.remaining(),
                }
                write_id = int((await conn.execute(WRITE, params)).scalar_one())
                await conn.commit()
                await asyncio.sleep(self._rng.random() * self._work)  # the provider's work
                ended = {"write": write_id, "remaining": window.remaining(), "id": action.id, "epoch": action.epoch}
                await conn.execute(WRITE_ENDED, ended)
                await conn.commit()
        except DBAPIError as error:
            return await self._after_failed_write(attempt, error)
        return Done(f"write {write_id}")

    async def _after_failed_write(self, attempt: ActionAttempt, error: DBAPIError) -> Result:
        """The write may or may not exist: read back until the window closes."""
        assert attempt.window is not None
        while attempt.window.remaining() > 1:
            try:
                found = await self._find(attempt.action.id)
            except DBAPIError:
                await asyncio.sleep(0.5)
                continue
            if found is not None:
                return Done(f"found write {found} after {type(error.orig).__name__}")
            return Retry(f"the provider holds no write after {type(error.orig).__name__}")
        return Uncertain(f"the provider could not be read after {type(error.orig).__name__}")


_SKEWED: list[bool] = []  # the clock was skewed (once per process: `outbox run --all-cells` calls adapters per cell)


def _skew_clock() -> None:
    skew = float(os.environ.get("OUTBOX_TEST_CLOCK_SKEW_SECONDS", "0"))
    if skew and not _SKEWED:
        _SKEWED.append(True)
        real_time = time.time
        time.time = lambda: real_time() + skew


def _provider_url(engine: AsyncEngine) -> str | None:
    """The read-back provider of `engine`'s database: OUTBOX_CHAOS_PROVIDER_URL, or in a cells run the URL
    OUTBOX_CHAOS_PROVIDER_URLS gives for the cell's database name (each cell's provider is its own)."""
    by_database = os.environ.get("OUTBOX_CHAOS_PROVIDER_URLS")
    if by_database:
        return str(json.loads(by_database)[engine.url.database])
    return os.environ.get("OUTBOX_CHAOS_PROVIDER_URL")


def adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The chaos executor's adapters: EMAIL (the example notices), TEST_READBACK, WEBHOOK and NATS_EVENT (the
    example's alert webhook and event), SLACK_MESSAGE, GITHUB_POST and GITLAB_POST, each journaled. With
    `--all-cells`, called once per cell: the cells' adapters append to one journal (a cell's action ids are
    its own range, tests.chaos.records.CELL_ID_STRIDE)."""
    assert notices.WORKSPACE_ALERT and notices.VERIFY_ADDRESS and webhooks.ALERT_RAISED and events.ALERT_EVENT
    _skew_clock()
    journal = Journal(os.environ.get("OUTBOX_CHAOS_JOURNAL"))
    # the provider is another system than the outbox's database: OUTBOX_CHAOS_PROVIDER_URL, when given,
    # reaches it directly, so a network fault between the executor and its database spares it
    provider_url = _provider_url(engine)
    provider = create_async_engine(
        provider_url or engine.url,
        pool_size=4,
        max_overflow=40,
        pool_pre_ping=True,  # a provider that reconnects: a holder frozen past its lease still writes late
        connect_args={"application_name": "chaos-provider"},
    )
    brinks = os.environ.get("OUTBOX_CHAOS_BRINKS")
    posts.register(os.environ[posts.NAME_VARIABLE], posts.urls_from_environment())
    return [
        Journaled(email_adapters(engine)[0], journal),
        Journaled(ReadbackAdapter(provider, journal), journal),
        Journaled(WebhookAdapter(engine), journal, brinks),
        Journaled(nats_adapters(engine)[0], journal, brinks),
        *(Journaled(made(engine)[0], journal, brinks) for made in (slack_adapters, github_adapters, gitlab_adapters)),
    ]
