"""A drain run shows its work while it runs, on a real Prefect server with its UI, a real PostgreSQL and a
real SMTP sink.

The run drains in this process, emails only, while events (a kind it does not carry out) wait in two lanes:
a backlog that holds still, so the figures the run shows can be compared with the database's. While the run
works, the test reads its live artifact and its log lines through Prefect's API, renders the run's page and
the artifact's page in headless chromium (a screenshot of each under tmp_path), enqueues more emails and
sees the same artifact updated in place, then stops the run with SIGTERM and counts what it wrote to the
Prefect server's database.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prefect.client.schemas.objects import State
from prefect.logging.handlers import APILogHandler
from sqlalchemy import Engine, text

from examples.accounts import events, notices
from flows import live as live_view
from flows.drain import SUMMARY_KEY, drain
from flows.live import LIVE_KEY
from outbox.email import enqueue_email
from outbox.nats import enqueue_event
from tests.prefect_server import PrefectServer, serve
from tests.support import prefect_post
from tests.test_flows import enqueue_alerts

pytestmark = pytest.mark.usefixtures("outbox_logger_restored", "short_live_periods")

# the live view's periods (30 s between refreshes, 60 s between log lines) shortened, so the test waits for each
# rule to act instead of for the clock
LIVE_SECONDS, LOG_SECONDS = 1.0, 3.0
EMAILS = 3  # workspace 10's alerts, one lane: the run's attempts
EVENTS = {10: 4, 11: 2}  # events per workspace, one lane each: left due, as no executor carries them out
T = TypeVar("T")


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    from demo.stack import free_port

    home = tmp_path_factory.mktemp("prefect-ui-home")
    yield from serve(PrefectServer(f"http://127.0.0.1:{free_port()}", home, ui=True))


@pytest.fixture
def short_live_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_view, "LIVE_SECONDS", LIVE_SECONDS)
    monkeypatch.setattr(live_view, "LOG_SECONDS", LOG_SECONDS)


def enqueue_workload(engine: Engine) -> None:
    enqueue_alerts(engine, EMAILS)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO app_workspace VALUES (11, 'Operations')"))
        for workspace, count in EVENTS.items():
            alerts = range(workspace * 100, workspace * 100 + count)
            conn.execute(
                text("INSERT INTO app_alert SELECT g, :workspace, 'alert', 'body' FROM unnest(CAST(:ids AS int[])) g"),
                {"workspace": workspace, "ids": list(alerts)},
            )
            for alert in alerts:
                enqueue_event(conn, events.ALERT_EVENT, {"workspace_id": workspace, "alert_id": alert})


def enqueue_more_emails(engine: Engine, count: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO app_alert SELECT g, 10, 'alert', 'body' FROM generate_series(CAST(:a AS int), :b) g"),
            {"a": EMAILS + 1, "b": EMAILS + count},
        )
        for alert in range(EMAILS + 1, EMAILS + count + 1):
            enqueue_email(conn, notices.WORKSPACE_ALERT, {"workspace_id": 10, "alert_id": alert})


def database_figures(engine: Engine) -> dict[str, Any]:
    """What the database holds, counted here without outbox's own statements: ended emails, and the actions
    not started by lane (each lane's head is due now: nothing of it executes)."""
    with engine.connect() as conn:
        done = conn.execute(text("SELECT count(*) FROM agent_action WHERE kind = 'EMAIL' AND state = 'DONE'"))
        lanes = conn.execute(
            text("""
            SELECT lane_key, count(*) AS depth, min(id) AS head, (array_agg(state ORDER BY id))[1] AS head_state,
                   extract(epoch FROM now() - min(created_at))::float8 AS age
              FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED')
             GROUP BY lane_key ORDER BY depth DESC, lane_key
            """)
        ).all()
        executing = conn.execute(text("SELECT count(*) FROM agent_action WHERE state = 'EXECUTING'")).scalar_one()
    return {
        "done": done.scalar_one(),
        "lanes": [(row.lane_key, row.depth, row.head, row.head_state) for row in lanes],
        "due": len(lanes),
        "waiting": sum(row.depth for row in lanes) - len(lanes),
        "oldest_age": max(row.age for row in lanes),
        "executing": executing,
    }


def shows_database(markdown: str, db: dict[str, Any]) -> None:
    """The live artifact shows the database's figures: attempts, backlog, deepest lanes with their heads."""
    assert f"**Attempts so far: {db['done']}**" in markdown, markdown
    assert f"| EMAIL | DONE | yes | {db['done']} |" in markdown, markdown
    backlog = re.search(r"^\| (\d+) \| (\d+) \| ([\d.]+) s \| (\d+) \| (\d+) \|$", markdown, re.MULTILINE)
    assert backlog, markdown
    due, waiting, age, with_backlog, executing = backlog.groups()
    assert (int(due), int(waiting), int(with_backlog), int(executing)) == (
        db["due"],
        db["waiting"],
        len(db["lanes"]),
        db["executing"],
    ), markdown
    assert 0 < float(age) <= db["oldest_age"], (age, db["oldest_age"])
    for lane, depth, head, state in db["lanes"]:
        assert f"| `{lane}` | {depth} | {head} | {state} |" in markdown, markdown


def live_line(db: dict[str, Any]) -> re.Pattern[str]:
    lanes = ", ".join(f"{lane} {depth} \\(head {head}\\)" for lane, depth, head, _ in db["lanes"])
    return re.compile(
        rf"live: {db['done']} attempts \(EMAIL DONE {db['done']}\); backlog: due now {db['due']},"
        rf" waiting behind lane heads {db['waiting']}, oldest due [\d.]+ s; deepest lanes: {lanes}$"
    )


async def eventually(read: Callable[[], T], holds: Callable[[T], bool], seconds: float, what: str) -> T:
    """Read (in a thread: the run shares this event loop) every half second until `holds`; fail after
    `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        value = await asyncio.to_thread(read)
        if holds(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}: {value!r}")
        await asyncio.sleep(0.5)


async def watch(url: str, engine: Engine, tmp_path: Path) -> str:
    """Follow the running run through Prefect's API and chromium; its id."""

    def running() -> list[dict[str, Any]]:
        body = {"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}}
        return list(prefect_post(url, "/flow_runs/filter", body))

    (flow_run,) = await eventually(running, lambda runs: len(runs) == 1, 120, "the drain run to run")
    run_id = flow_run["id"]

    def artifacts() -> list[dict[str, Any]]:
        return list(prefect_post(url, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}}))

    def live_lines() -> list[str]:
        body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
        return [log["message"] for log in prefect_post(url, "/logs/filter", body) if log["message"].startswith("live:")]

    # the emails are sent within a second: the next refresh shows them, the backlog holding still
    await eventually(lambda: database_figures(engine)["done"], lambda done: done == EMAILS, 60, "the emails")
    db = database_figures(engine)
    assert (db["due"], db["waiting"]) == (2, 4) and db["lanes"][0][:2] == ("workspace:10:event", 4), db
    claimed = await eventually(artifacts, lambda found: len(found) == 1, 60, "the live artifact")
    (live,) = await eventually(
        artifacts, lambda found: f"Attempts so far: {EMAILS}**" in found[0]["data"], LIVE_SECONDS + 30, "a refresh"
    )
    assert live["id"] == claimed[0]["id"] and live["key"] == LIVE_KEY and live["type"] == "markdown"
    shows_database(live["data"], database_figures(engine))
    # the log line: one at the first claim, the next once the figures moved and a minute passed
    lines = await eventually(
        live_lines, lambda found: any(live_line(db).match(line) for line in found), LOG_SECONDS + 30, "a live line"
    )
    assert len(lines) <= 2, lines

    # the Prefect UI, in a real browser: the run's logs, and the artifact's page
    run_page = await asyncio.to_thread(browse, f"{url}/runs/flow-run/{run_id}", tmp_path / "profile", "--dump-dom")
    assert f"live: {EMAILS} attempts (EMAIL DONE {EMAILS})" in run_page
    artifact_page = await asyncio.to_thread(
        browse, f"{url}/artifacts/artifact/{live['id']}", tmp_path / "profile", "--dump-dom"
    )
    assert f"Attempts so far: {EMAILS}" in artifact_page and "workspace:10:event" in artifact_page
    for name, page in (("run", f"runs/flow-run/{run_id}"), ("artifact", f"artifacts/artifact/{live['id']}")):
        shot = tmp_path / f"{name}.png"
        await asyncio.to_thread(browse, f"{url}/{page}", tmp_path / "profile", f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000, f"the Prefect UI rendered nothing of the {name} page"

    # more work: the same artifact, updated in place, while the run still runs
    enqueue_more_emails(engine, 2)
    await eventually(lambda: database_figures(engine)["done"], lambda done: done == EMAILS + 2, 60, "the emails")
    (updated,) = await eventually(
        artifacts, lambda found: f"Attempts so far: {EMAILS + 2}**" in found[0]["data"], LIVE_SECONDS + 30, "updated"
    )
    assert updated["id"] == live["id"]
    shows_database(updated["data"], database_figures(engine))

    return str(run_id)


async def running_drain() -> State[Any]:
    """A drain run of emails, for up to ten minutes (the test stops it before)."""
    return await drain(max_seconds=600, adapters="examples.accounts:adapters", return_state=True)


async def test_a_running_drain_shows_its_attempts_backlog_and_lanes_in_prefect(
    ui_server: PrefectServer, engine: Engine, outbox_env: None, tmp_path: Path
) -> None:
    url = ui_server.url
    enqueue_workload(engine)
    run: asyncio.Task[State[Any]] = asyncio.create_task(running_drain())
    try:
        run_id = await watch(url, engine, tmp_path)
        assert not run.done()
    except BaseException:
        run.cancel()
        raise
    os.kill(os.getpid(), signal.SIGTERM)  # as its worker stops it: the run hands back and ends
    state = await asyncio.wait_for(run, 60)
    assert state.is_completed()
    assert (await state.result())["attempts"] == EMAILS + 2

    # what the run wrote to the Prefect database: one live artifact (updated in place) and the hand-over
    # table; its log lines: a few at its start and end, and the live lines (one a minute at most)
    artifacts = prefect_post(url, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})
    assert sorted((a["key"], a["type"]) for a in artifacts) == [(LIVE_KEY, "markdown"), (SUMMARY_KEY, "table")]
    await APILogHandler.aflush()
    body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200}
    messages = [log["message"] for log in prefect_post(url, "/logs/filter", body)]
    live = [message for message in messages if message.startswith("live:")]
    seconds = state.timestamp.timestamp() - min(datetime.fromisoformat(a["created"]).timestamp() for a in artifacts)
    assert 2 <= len(live) <= 1 + seconds / LOG_SECONDS, messages
    assert len(messages) - len(live) <= 6, messages
    # one event for each artifact's creation (its key's newest version changed); a refresh in place makes none
    body = {
        "filter": {
            "event": {"prefix": ["prefect.artifact-collection."]},
            "related": {"id": [f"prefect.flow-run.{run_id}"]},
        },
        "limit": 50,
    }
    await eventually(
        lambda: prefect_post(url, "/events/filter", body)["events"], lambda found: len(found) == 2, 60, "2 events"
    )


def browse(url: str, profile: Path, *output: str) -> str:
    """Headless chromium on `url`, given 15 s of virtual time to render the Prefect UI's pages; `output` says
    what it gives (`--screenshot=<file>`, or `--dump-dom`: the rendered page on stdout, returned)."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: .ci/run installs Debian's chromium"
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1400,900",
            "--virtual-time-budget=15000",
            *output,
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout
