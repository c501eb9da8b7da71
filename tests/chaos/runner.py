"""The chaos run itself: sets up, drives the workload, injects the faults, settles, stops, then checks.

`Chaos.run` is one run, as the package's docstring describes it; `tests.chaos.checks` checks the invariants
once the executors stopped, `tests.chaos.report` renders what it found.

The network, by slot (each executor process reaches the database through relays of its own, so a network
fault isolates one executor while the others carry on; the runner's own connections go direct):

    executor slot i ─▶ NetRelay i ─────────────────────────────▶ PostgreSQL
                    ─▶ NetRelay i ─▶ PgBouncer (--pooler) ───────▶ PostgreSQL
                    ─▶ NetRelay i' ─▶ PostgreSQL  (its LISTEN connection, behind a transaction pooler)
    its read-back provider, the runner (enqueue, faults, checks) ─▶ PostgreSQL
    its WEBHOOK adapter ─▶ the webhook relay ─▶ the receiver process; its NATS_EVENT adapter ─▶ nats-server
                           (tests.chaos.providers; the runner kills both providers and cuts the relay)
    its SLACK_MESSAGE, GITHUB_POST, GITLAB_POST adapters ─▶ the local Slack, GitHub, GitLab API processes
                           (tests.chaos.posts; the runner scripts their answers, kills and restarts them)

    a cells run (config.cells): executor slot i (`outbox run --all-cells`) ─▶ NetRelay i,c ─▶ cell c's server,
    for each cell c; the runner enqueues each action in its lane's cell (cell_of_lane) and reads an action in
    the cell its id names (cell_of_id)
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import json
import math
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

import outbox
from demo.sink import Faults, SmtpSink
from examples.accounts import events, notices, schema, webhooks
from outbox import migrate
from outbox.db import psycopg_url
from outbox.erasure import erase_account
from outbox.errors import InvalidRequest, OutboxError
from outbox.github import comment_request
from outbox.github import issue_request as github_issue
from outbox.gitlab import issue_request as gitlab_issue
from outbox.gitlab import note_request
from outbox.nats import enqueue_event
from outbox.slack import slack_message
from outbox.testing import install_kinds
from outbox.webhook import enqueue_webhook
from tests import kinds
from tests.chaos import journal, posts
from tests.chaos.adapters import AFTER_ACCEPT, PROVIDER_TABLE
from tests.chaos.checks import check
from tests.chaos.netrelay import NetRelay
from tests.chaos.postgres import OwnPostgres
from tests.chaos.providers import Providers
from tests.chaos.records import (
    CELL_ID_STRIDE,
    CELL_NAMES,
    ENDED_STATES,
    SENDER_DOMAIN,
    Brink,
    CellDb,
    ChaosConfig,
    Erasure,
    Kill,
    Partition,
    Planned,
    Slot,
)
from tests.chaos.report import Report
from tests.pgbouncer import PgBouncer

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600


def retrying(what: str, action: Callable[[], Any], errors: Counter[str], timeout: float = 120.0) -> Any:
    """Run `action` until it does not fail for a lost connection (a restart, a terminated backend)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except OperationalError:
            errors[what] += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        except DBAPIError as error:
            if not error.connection_invalidated:
                raise
            errors[what] += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# the executors' wall clocks, off by this much: at the start (by slot), and at a restart after a kill
SKEWS = [0.0, 0.0, 6 * HOUR, -6 * HOUR]
RESTART_SKEWS = [0.0, 0.0, 3 * HOUR, -3 * HOUR, 6 * HOUR, -6 * HOUR, 26 * HOUR]

# the faults of each of the Slack, GitHub and GitLab APIs (Chaos._post_fault), by weight
POST_FAULTS = {"answers lost after the write": 4, "SIGKILL": 2, "rate limit": 3}
POST_FAULT_GAP = 5.0  # seconds between two of them, on average (exponential)


# ---- the run ------------------------------------------------------------------------------------------------


