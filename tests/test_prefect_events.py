"""The drain's Prefect events and the automation of deploy/prefect-notify.yaml, on a real Prefect server.

A `prefect server start` subprocess serves this module (its own PREFECT_HOME, stopped by its PID at the
end); the drain runs in this process against it, on a real PostgreSQL and a real SMTP sink. Each action that
ends UNCERTAIN, and each email that ends FAILED, is one event the server keeps, naming the action, its kind,
state, reason and notice and never the recipient. The automation, created with `prefect automation create`
once its block ID is filled in, sends one notification per such event through a custom webhook block to a
local HTTP receiver.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.orchestration import get_client
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.utilities.asyncutils import run_coro_as_sync
from sqlalchemy import Engine, text

from flows.drain import drain
from outbox.email.sink import Faults, SmtpSink
from outbox.stack import ROOT, descendants, free_port, kill_all, stop_process, wait_until_answers
from tests.support import prefect_post, until
from tests.test_flows import enqueue_alerts

NOTIFY_FILE = ROOT / "deploy" / "prefect-notify.yaml"
PLACEHOLDER = "REPLACE_WITH_NOTIFICATION_BLOCK_ID"
AUTOMATION = "outbox-notify-uncertain-and-failed"
RECIPIENT = "alice@example.com"  # the only recipient enqueue_alerts knows
ADAPTERS = "examples.accounts:adapters"
REFUSED = "554 5.7.1 refused"  # the relay refuses the message after DATA: the email ends FAILED

pytestmark = pytest.mark.usefixtures("outbox_logger_restored")


@dataclass(frozen=True)
class PrefectServer:
    url: str  # http://127.0.0.1:<port>
    home: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": f"{self.url}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "COLUMNS": "500",  # the CLI's messages on one line each
        }

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return prefect_post(self.url, path, body)

    def events(self, flow_run_id: Any) -> list[dict[str, Any]]:
        """The outbox events a flow run emitted (emit_event names the run as a related resource)."""
        body = {
            "filter": {
                "event": {"prefix": ["outbox.action."]},
                "related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
            },
            "limit": 50,
        }
        return list(self.post("/events/filter", body)["events"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            env=self.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )


def flush_prefect_workers() -> None:
    """Send what this process's log and event workers hold and stop them, so the next ones start on the
    API now configured (before this module's server, and before it stops)."""

    async def drain_all() -> None:
        for result in (APILogWorker.drain_all(), EventsWorker.drain_all()):
            if inspect.isawaitable(result):
                await result

    run_coro_as_sync(drain_all())


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """`prefect server start` on a free loopback port, with a PREFECT_HOME of its own; this process's
    Prefect client points at it for the module. Stopped by its PID: SIGTERM, then SIGKILL."""
    server = PrefectServer(f"http://127.0.0.1:{free_port()}", tmp_path_factory.mktemp("prefect-home"))
    port = server.url.rpartition(":")[2]
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", port]
    with (server.home / "server.log").open("ab") as log:
        process = subprocess.Popen(command, env=server.env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_answers(f"{server.url}/api/health", 120, "the Prefect server")
        flush_prefect_workers()
        with temporary_settings(updates={PREFECT_API_URL: f"{server.url}/api"}):
            yield server
            flush_prefect_workers()
    finally:
        started = descendants(process.pid)
        stop_process(process, 30)
        kill_all(started)


class Receiver:
    """A loopback HTTP endpoint that keeps the JSON body of every POST: where the webhook block notifies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with receiver.arrived:
                    receiver.bodies.append(body)
                    receiver.arrived.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/outbox-notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self, count: int, seconds: float) -> list[dict[str, Any]]:
        """What arrived, once `count` bodies have arrived or `seconds` have passed, whichever comes first."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.bodies) >= count, timeout=seconds)
            return list(self.bodies)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.server.shutdown()
    running.server.server_close()


def ended(engine: Engine, state: str) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id FROM agent_action WHERE state = :state ORDER BY id"), {"state": state})
        return list(rows.scalars())


def resource(action_id: int, state: str, reason: str) -> dict[str, str]:
    """The resource of an email's event, as the drain emits it."""
    return {
        "prefect.resource.id": f"outbox.action.{action_id}",
        "prefect.resource.name": f"EMAIL action {action_id}",
        "outbox.kind": "EMAIL",
        "outbox.state": state,
        "outbox.reason": reason,
        "outbox.notice": "workspace_alert",
    }


async def drain_run(max_actions: int) -> tuple[Any, dict[str, Any]]:
    """One drain run in this process: its flow run id and its summary."""
    state = await drain(max_seconds=20, max_actions=max_actions, adapters=ADAPTERS, return_state=True)
    return state.state_details.flow_run_id, await state.result()


def events_of(server: PrefectServer, flow_run_id: Any, count: int) -> list[dict[str, Any]]:
    """The run's outbox events, once the server has kept `count` of them."""
    found: list[dict[str, Any]] = []

    def kept() -> bool:
        found[:] = server.events(flow_run_id)
        return len(found) >= count

    until(kept, timeout=60, what=f"{count} outbox events of flow run {flow_run_id}")
    return found


async def test_each_uncertain_action_is_one_event_naming_it_and_never_its_recipient(
    prefect_server: PrefectServer, engine: Engine, sink: SmtpSink, outbox_env: None
) -> None:
    enqueue_alerts(engine, 3)
    sink.faults = Faults(after_data="drop")  # every send may or may not have gone out
    flow_run_id, summary = await drain_run(max_actions=3)
    assert summary["uncertain"] == 3
    uncertain = ended(engine, "UNCERTAIN")
    assert len(uncertain) == 3

    events = events_of(prefect_server, flow_run_id, 3)
    assert len(events) == 3 and {e["event"] for e in events} == {"outbox.action.uncertain"}
    by_resource = {e["resource"]["prefect.resource.id"]: e for e in events}
    assert set(by_resource) == {f"outbox.action.{i}" for i in uncertain}, "one event per UNCERTAIN action"
    for action_id in uncertain:
        event = by_resource[f"outbox.action.{action_id}"]
        assert event["resource"] == resource(action_id, "UNCERTAIN", "PROVIDER_UNCERTAIN")
        assert f"prefect.flow-run.{flow_run_id}" in {r["prefect.resource.id"] for r in event["related"]}
        assert RECIPIENT not in json.dumps(event) and "Alice" not in json.dumps(event)
        assert not event["payload"]


async def test_an_email_the_relay_refuses_ends_failed_and_is_one_event(
    prefect_server: PrefectServer, engine: Engine, sink: SmtpSink, outbox_env: None
) -> None:
    enqueue_alerts(engine, 2)
    sink.faults = Faults(data=REFUSED)
    flow_run_id, summary = await drain_run(max_actions=2)
    assert summary["by_result"] == {"FAILED": 2} and not sink.received
    failed = ended(engine, "FAILED")
    assert len(failed) == 2

    events = events_of(prefect_server, flow_run_id, 2)
    assert sorted(e["resource"]["prefect.resource.id"] for e in events) == [f"outbox.action.{i}" for i in failed]
    for event in events:
        action_id = int(event["resource"]["prefect.resource.id"].rpartition(".")[2])
        assert event["event"] == "outbox.action.failed"
        assert event["resource"] == resource(action_id, "FAILED", "PROVIDER_REFUSED")
        assert RECIPIENT not in json.dumps(event)


def test_the_automation_file_is_refused_while_its_placeholder_is_left_in(prefect_server: PrefectServer) -> None:
    assert PLACEHOLDER in NOTIFY_FILE.read_text()
    assert PLACEHOLDER in (ROOT / "docs" / "observability.md").read_text(), "the docs tell how to fill it in"
    done = prefect_server.cli("automation", "create", "--from-file", str(NOTIFY_FILE))
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    # among pydantic's errors for every kind of action, the one that matters names the field and the reason
    assert re.search(r"SendNotification\.block_document_id\s+Input should be a valid UUID", output), output
    assert AUTOMATION not in prefect_server.cli("automation", "ls").stdout


async def test_the_automation_notifies_once_per_event_through_a_webhook_block(
    prefect_server: PrefectServer,
    engine: Engine,
    sink: SmtpSink,
    outbox_env: None,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    # the user's notification block, here a custom webhook to a local receiver
    block = CustomWebhookNotificationBlock(
        name="outbox",
        url=receiver.url,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
        headers=None,
        cookies=None,
    )
    block_id = await block.asave("outbox-notify-test", overwrite=True)
    # the file with the block's ID in place of the placeholder, as the docs tell, then the CLI
    filled = tmp_path / "outbox-notify.yaml"
    filled.write_text(NOTIFY_FILE.read_text().replace(PLACEHOLDER, str(block_id)))
    done = prefect_server.cli("automation", "create", "--from-file", str(filled))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Created automation '{AUTOMATION}'" in done.stdout
    try:
        enqueue_alerts(engine, 2)  # one lane: the first ends FAILED in the first run, the second UNCERTAIN
        sink.faults = Faults(data=REFUSED)
        _, summary = await drain_run(max_actions=1)
        assert summary["by_result"] == {"FAILED": 1}
        sink.faults = Faults(after_data="drop")
        _, summary = await drain_run(max_actions=1)
        assert summary["by_result"] == {"UNCERTAIN": 1}
        [failed], [uncertain] = ended(engine, "FAILED"), ended(engine, "UNCERTAIN")

        until(lambda: len(receiver.received(2, 1.0)) >= 2, timeout=90, what="two notifications")
        notifications = receiver.received(2, 0)
        assert len(notifications) == 2, "one notification per event"
        expected = {failed: ("FAILED", "PROVIDER_REFUSED"), uncertain: ("UNCERTAIN", "PROVIDER_UNCERTAIN")}
        subjects = {f"outbox: EMAIL action {i} ended {state} ({reason})": i for i, (state, reason) in expected.items()}
        assert {n["subject"] for n in notifications} == set(subjects), notifications
        for notification in notifications:
            action_id = subjects[notification["subject"]]
            body = notification["body"]
            assert f"action: {action_id}\n" in body and f"`outbox show {action_id}`" in body
            assert "kind: EMAIL\n" in body and "notice: workspace_alert\n" in body
            assert f"reason: {expected[action_id][1]}\n" in body
            assert RECIPIENT not in json.dumps(notification) and "http" not in body
    finally:
        async with get_client() as client:
            for automation in await client.read_automations_by_name(AUTOMATION):
                await client.delete_automation(automation.id)