class Chaos:
    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.post_rng = random.Random(config.seed * 104729 + 3)  # the Slack, GitHub and GitLab APIs' faults
        self.work_rng = random.Random(config.seed * 7919 + 1)
        self.log = config.log
        self.t0 = time.monotonic()
        self.work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix=f"outbox-chaos-{config.seed}-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.cells: list[CellDb] = []  # the one database, or the cells (config.cells)
        self.cells_file = self.work_dir / "cells.toml"
        self.providers: Providers | None = None
        self.posts: posts.PostProviders | None = None
        self.brink_file = self.work_dir / "brinks.txt"  # the keys of WEBHOOK and NATS_EVENT brinks, armed
        self.brink_keys: dict[str, tuple[str, float]] = {}  # armed: key -> its kind, when armed
        self.brinks_of_kind: Counter[str] = Counter()
        self.pooler: PgBouncer | None = None
        # when each process was frozen (by a fault or a brink): [start, end], epoch seconds
        self.freezes: dict[int, list[list[float]]] = {}
        self.journal_pids: dict[str, int] = {}  # journal file name: the process that wrote it
        self.partitions: list[Partition] = []
        self.errors: Counter[str] = Counter()
        self.planned: dict[int, Planned] = {}
        self.by_key: dict[str, Planned] = {}
        self.erasures: list[Erasure] = []
        self.erased_accounts: set[int] = set()
        self.slots: list[Slot] = []
        self.kills: list[Kill] = []
        self.brinks: list[Brink] = []
        self.brinks_seen: set[int] = set()
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.frozen_by_relay: queue.Queue[tuple[int, str, float]] = queue.Queue()
        self.relay_brink_addresses: set[str] = set()  # armed: the sink freezes the next sender to one of them
        self.brink_accounts_used = 0  # each brink email has an account of its own, used once
        self.faults: Counter[str] = Counter()
        self.unexpected_exits: list[str] = []
        self.relay_fault_until = 0.0
        self.counters = itertools.count(1)
        self.request_numbers: Counter[int] = Counter()
        self.pg_restarts: list[float] = []
        self.enqueue_seconds: list[float] = []
        self.injecting = True
        self.cell_faults: dict[str, Counter[str]] = defaultdict(Counter)  # the database faults, by cell

    # ---- set-up ----

    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def own(self) -> OwnPostgres | None:
        """The one database's own server (a single-database run)."""
        return self.cells[0].own if self.cells else None

    @property
    def engine(self) -> Engine:
        """The one database's engine (a single-database run; a cells run asks `cell_of_id` or `cell_of_lane`)."""
        return self.cells[0].engine

    @property
    def url(self) -> str:
        return self.cells[0].url

    @property
    def restartable(self) -> list[CellDb]:
        return [cell for cell in self.cells if cell.own is not None]

    def cell_of_id(self, action_id: int) -> CellDb:
        return self.cells[min(action_id // CELL_ID_STRIDE, len(self.cells) - 1)]

    def cell_of_lane(self, lane: str) -> CellDb:
        """A lane lives in one cell (an application routes its data, and the actions with it, by a key of its
        own): here by the lane key's CRC-32."""
        return self.cells[zlib.crc32(lane.encode()) % len(self.cells)]

    def _database(self, index: int, name: str | None) -> CellDb:
        """A fresh database with the outbox schema, the example application's tables and data, the read-back
        provider's table: on a server of its own (or on server_url's); a cell's ids start at its stride."""
        config = self.config
        own = None
        if config.server_url is None:
            own = OwnPostgres()
            server = own.url
        else:
            server = psycopg_url(config.server_url)
        db_name = f"outbox_chaos_{config.seed}_{os.getpid()}" + (f"_{name}" if name else "")
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{db_name}"'))
            self.postgres = str(conn.execute(text("SHOW server_version")).scalar_one())
        admin.dispose()
        url = make_url(server).set(database=db_name).render_as_string(hide_password=False)
        # an application's connections: a lock wait past 30 s is reported (and retried), never endless
        engine = create_engine(
            url,
            pool_pre_ping=True,
            pool_size=3,
            connect_args={"application_name": "chaos-driver", "options": "-c lock_timeout=30s"},
        )
        with engine.begin() as conn:
            migrate.upgrade(conn)
            install_kinds(conn, kinds.ALL)
            schema.create(conn)
            conn.execute(text(PROVIDER_TABLE))
            self._app_data(conn)
            if index:
                first = index * CELL_ID_STRIDE + 1
                conn.execute(text(f"ALTER TABLE agent_action ALTER COLUMN id RESTART WITH {first}"))
        parsed = make_url(server)
        socket_dir = parsed.query.get("host")
        direct = (socket_dir if isinstance(socket_dir, str) else parsed.host or "127.0.0.1", parsed.port or 5432)
        return CellDb(name, index, own, server, db_name, url, engine, direct)

    def set_up(self) -> None:
        config = self.config
        if config.cells and config.pooler is not None:
            raise ValueError("a cells run reaches each cell directly: no --pooler")
        names: tuple[str | None, ...] = CELL_NAMES[: config.cells] if config.cells else (None,)
        for index, name in enumerate(names):
            self.cells.append(self._database(index, name))
        if config.cells:
            self.cells_file.write_text(
                "".join(f'[cells.{c.name}]\ndatabase_url_variable = "{_cell_variable(c)}"\n\n' for c in self.cells)
            )
        self.sink = SmtpSink(seed=config.seed)
        self.sink.on_rcpt = self._on_rcpt
        self.sink.start()
        self.providers = Providers(self.work_dir, config.seed, config.nats_duplicate_window)
        self.posts = posts.PostProviders(self.work_dir)
        posts.register(self.posts.name, self.posts.urls())
        self.brink_file.write_text("")
        direct = self.cells[0].direct
        target = direct
        if config.pooler is not None:
            self.pooler = PgBouncer(self.cells[0].server, config.pooler, pool_size=20)
            target = ("127.0.0.1", self.pooler.port)
        self.slots = [Slot(i, SKEWS[i % len(SKEWS)]) for i in range(config.executors)]
        for slot in self.slots:
            if config.cells:  # a relay per cell: the executor's network to every cell's server
                slot.relays.extend(NetRelay(*cell.direct) for cell in self.cells)
                continue
            slot.relays.append(NetRelay(*target))
            if config.pooler == "transaction":  # no LISTEN through a transaction pooler: its own connection
                slot.relays.append(NetRelay(*direct))
        for slot in self.slots:
            self._start(slot)
        self._park_proposals()

    WORKSPACES = 12
    ACCOUNTS = 400
    BRINK_ACCOUNTS = 40

    def _app_data(self, conn: Connection) -> None:
        conn.execute(
            text("INSERT INTO app_workspace SELECT g, 'workspace ' || g FROM generate_series(1, :n) AS g"),
            {"n": self.WORKSPACES},
        )
        admins, users, brinks = 2 * self.WORKSPACES, self.ACCOUNTS, self.BRINK_ACCOUNTS
        for statement in (
            # two verified admins per workspace: accounts 1..24
            f"INSERT INTO app_account SELECT g, 'Admin ' || g, 'admin' || g || '@example.com', true"
            f" FROM generate_series(1, {admins}) AS g",
            f"INSERT INTO app_membership SELECT (g + 1) / 2, g, 'admin' FROM generate_series(1, {admins}) AS g",
            # accounts that have not verified their address: verify_address emails, erasable
            f"INSERT INTO app_account SELECT 1000 + g, 'User ' || g, 'user' || g || '@example.com', false"
            f" FROM generate_series(1, {users}) AS g",
            f"INSERT INTO app_account SELECT 9000 + g, 'Brink ' || g, 'brink-' || g || '@example.com', false"
            f" FROM generate_series(1, {brinks}) AS g",
        ):
            conn.execute(text(statement))

    def _start(self, slot: Slot) -> None:
        slot.incarnation += 1
        slot.journal = self.work_dir / f"journal-{slot.index}-{slot.incarnation}.jsonl"
        env = {
            **os.environ,
            **self._databases_env(slot),
            "OUTBOX_SMTP_HOST": "127.0.0.1",
            "OUTBOX_SMTP_PORT": str(self.sink.port),
            "OUTBOX_SMTP_SENDER": f"outbox@{SENDER_DOMAIN}",
            # a stall after DATA runs past the fence's 60 s window: the window cuts it, not this timeout
            "OUTBOX_SMTP_TIMEOUT_SECONDS": "90",
            "OUTBOX_TEST_CLOCK_SKEW_SECONDS": str(slot.skew),
            "OUTBOX_CHAOS_JOURNAL": str(slot.journal),
            "OUTBOX_CHAOS_BRINKS": str(self.brink_file),
            **self.provider.env(),
            **self.apis.env(),
            "PYTHONPATH": str(ROOT),
        }
        if len(slot.relays) > 1 and not self.config.cells:
            env["OUTBOX_LISTEN_DATABASE_URL"] = self._url_through(slot.relays[1])
        log = open(self._log_of(slot), "wb")  # noqa: SIM115
        args = ["run", "--adapters", "tests.chaos.adapters:adapters", "--concurrency", "32"]
        args += ["--all-cells"] if self.config.cells else []
        args += ["--lease-seconds", str(self.config.lease_seconds)]
        slot.process = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", *args], env=env, cwd=ROOT, stdout=log, stderr=log
        )
        log.close()
        self.journal_pids[slot.journal.name] = slot.process.pid
        slot.down_since = None
        slot.paused_until = None
        slot.brink = None
        slot.started_at = self.now()
        slot.beat_at = None

    @property
    def provider(self) -> Providers:
        assert self.providers is not None
        return self.providers

    @property
    def apis(self) -> posts.PostProviders:
        assert self.posts is not None
        return self.posts

    def _log_of(self, slot: Slot) -> Path:
        return self.work_dir / f"executor-{slot.index}-{slot.incarnation}.log"

    def _url_through(self, relay: NetRelay, cell: CellDb | None = None) -> str:
        """The run's database (or `cell`'s), reached through `relay` (and whatever stands behind it)."""
        url = make_url((cell or self.cells[0]).url).difference_update_query(["host"])
        return url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)

    def _databases_env(self, slot: Slot) -> dict[str, str]:
        """Where a slot's executor finds its database (or its cells: the cells file, each cell's URL through
        the slot's relay to it), and its read-back provider: the database itself, reached directly (the
        provider is another system: a partition spares it), by the database's name in a cells run."""
        if not self.config.cells:
            return {"OUTBOX_DATABASE_URL": self._url_through(slot.relays[0]), "OUTBOX_CHAOS_PROVIDER_URL": self.url}
        env = {_cell_variable(cell): self._url_through(slot.relays[cell.index], cell) for cell in self.cells}
        env["OUTBOX_CELLS_FILE"] = str(self.cells_file)
        env["OUTBOX_CHAOS_PROVIDER_URLS"] = json.dumps({cell.db_name: cell.url for cell in self.cells})
        return env

    # ---- the workload ----

    def at(self, delay: float, event: Callable[[], None]) -> None:
        heapq.heappush(self.events, (self.now() + delay, next(self._seq), event))

    def _enqueue(
        self, request: outbox.ActionRequest, plan: Planned, prepare: Any = None, submit: Any = None
    ) -> Planned | None:
        """Enqueue `request` (or what `submit(conn)` enqueues) after `prepare(conn)`, in one transaction."""

        def once() -> Any:
            with self.cell_of_lane(plan.lane).engine.begin() as conn:
                if prepare is not None:
                    prepare(conn)
                return submit(conn) if submit is not None else outbox.enqueue(conn, request)

        started = time.monotonic()
        try:
            action = retrying("enqueue", once, self.errors)
            self.enqueue_seconds.append(time.monotonic() - started)
        except InvalidRequest:
            self.errors["enqueue refused (expired while retrying)"] += 1
            return None
        plan.id = action.id
        self.planned[action.id] = plan
        self.by_key[plan.key] = plan
        return plan

    def _options(self) -> dict[str, Any]:
        rng = self.work_rng
        options: dict[str, Any] = {"max_attempts": rng.choice([3, 4, 5])}
        if rng.random() < 0.12:
            options["expires_at"] = datetime.now(UTC) + timedelta(seconds=rng.uniform(2, 30))
        if rng.random() < 0.08:
            options["proposed"] = True
        return options

    def enqueue_one(self) -> None:
        rng = self.work_rng
        options = self._options()
        roll = rng.random()
        if roll < 0.22:
            self._enqueue_alert(options)
        elif roll < 0.40:
            account = 1000 + rng.randint(1, self.ACCOUNTS)
            if account not in self.erased_accounts:
                self._enqueue_verify(account, options)
        elif roll < 0.50:
            self._enqueue_alert_event("WEBHOOK", options)
        elif roll < 0.60:
            self._enqueue_alert_event("NATS_EVENT", options)
        elif roll < 0.78:
            self._enqueue_post(posts.KINDS[int((roll - 0.60) / 0.06)], options)
        else:
            self._enqueue_readback(options)

    def _enqueue_email(self, notice: Any, event: dict[str, Any], options: dict[str, Any], **plan: Any) -> None:
        request = dataclasses.replace(notice.request(event, max_attempts=options["max_attempts"]), **_extra(options))
        planned = Planned(0, "EMAIL", request.idempotency_key, request.lane_key, request.subject_account_id, **plan)
        planned.proposed = request.proposed
        planned.expires = request.expires_at is not None

        def prepare(conn: Connection) -> None:
            if "alert_id" in event:
                conn.execute(
                    text("INSERT INTO app_alert VALUES (:id, :ws, 'Alert', 'body') ON CONFLICT DO NOTHING"),
                    {"id": event["alert_id"], "ws": event["workspace_id"]},
                )
            if notice.prepare(conn, event) is None:
                raise InvalidRequest("event", "reaches nobody")

        if self._enqueue(request, planned, prepare) is not None:
            self._after_enqueue(planned)

    def _enqueue_alert(self, options: dict[str, Any]) -> None:
        rng = self.work_rng
        workspace = rng.choice([1, 2]) if rng.random() < 0.5 else rng.randint(3, self.WORKSPACES)
        event = {"workspace_id": workspace, "alert_id": next(self.counters)}
        self._enqueue_email(notices.WORKSPACE_ALERT, event, options)

    def _enqueue_verify(self, account: int, options: dict[str, Any], *, brink: bool = False) -> None:
        self.request_numbers[account] += 1
        event = {"account_id": account, "request": self.request_numbers[account]}
        self._enqueue_email(notices.VERIFY_ADDRESS, event, options, brink=brink)

    def _enqueue_readback(self, options: dict[str, Any], *, brink: bool = False, lane: str | None = None) -> None:
        rng = self.work_rng
        account = None
        roll = rng.random()
        if lane is not None:
            pass
        elif roll < 0.15:
            lane = f"rb:hot:{rng.randint(0, 2)}"
        elif roll < 0.25:
            lane = f"workspace:{rng.randint(1, 3)}:email"  # shared with the workspace alerts: one lane, two kinds
        elif roll < 0.45:
            account = 1000 + rng.randint(1, self.ACCOUNTS)
            if account in self.erased_accounts:
                return
            lane = f"account:{account}:rb"
        else:
            lane = f"rb:{rng.randint(0, 299)}"
        key = f"rb:{next(self.counters)}"
        request = outbox.ActionRequest(
            kind=kinds.READBACK,
            lane_key=lane,
            idempotency_key=key,
            payload={"brink": True} if brink else {"n": key},
            subject_account_id=account,
            max_attempts=options["max_attempts"],
            **_extra(options),
        )
        planned = Planned(0, kinds.READBACK.name, key, lane, account, brink=brink)
        planned.proposed = request.proposed
        planned.expires = request.expires_at is not None
        if self._enqueue(request, planned) is not None:
            self._after_enqueue(planned)

    def _enqueue_alert_event(
        self, kind: str, options: dict[str, Any], *, brink: bool = False, lane: str | None = None
    ) -> None:
        """A workspace alert's webhook or NATS event, through the example's definitions: in its own lane
        (enqueue_webhook / enqueue_event), or in a lane shared with emails or read-backs, or in an account's
        lane with that account as its subject (erasable)."""
        rng = self.work_rng
        definition: Any = webhooks.ALERT_RAISED if kind == "WEBHOOK" else events.ALERT_EVENT
        workspace = rng.choice([1, 2]) if rng.random() < 0.5 else rng.randint(3, self.WORKSPACES)
        account = None
        roll = rng.random()
        if lane is not None:
            pass
        elif roll < 0.55:
            lane = None  # the definition's own: workspace:<w>:webhook or workspace:<w>:event
        elif roll < 0.70:
            workspace = rng.randint(1, 3)
            lane = f"workspace:{workspace}:email"  # shared with the workspace's alert emails and read-backs
        elif roll < 0.80:
            lane = f"rb:hot:{rng.randint(0, 2)}"  # shared with read-backs
        else:
            account = 1000 + rng.randint(1, self.ACCOUNTS)
            if account in self.erased_accounts:
                return
            lane = f"account:{account}:rb"
        event = {"workspace_id": workspace, "alert_id": next(self.counters)}
        # WEBHOOK's second retry waits 5 min: at most 3 attempts keeps a run's tail within its settling
        attempts = 5 if brink else rng.choice([2, 3]) if kind == "WEBHOOK" else options["max_attempts"]
        request = definition.request(event, max_attempts=attempts)
        extra = _extra(options)
        if lane is not None or extra:
            request = dataclasses.replace(
                request, lane_key=lane or request.lane_key, subject_account_id=account, **extra
            )
        planned = Planned(0, kind, request.idempotency_key, request.lane_key, account, brink=brink)
        planned.proposed = request.proposed
        planned.expires = request.expires_at is not None
        if brink:  # armed before any executor can claim it
            self.brink_keys[request.idempotency_key] = (kind, self.now())
            self._write_brink_keys()

        def prepare(conn: Connection) -> None:
            conn.execute(
                text("INSERT INTO app_alert VALUES (:id, :ws, 'Alert', 'body') ON CONFLICT DO NOTHING"),
                {"id": event["alert_id"], "ws": event["workspace_id"]},
            )

        def submit(conn: Connection) -> Any:
            if request.lane_key != definition.lane_key(event) or extra:
                return outbox.enqueue(conn, request)
            if kind == "WEBHOOK":
                return enqueue_webhook(conn, definition, event, max_attempts=attempts)
            return enqueue_event(conn, definition, event, max_attempts=attempts)

        if self._enqueue(request, planned, prepare, submit) is not None:
            self._after_enqueue(planned)

    def _enqueue_post(
        self, kind: str, options: dict[str, Any], *, brink: bool = False, lane: str | None = None
    ) -> None:
        """A Slack message to one of a few channels, a GitHub comment on one of a few pull requests (or a new
        issue), a GitLab note on one of a few merge requests (or a new issue): in its target's lane, or in a
        lane shared with read-backs."""
        rng = self.work_rng
        n, name = next(self.counters), self.apis.name
        key, text_ = f"{kind.lower()}:{n}", f"chaos post {n}"
        if lane is None and rng.random() < 0.2:
            lane = f"rb:hot:{rng.randint(0, 2)}"  # shared with read-backs
        attempts = options["max_attempts"]
        if kind == "SLACK_MESSAGE":
            channel = rng.choice(posts.CHANNELS)
            request = slack_message(name, channel, text_, idempotency_key=key, max_attempts=attempts)
        elif kind == "GITHUB_POST" and rng.random() < 0.15:
            request = github_issue(name, posts.REPO, text_, "body", idempotency_key=key, max_attempts=attempts)
        elif kind == "GITHUB_POST":
            number = rng.choice(posts.PULLS)
            request = comment_request(name, posts.REPO, number, text_, idempotency_key=key, max_attempts=attempts)
        elif rng.random() < 0.15:
            project = rng.choice(posts.PROJECTS)
            request = gitlab_issue(name, project, text_, "body", idempotency_key=key, max_attempts=attempts)
        else:
            project, iid = rng.choice(posts.PROJECTS), rng.choice(posts.MERGE_REQUESTS)
            request = note_request(name, project, text_, merge_request=iid, idempotency_key=key, max_attempts=attempts)
        request = dataclasses.replace(request, lane_key=lane or request.lane_key, **_extra(options))
        planned = Planned(0, kind, key, request.lane_key, None, brink=brink)
        planned.proposed = request.proposed
        planned.expires = request.expires_at is not None
        if brink:  # armed before any executor can claim it
            self.brink_keys[key] = (kind, self.now())
            self._write_brink_keys()
        if self._enqueue(request, planned) is not None:
            self._after_enqueue(planned)

    def _write_brink_keys(self) -> None:
        partial = self.brink_file.with_name(self.brink_file.name + ".partial")
        partial.write_text("".join(f"{key}\n" for key in sorted(self.brink_keys)))
        os.replace(partial, self.brink_file)

    def _after_enqueue(self, planned: Planned) -> None:
        if planned.proposed and not planned.parked:
            self.at(self.work_rng.uniform(1, 15), lambda: self._decide(planned))

    def _decide(self, planned: Planned) -> None:
        admit = self.work_rng.random() < 0.8

        def once() -> None:
            with self.cell_of_id(planned.id).engine.begin() as conn:
                (outbox.admit if admit else outbox.refuse)(conn, planned.id)

        try:
            retrying("decide", once, self.errors)
        except OutboxError:
            self.errors["decision on an action already gone"] += 1

    def _park_proposals(self) -> None:
        """A few proposals nobody decides, each with an action behind it: legitimately waiting at the end."""
        for n in range(3):
            lane = f"parked:{n}"
            for proposed in (True, False):
                key = f"parked:{n}:{int(proposed)}"
                request = outbox.ActionRequest(
                    kind=kinds.READBACK, lane_key=lane, idempotency_key=key, payload={}, proposed=proposed
                )
                self._enqueue(request, Planned(0, kinds.READBACK.name, key, lane, None, proposed=proposed, parked=True))

    def erase_one(self) -> None:
        """Erase an account that has actions waiting (an application's erasure: the outbox part of it); in a
        cells run, in every cell (its actions' lanes may lie in several)."""
        candidates: list[int] = []
        for cell in self.cells:
            with cell.engine.connect() as conn:
                candidates += conn.execute(
                    text("""
                    SELECT DISTINCT subject_account_id FROM agent_action
                     WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') AND subject_account_id IS NOT NULL
                       AND subject_account_id < 9000
                    """)
                ).scalars()
        candidates = sorted(set(candidates))
        # never a brink action's account, so that every brink ends with its effect found or not (an erased
        # brink action leaves no reference, and its provider's faults would wait for it in vain)
        brinks = {plan.account for plan in self.planned.values() if plan.brink}
        candidates = [account for account in candidates if account not in brinks]
        if not candidates:
            return
        account = self.work_rng.choice(candidates)

        def once(cell: CellDb) -> Erasure:
            with cell.engine.begin() as conn:
                rows = conn.execute(
                    text("""
                    SELECT id, kind, state, stop_reason, write_started_at IS NOT NULL AS fenced
                      FROM agent_action WHERE subject_account_id = :a ORDER BY id FOR UPDATE
                    """),
                    {"a": account},
                ).mappings()
                found = [dict(r) for r in rows]
                erase_account(conn, account)
                at = float(conn.execute(text("SELECT extract(epoch FROM clock_timestamp())::float8")).scalar_one())
                return Erasure(account, at, found)

        for cell in self.cells:
            self.erasures.append(retrying("erase", functools.partial(once, cell), self.errors))
        self.erased_accounts.add(account)
        self.faults["erasure (workload)"] += 1

    # ---- faults ----

    def healthy(self) -> list[Slot]:
        return [
            s
            for s in self.slots
            if s.process is not None
            and s.process.poll() is None
            and s.paused_until is None
            and s.brink is None
            and s.down_since is None
            # not before its first heartbeat (a restart's time to beat is the process's own), and not
            # under a network fault or before its first heartbeat after one
            and s.beat_at is not None
            and s.partition is None
            and _state(s.process.pid) != "T"
        ]

    # the first round injects every kind once, in this order (the providers' faults hold no executor: last)
    FAULT_WEIGHTS: ClassVar[dict[str, int]] = {
        "SIGKILL": 30,
        "relay": 22,
        "relay throttling": 6,
        "pg_terminate_backend": 18,
        "SIGSTOP short": 8,
        "PostgreSQL restart": 4,
        "network cut": 6,
        "network delay": 5,
        "network blackhole short": 5,
        "SIGSTOP past the lease": 5,
        "network blackhole past the lease": 3,
        "cell primary SIGKILL": 4,
        "NATS server SIGKILL": 4,
        "webhook relay cut": 5,
        "webhook relay blackhole": 3,
        "webhook receiver SIGKILL": 4,
        "webhook receiver throttling": 5,
    }

    def fault_names(self) -> list[str]:
        """The kinds of fault this run injects, in the first round's order."""
        names = [n for n in self.FAULT_WEIGHTS if self.restartable or n != "PostgreSQL restart"]
        return [n for n in names if (self.config.cells and self.restartable) or n != "cell primary SIGKILL"]

    def fault_plan(self) -> Iterator[str]:
        """Every kind once (the long pauses last, so a short run still sees kills), then at random by weight."""
        names = self.fault_names()
        yield from names
        weights = [self.FAULT_WEIGHTS[n] for n in names]
        while True:
            yield self.rng.choices(names, weights)[0]

    def post_fault_plan(self) -> Iterator[str]:
        """The Slack, GitHub and GitLab APIs' faults, on a schedule and a random sequence of their own (the
        plan above stays as it was): every one once, then at random by weight."""
        names = [f"{posts.LABELS[kind]} {fault}" for fault in POST_FAULTS for kind in posts.KINDS]
        yield from names
        weights = [POST_FAULTS[name.partition(" API ")[2]] for name in names]
        while True:
            yield self.post_rng.choices(names, weights)[0]

    def inject(self, name: str) -> bool:
        """Inject one fault; False when it cannot be now (no executor to spare)."""
        rng = self.rng
        if name in ("SIGKILL", "SIGSTOP short", "SIGSTOP past the lease") or name.startswith("network "):
            # at most two executors down, paused or cut off by faults, and one left running (a network
            # cut or delay leaves its executor running)
            candidates = self.healthy()
            faulted = sum(
                1
                for s in self.slots
                if s.down_since is not None
                or s.paused_until is not None
                or (s.partition is not None and s.partition.kind.startswith("blackhole"))
            )
            stops = name not in ("network cut", "network delay")
            if not candidates or (stops and (len(candidates) < 2 or faulted >= 2)):
                return False
            slot = rng.choice(candidates)
            if name.startswith("network "):
                self._partition(slot, name.removeprefix("network "))
            elif name == "SIGKILL":
                self._kill(slot)
            else:
                seconds = rng.uniform(0.5, 5) if name == "SIGSTOP short" else rng.uniform(66, 80)
                assert slot.process is not None
                self._stop(slot.process.pid)
                slot.paused_until = self.now() + seconds
        elif name == "relay":
            choice, faults = self._relay_fault()
            self.sink.faults = faults
            self.relay_fault_until = self.now() + rng.uniform(0.5, 4)
            name = f"relay: {choice}"
        elif name == "relay throttling":
            choice, faults = rng.choice(THROTTLING)
            self.sink.faults = faults
            self.relay_fault_until = self.now() + rng.uniform(0.5, 4)
            name = f"relay throttling: {choice}"
        elif name == "pg_terminate_backend":
            everyone = rng.random() < 0.3
            cell = rng.choice(self.cells)
            self.cell_faults[cell.label][name] += 1
            with cell.engine.connect() as conn:
                pids = sorted(
                    conn.execute(
                        text("""
                        SELECT pid FROM pg_stat_activity
                         WHERE datname = current_database() AND pid <> pg_backend_pid()
                           AND application_name <> 'chaos-driver'
                        """)
                    ).scalars()
                )
                chosen = pids if everyone else rng.sample(pids, min(len(pids), rng.randint(1, 5)))
                for pid in chosen:
                    conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            name = f"pg_terminate_backend ({'every connection' if everyone else 'some connections'})"
        elif name in PROVIDER_FAULTS:
            return self._provider_fault(name)
        elif name == "PostgreSQL restart":
            cell = rng.choice(self.restartable)
            assert cell.own is not None
            mode = rng.choice(["fast", "immediate"])
            self.pg_restarts.append(cell.own.restart(mode))
            cell.engine.dispose()
            self.cell_faults[cell.label][name] += 1
            name = f"PostgreSQL restart ({mode})"
        elif name == "cell primary SIGKILL":
            # a cell's primary crashes: its postmaster SIGKILLed, down a few seconds (the runner, the
            # application's side, waits meanwhile; the executors carry on with the other cells), then started
            # again through crash recovery
            cell = rng.choice(self.restartable)
            assert cell.own is not None
            self.pg_restarts.append(cell.own.kill_and_start(rng.uniform(1, 8)))
            cell.engine.dispose()
            self.cell_faults[cell.label][name] += 1
        self.faults[name] += 1
        return True

    def _provider_fault(self, name: str) -> bool:
        """A fault of the WEBHOOK or NATS_EVENT providers; False when the last one of its kind is not over."""
        providers, rng = self.provider, self.rng
        # a relay blackholed for up to 20 s must be over when a webhook brink's reclaim comes
        ahead = 25.0 if name == "webhook relay blackhole" else 10.0
        if self._armed("NATS_EVENT" if name == "NATS server SIGKILL" else "WEBHOOK", ahead):
            return False
        if name == "NATS server SIGKILL":
            if not providers.nats.running():
                return False
            providers.nats.kill()
            self.at(rng.uniform(1, 10), providers.nats.start)  # same port, same store
        elif name == "webhook receiver SIGKILL":
            if not providers.receiver_running():
                return False
            providers.kill_receiver()
            self.at(rng.uniform(0.5, 8), providers.start_receiver)  # same port, same journal
        elif name == "webhook receiver throttling":
            if providers.throttling():
                return False
            step = rng.choice(["429 2", "429", "503 1"])
            providers.throttle(step)
            self.at(rng.uniform(1, 8), providers.end_throttling)
            name = f"webhook receiver throttling: {step}"
        elif name == "webhook relay cut":
            self.faults["webhook relay: connections reset"] += providers.relay.cut()
        else:
            if providers.relay.mode != "pass":
                return False
            providers.relay.blackhole()
            self.at(rng.uniform(2, 20), providers.relay.pass_)
        self.faults[name] += 1
        return True

    def _post_fault(self, name: str) -> bool:
        """A fault of the Slack, GitHub or GitLab API; False when the last one of its kind is not over."""
        kind = next(k for k in posts.KINDS if name.startswith(posts.LABELS[k]))
        api, rng = self.apis.apis[kind], self.rng
        if self._arming(kind) or not api.running() or api.scripted():
            return False
        fault = name.removeprefix(posts.LABELS[kind] + " ")
        if fault == "SIGKILL":
            api.kill()
            self.at(rng.uniform(0.5, 8), api.start)  # same port, same journal
        elif fault == "answers lost after the write":
            # the next posts are stored and their answers lost: the connection reset, or a 502
            lost = [rng.choice(posts.LOST[kind]) for _ in range(rng.randint(1, 3))]
            api.script_steps(lost)
            self.faults[f"{name} (posts)"] += len(lost)
        else:  # a rate limit for a while: every post refused, nothing stored
            api.script_steps([rng.choice(posts.LIMITED[kind]) for _ in range(500)])
            self.at(rng.uniform(2, 12), lambda: api.script_steps([]))
        self.faults[name] += 1
        return True

    def _relay_fault(self) -> tuple[str, Faults]:
        hot_admins = [f"admin{n}@example.com" for n in (1, 2, 3, 4)]
        options = [
            ("451 to MAIL", Faults(mail="451 4.3.0 try later")),
            ("550 to MAIL", Faults(mail="550 5.7.1 sender refused")),
            ("450 to RCPT", Faults(rcpt={a: "450 4.2.1 mailbox busy" for a in hot_admins})),
            ("550 to one RCPT", Faults(rcpt={hot_admins[0]: "550 5.1.1 no such user"})),
            ("452 to DATA", Faults(data="452 4.3.1 insufficient storage")),
            ("554 to DATA", Faults(data="554 5.7.1 message refused")),
            ("drop after DATA", Faults(after_data="drop")),
            ("stall after DATA (past the window)", Faults(after_data="stall")),
            ("flaky relay", Faults(flaky=0.5)),
        ]
        return self.rng.choice(options)

    def _partition(self, slot: Slot, kind: str) -> None:
        """A network fault between one executor and the database: its relays only."""
        assert slot.process is not None
        rng = self.rng
        seconds = {
            "blackhole past the lease": self.config.lease_seconds + 10,
            "blackhole short": rng.uniform(2, 8),
            "delay": rng.uniform(5, 20),
            "cut": 0.0,
        }[kind]
        log = self._log_of(slot)
        partition = Partition(
            len(self.partitions) + 1,
            kind,
            slot.index,
            slot.process.pid,
            self.now(),
            seconds,
            time.time(),
            log,
            log.stat().st_size if log.exists() else 0,
            slot.skew,
        )
        self.partitions.append(partition)
        slot.partition = partition
        if kind == "cut":
            partition.detail = f"{sum(relay.cut() for relay in slot.relays)} connections reset"
            partition.ended_at, partition.wall_end = partition.at, partition.wall_at
            return
        if kind == "delay":
            chunk_delay = rng.uniform(0.2, 2)
            partition.detail = f"{chunk_delay:.1f} s per chunk"
            for relay in slot.relays:
                relay.delay(chunk_delay)
        else:
            for relay in slot.relays:
                relay.blackhole()

        def heal() -> None:
            for relay in slot.relays:
                relay.pass_()
            partition.ended_at, partition.wall_end = self.now(), time.time()

        self.at(seconds, heal)

    def _kill(self, slot: Slot) -> None:
        assert slot.process is not None
        slot.process.send_signal(signal.SIGKILL)
        slot.process.wait(30)
        held = journal.held(slot.journal)
        kill = Kill(len(self.kills) + 1, self.now(), slot.index, held)
        if not held:
            kill.recovered_at = kill.at
        self.kills.append(kill)
        slot.down_since = self.now()
        delay = self.rng.uniform(0.3, 4)
        skew = self.rng.choice(RESTART_SKEWS)

        def restart() -> None:
            slot.skew = skew
            self._start(slot)
            assert slot.process is not None
            kill.restarted_at, kill.new_pid = self.now(), slot.process.pid
            if skew:
                self.faults["executor restarted with a skewed clock"] += 1

        self.at(delay, restart)

    # each brink returns False when it cannot be armed now (its provider is down): tried again a second later

    def brink_readback(self) -> bool:
        self._enqueue_readback({"max_attempts": 5}, brink=True, lane=f"rb:{self.work_rng.randint(0, 299)}")
        self.faults["brink: read-back holder frozen after its window check (on purpose)"] += 1
        return True

    def brink_webhook(self) -> bool:
        providers = self.provider
        if not providers.receiver_running() or providers.relay.mode != "pass":
            return False
        self._brink_after_accept("WEBHOOK")
        self.faults["brink: webhook holder frozen after the receiver accepted it (on purpose)"] += 1
        return True

    def brink_nats(self) -> bool:
        if not self.provider.nats.running():
            return False
        self._brink_after_accept("NATS_EVENT")
        self.faults["brink: NATS holder frozen after its PubAck (on purpose)"] += 1
        return True

    def brink_post(self, kind: str) -> bool:
        api = self.apis.apis[kind]
        if not api.running() or api.scripted():
            return False
        self._enqueue_post(kind, {"max_attempts": 5}, brink=True, lane=f"brink:{kind.lower()}:{next(self.counters)}")
        self.faults[f"brink: {posts.LABELS[kind]} holder frozen after the post was stored (on purpose)"] += 1
        return True

    def _brink_after_accept(self, kind: str) -> None:
        """An action, in a lane of its own, whose holder freezes once the provider accepted it."""
        lane = f"brink:{kind.lower()}:{next(self.counters)}"
        self._enqueue_alert_event(kind, {"max_attempts": 5}, brink=True, lane=lane)

    def _disarm(self, action_id: int) -> None:
        """The brink was seen: a later claim of its action runs as any other."""
        plan = self.planned.get(action_id)
        if plan is not None and plan.key in self.brink_keys:
            del self.brink_keys[plan.key]
            self._write_brink_keys()

    def _armed(self, kind: str, ahead: float = 10.0) -> bool:
        """A brink of `kind` waits for its provider to accept (for a minute at most), then for the next claim
        once the lease expired (until its action ended, a minute at most): its provider's faults wait too, so
        the brink shows the effect found, not a fault's retry (WEBHOOK's second retry waits 5 min)."""
        now, lease = self.now(), self.config.lease_seconds
        if self._arming(kind):
            return True
        # from `ahead` seconds before the lease expires: longer than the fault about to be injected lasts
        reclaims = [
            b.action_id
            for b in self.brinks
            if b.kind == kind and b.action_id is not None and b.since + lease - ahead <= now <= b.since + lease + 60
        ]
        if not reclaims:
            return False
        ended = 0
        for cell in self.cells:
            with cell.engine.connect() as conn:
                ended += conn.execute(
                    text("SELECT count(*) FROM agent_action WHERE id = ANY (:ids) AND ended_at IS NOT NULL"),
                    {"ids": reclaims},
                ).scalar_one()
        return int(ended) < len(reclaims)

    def _arming(self, kind: str) -> bool:
        """A brink of `kind` waits for its provider to accept (a minute at most): no fault may refuse it. (A
        Slack, GitHub or GitLab brink's reclaim reads back whatever its API answers: its faults need not wait.)"""
        return any(k == kind and self.now() - at < 60 for k, at in self.brink_keys.values())

    def brink_email(self) -> bool:
        if self.brink_accounts_used == self.BRINK_ACCOUNTS:
            return True
        self.brink_accounts_used += 1
        account = 9000 + self.brink_accounts_used
        self.relay_brink_addresses.add(f"brink-{account - 9000}@example.com")
        self._enqueue_verify(account, {"max_attempts": 5}, brink=True)
        return True

    def _on_rcpt(self, session: Any, address: str) -> None:
        """In the sink's thread: freeze the process sending to a brink address, before RCPT is answered."""
        if address not in self.relay_brink_addresses:
            return
        self.relay_brink_addresses.discard(address)
        pid = _pid_of_peer(session.peer, self.sink.port)
        slot = next((s for s in self.slots if s.process is not None and s.process.pid == pid), None)
        if (
            pid is None
            or slot is None
            or slot.brink is not None
            or slot.paused_until is not None
            or slot.partition is not None
            or slot.beat_at is None
        ):
            self.faults["brink: email holder missed (its process was already stopped)"] += 1
            return
        self._stop(pid)
        self.frozen_by_relay.put((pid, address, self.now()))

    # ---- watching ----

    def watch(self) -> None:
        now = self.now()
        while not self.frozen_by_relay.empty():
            pid, address, since = self.frozen_by_relay.get()
            for slot in self.slots:
                if slot.process is not None and slot.process.pid == pid:
                    account = 9000 + int(address.split("-")[1].split("@")[0])
                    action = next(
                        (p for p in self.planned.values() if p.kind == "EMAIL" and p.account == account), None
                    )
                    slot.brink = Brink("EMAIL", action.id if action else None, None, since, slot.index)
                    self.brinks.append(slot.brink)
                    self.faults["brink: email holder frozen by the relay at RCPT, after its fence (on purpose)"] += 1
        for slot in self.slots:
            process = slot.process
            if process is None:
                continue
            if slot.down_since is None and process.poll() is not None:
                self.unexpected_exits.append(
                    f"executor {slot.index}.{slot.incarnation} exited {process.returncode} at {now:.0f} s"
                )
                slot.down_since = now
                self.at(0.5, lambda slot=slot: self._start(slot))  # type: ignore[misc]
                continue
            if slot.paused_until is not None and now >= slot.paused_until:
                if slot.brink is None:  # the relay may have frozen it meanwhile: then the brink wakes it
                    self._wake(process.pid)
                slot.paused_until = None
            if (
                slot.brink is None
                and slot.paused_until is None
                and slot.down_since is None
                and _state(process.pid) == "T"
            ):
                # stopped, and not by us: a holder that froze itself at the brink, once per action
                action_id, epoch, kind = journal.brink_of(slot.journal)
                if action_id is not None and action_id not in self.brinks_seen:
                    self.brinks_seen.add(action_id)
                    slot.brink = Brink(kind, action_id, epoch, now, slot.index)
                    if kind in AFTER_ACCEPT:
                        # the provider holds the effect, the store does not know yet: SIGKILL the holder, or
                        # keep it stopped past its lease (each in turn, per kind, SIGKILL first)
                        self._disarm(action_id)
                        slot.brink.ending = ("SIGKILL", "past the lease")[self.brinks_of_kind[kind] % 2]
                        self.brinks_of_kind[kind] += 1
                    self.brinks.append(slot.brink)
                    self.freezes.setdefault(process.pid, []).append([time.time() - 1, math.inf])
            if slot.brink is not None and slot.brink.ending == "SIGKILL" and now - slot.brink.since >= 1:
                slot.brink.released_at, slot.brink.outcome = now, "SIGKILLed while frozen"
                slot.brink = None
                self._kill(slot)
                continue
            if slot.brink is not None and self._release_brink(slot.brink, now):
                self._wake(process.pid)
                slot.brink.released_at = now
                slot.brink = None
        if self.relay_fault_until and now >= self.relay_fault_until:
            self.sink.faults = Faults()
            self.relay_fault_until = 0.0

    def _stop(self, pid: int) -> None:
        """SIGSTOP, noted: a late write by this process while or after it was frozen is explained."""
        self.freezes.setdefault(pid, []).append([time.time(), math.inf])
        os.kill(pid, signal.SIGSTOP)

    def _wake(self, pid: int) -> None:
        os.kill(pid, signal.SIGCONT)
        for freeze in self.freezes.get(pid, []):
            freeze[1] = min(freeze[1], time.time())

    def _release_brink(self, brink: Brink, now: float) -> bool:
        held = now - brink.since
        if held < self.config.lease_seconds + 3:
            return False
        if held > 150 or brink.action_id is None:
            brink.outcome = "released after 150 s"
            return True
        with self.cell_of_id(brink.action_id).engine.connect() as conn:
            state = conn.execute(
                text("SELECT state, epoch FROM agent_action WHERE id = :id"), {"id": brink.action_id}
            ).first()
        if state is None or state.state in ENDED_STATES:
            brink.outcome = f"released after the action ended {state.state if state else 'erased'}"
            return True
        return False

    def track_recoveries(self) -> None:
        """Kills taken back, and heartbeats: each process's first, and its first after a network fault."""
        now = self.now()
        pending = [k for k in self.kills if k.recovered_at is None]
        beating = [
            s
            for s in self.slots
            if s.process is not None
            and s.down_since is None
            and (s.beat_at is None or (s.partition is not None and s.partition.wall_end is not None))
        ]
        if not pending and not beating:
            return
        ids = sorted({i for k in pending for i, _ in k.held})
        rows: dict[int, tuple[int, str]] = {}
        seen_by_pid: dict[int, float | None] = {}
        for cell in self.cells:
            with cell.engine.connect() as conn:
                if pending:
                    mine = [i for i in ids if self.cell_of_id(i) is cell]
                    rows |= {
                        r.id: (r.epoch, r.state)
                        for r in conn.execute(
                            text("SELECT id, epoch, state FROM agent_action WHERE id = ANY (:ids)"), {"ids": mine}
                        )
                    }
                for slot in beating:
                    assert slot.process is not None
                    seen = conn.execute(
                        text(
                            "SELECT extract(epoch FROM max(seen_at))::float8 FROM agent_executor"
                            " WHERE executor_id LIKE :pattern"
                        ),
                        {"pattern": f"%:{slot.process.pid}:%"},
                    ).scalar_one()
                    # a cells run: the process's latest beat in any cell (a cell may be down)
                    before = seen_by_pid.get(slot.process.pid)
                    seen_by_pid[slot.process.pid] = max(seen, before) if seen and before else seen or before
        for kill in pending:
            if all(rows.get(i, (None, None)) != (e, "EXECUTING") for i, e in kill.held):
                kill.recovered_at = now
        for slot in beating:
            assert slot.process is not None
            seen = seen_by_pid.get(slot.process.pid)
            if seen is not None and slot.beat_at is None:
                slot.beat_at = now
                for kill in self.kills:
                    if kill.new_pid == slot.process.pid:
                        kill.beat_at = now
            self._after_partition(slot, seen, now)

    def _after_partition(self, slot: Slot, seen: float | None, now: float) -> None:
        """A network fault is over for its slot once the process beats again (seen_at after its end)."""
        partition = slot.partition
        if partition is None or partition.wall_end is None or partition.ended_at is None:
            return
        assert slot.process is not None
        if slot.process.pid != partition.pid:
            partition.outcome = "its process exited before it beat again"
        elif seen is not None and seen > partition.wall_end:
            partition.beat_after_end = seen - partition.wall_end
        elif now - partition.ended_at > self.PARTITION_BEAT_SECONDS:
            partition.outcome = f"no heartbeat within {self.PARTITION_BEAT_SECONDS} s of its end"
        else:
            return
        slot.partition = None

    PARTITION_BEAT_SECONDS = 120

    # ---- the run ----

    def run(self) -> Report:
        config = self.config
        report = Report(config.seed, config.minutes, _command(config), "")
        started = time.monotonic()
        try:
            self.set_up()
            report.postgres = self.postgres + (" (own, restartable)" if self.own else " (given server: no restart)")
            if config.cells:
                report.postgres += (
                    f"; {len(self.cells)} cells ({', '.join(c.label for c in self.cells)}),"
                    + (" each its own server" if self.restartable else " databases on one server")
                    + ", executors running `outbox run --all-cells`"
                )
                report.cells = [(c.label, c.index * CELL_ID_STRIDE) for c in self.cells]
            if self.pooler is not None:
                report.postgres += f", executors through PgBouncer ({config.pooler} pooling)"
            self.log(f"chaos: seed {config.seed}, {config.minutes} min of faults, work dir {self.work_dir}")
            self._first_beats()
            self._fault_phase()
            report.settle_seconds = self._settle()
            report.stop_codes = self._stop_executors()
            self._noticed()
            check(self, report)
        finally:
            self._tear_down()
        report.wall_seconds = time.monotonic() - started
        return report

    def _noticed(self) -> None:
        """When each network fault's executor first logged the database unreachable: before the next fault on
        its slot, and at most NOTICE_REACH_SECONDS after the fault's end (a line later than that, or one a
        PostgreSQL restart caused meanwhile, is another fault's)."""
        for partition in self.partitions:
            later = [p.wall_at for p in self.partitions if p.slot == partition.slot and p.wall_at > partition.wall_at]
            before = min([*later, (partition.wall_end or partition.wall_at) + self.NOTICE_REACH_SECONDS])
            noticed = journal.first_unreachable(partition.log, partition.log_offset, partition.skew, before)
            if noticed is not None:
                partition.noticed_after = noticed - partition.wall_at

    NOTICE_REACH_SECONDS = 30.0

    FIRST_BEAT_SECONDS = 120.0

    def _first_beats(self) -> None:
        """Wait until every executor beat once: a loaded machine's slow start-up takes none of the minutes of
        faults (a fault needs executors that beat, so a short run would otherwise miss some kinds)."""
        deadline = self.now() + self.FIRST_BEAT_SECONDS
        while self.now() < deadline and any(s.beat_at is None for s in self.slots):
            self._run_events()
            retrying("watch", self.watch, self.errors)
            retrying("track", self.track_recoveries, self.errors)
            time.sleep(0.1)

    def _fault_phase(self) -> None:
        config = self.config
        end = self.now() + config.seconds
        plan = self.fault_plan()
        postponed: list[str] = []
        kinds_injected: set[str] = set()
        next_fault = self.now() + self.rng.uniform(1, 2)
        post_plan, post_fault, next_post_fault = self.post_fault_plan(), "", self.now() + 3
        next_brink = self.now() + 2
        brink_posts = [functools.partial(self.brink_post, kind) for kind in posts.KINDS]
        order: list[Callable[[], bool]] = [self.brink_readback, self.brink_webhook, self.brink_nats, *brink_posts]
        brinks = itertools.cycle([*order, self.brink_email])
        brink_count = 0
        waiting_brink: Callable[[], bool] | None = None
        next_enqueue = self.now()
        next_erasure = self.now() + self.work_rng.uniform(2, 8)
        next_track = 0.0
        # a kind the first round has not injected by the end (its fault times postponed while no executor could
        # be spared) keeps the phase going, for at most as long again, so that every run sees every kind
        first_round = set(self.fault_names())
        while self.now() < end or (first_round - kinds_injected and self.now() < end + config.seconds):
            now = self.now()
            while next_enqueue <= now:
                self.enqueue_one()
                next_enqueue += self.work_rng.expovariate(config.rate)
            if now >= next_erasure:
                retrying("erase", self.erase_one, self.errors)
                next_erasure = now + self.work_rng.uniform(3, 12)
            if now >= next_brink:
                brink = waiting_brink or next(brinks)
                if brink():
                    waiting_brink = None
                    brink_count += 1
                    # the first seven early, apart, so a short run sees each (the email brink about 30 s in)
                    early = [5.0] * 5 + [max(5.0, min(30, config.seconds * 0.4) - 25)]
                    next_brink = now + (early[brink_count - 1] if brink_count <= len(early) else config.brink_every)
                else:
                    waiting_brink, next_brink = brink, now + 1
            if now >= next_fault:
                # one fault per fault time: the first that can be injected now; a fault that needs an
                # executor to spare waits for the next fault time (a few at most, oldest first, and every
                # kind not injected yet, so a short run sees each one)
                candidates, postponed, injected = [*postponed, next(plan)], [], False
                for name in candidates:
                    if injected or not retrying("inject", functools.partial(self.inject, name), self.errors):
                        postponed.append(name)
                    else:
                        injected = True
                        kinds_injected.add(name)
                fresh = [n for n in postponed if n not in kinds_injected]
                postponed = fresh + [n for n in postponed if n in kinds_injected][-8:]
                next_fault = now + self.rng.expovariate(1 / config.mean_fault_gap)
            if now >= next_post_fault:
                # a fault that cannot be injected now (its API down or still scripted) is tried again next time
                post_fault = post_fault or next(post_plan)
                post_fault = "" if self._post_fault(post_fault) else post_fault
                next_post_fault = now + self.post_rng.expovariate(1 / POST_FAULT_GAP)
            self._run_events()
            retrying("watch", self.watch, self.errors)
            if now >= next_track:
                retrying("track", self.track_recoveries, self.errors)
                next_track = now + 0.25
            time.sleep(0.02)
        self.injecting = False

    def _run_events(self) -> None:
        while self.events and self.events[0][0] <= self.now():
            _, _, event = heapq.heappop(self.events)
            retrying("event", event, self.errors)

    def _settle(self) -> float:
        """No new faults: wake and restart every executor, then wait until nothing is left to do."""
        started = self.now()
        self.sink.faults = Faults()
        self.relay_fault_until = 0.0
        for slot in self.slots:
            if slot.paused_until is not None:
                slot.paused_until = self.now()
        deadline = self.now() + self.config.settle_seconds
        while self.now() < deadline:
            self._run_events()
            retrying("watch", self.watch, self.errors)
            retrying("track", self.track_recoveries, self.errors)
            busy = self.events or any(
                s.brink or s.down_since is not None or s.partition is not None for s in self.slots
            )
            if not busy and not retrying("settled", lambda: self._unsettled(), self.errors):
                return self.now() - started
            time.sleep(0.25)
        return self.now() - started

    def _unsettled(self) -> int:
        left = 0
        for cell in self.cells:
            with cell.engine.connect() as conn:
                left += int(conn.execute(text(UNSETTLED)).scalar_one())
        return left

    def _stop_executors(self) -> list[int | None]:
        for slot in self.slots:
            for relay in slot.relays:  # a fault the settling outlasted: the network is back for the stop
                relay.pass_()
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGCONT)
                slot.process.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for slot in self.slots:
            assert slot.process is not None
            try:
                codes.append(slot.process.wait(120))
            except subprocess.TimeoutExpired:
                slot.process.kill()
                codes.append(None)
        return codes

    def _tear_down(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGCONT)
                slot.process.kill()
                slot.process.wait(30)
        for slot in self.slots:
            for relay in slot.relays:
                relay.close()
        if self.providers is not None:
            self.providers.close()
        if self.posts is not None:
            self.posts.close()
        if self.pooler is not None:
            self.pooler.stop()
        if hasattr(self, "sink"):
            self.sink.stop()
        for cell in self.cells:
            cell.engine.dispose()
            if cell.own is not None:
                cell.own.stop()
                continue
            admin = create_engine(cell.server, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{cell.db_name}" WITH (FORCE)'))
            admin.dispose()


# the faults of the WEBHOOK and NATS_EVENT providers (Chaos._provider_fault)
PROVIDER_FAULTS = (
    "NATS server SIGKILL",
    "webhook relay cut",
    "webhook relay blackhole",
    "webhook receiver SIGKILL",
    "webhook receiver throttling",
)
# a relay that asks to slow down, refusing every message for a while: its destination pauses for every executor
THROTTLING = [
    ("421 at connect", Faults(connect="421 4.7.0 Error: too many connections from 127.0.0.1")),
    ("450 rate at MAIL", Faults(mail="450 4.7.1 Error: too much mail from 127.0.0.1")),
    ("454 throttling at MAIL", Faults(mail="454 4.7.0 Throttling failure: Maximum sending rate exceeded")),
]

# Actions not ended outside the parked lanes, where proposals wait for a decision nobody takes on purpose,
# and not waiting behind (or at) a WEBHOOK whose retry is more than a minute ahead (its second waits 5 min).
UNSETTLED = """
SELECT count(*) FROM agent_action AS a
 WHERE a.ended_at IS NULL AND a.lane_key NOT LIKE 'parked:%'
   AND NOT EXISTS (SELECT 1 FROM agent_action AS b
                    WHERE b.lane_key = a.lane_key AND b.id <= a.id AND b.state = 'ADMITTED' AND b.kind = 'WEBHOOK'
                      AND b.due_at > now() + interval '60 seconds')
"""


def _cell_variable(cell: CellDb) -> str:
    """The environment variable that holds a cell's URL for an executor (through its relay)."""
    return f"OUTBOX_CHAOS_CELL_{(cell.name or '').upper()}_URL"


def _extra(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in ("expires_at", "proposed")}


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except OSError:
        return "?"


def _pid_of_peer(peer: tuple[str, int] | None, server_port: int) -> int | None:
    """The process whose socket is the other end of the sink's session (both ends: one local port may
    serve several connections to different servers)."""
    import psutil

    if peer is None:
        return None
    for connection in psutil.net_connections(kind="tcp4"):
        local, remote = connection.laddr, connection.raddr
        if local and remote and (local.ip, local.port) == (peer[0], peer[1]) and remote.port == server_port:
            return int(connection.pid) if connection.pid is not None else None
    return None


def _command(config: ChaosConfig) -> str:
    pooler = f" --pooler {config.pooler}" if config.pooler else ""
    cells = f" --cells {config.cells}" if config.cells else ""
    return f"python -m tests.chaos --seed {config.seed} --minutes {config.minutes:g}{pooler}{cells}"


def run_chaos(config: ChaosConfig) -> Report:
    return Chaos(config).run()
