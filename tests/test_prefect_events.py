"""The drain's Prefect events and the automation of deploy/prefect-notify.yaml, on a real Prefect server.

A `prefect server start` subprocess serves this module (its own PREFECT_HOME, stopped by its PID at the
end); the drain runs in this process against it, on a real PostgreSQL and a real SMTP sink. Each action that
ends UNCERTAIN or FAILED is one event the server keeps, naming the action, its kind, state, reason and the
trace its adapter noted (an email's notice and Message-ID), and never the recipient. The automation,
created with `prefect automation create` once its block ID is filled in, sends one notification per such
event through a custom webhook block to a local HTTP receiver.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.blocks.system import Secret
from prefect.client.orchestration import get_client
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.receiver import Receiver as WebhookReceiver
from demo.sink import Faults, SmtpSink
from demo.stack import ROOT
from flows.drain import drain, emit_destination
from outbox.executor import ActionAttempt, Executor, ExecutorConfig, Result, Retry
from outbox.store import executor as store_executor
from outbox.webhook import endpoints as endpoint_registry
from outbox.webhook import enqueue_webhook, register_endpoint
from outbox.webhook import events as event_registry
from outbox.webhook import register as register_webhook
from tests import kinds
from tests.adapters import ScriptedAdapter, fence_and_confirm
from tests.prefect_server import PrefectServer
from tests.support import until
from tests.test_executor_results import enqueue
from tests.test_flows import enqueue_alerts
from tests.webhook_events import NumberedHook

NOTIFY_FILE = ROOT / "deploy" / "prefect-notify.yaml"
PLACEHOLDER = "REPLACE_WITH_NOTIFICATION_BLOCK_ID"
AUTOMATION = "outbox-notify-uncertain-and-failed"
RECIPIENT = "alice@example.com"  # the only recipient enqueue_alerts knows
ADAPTERS = "examples.accounts:adapters"
REFUSED = "554 5.7.1 refused"  # the relay refuses the message after DATA: the email ends FAILED

pytestmark = pytest.mark.usefixtures("outbox_logger_restored")


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


def resource(engine: Engine, action_id: int, state: str, reason: str) -> dict[str, str]:
    """The resource of an email's event, as the drain emits it: its trace is the one the action keeps."""
    with engine.connect() as conn:
        trace = conn.execute(text("SELECT trace FROM agent_action WHERE id = :id"), {"id": action_id}).scalar_one()
    assert set(trace) == {"notice", "message_id"}, trace
    return {
        "prefect.resource.id": f"outbox.action.{action_id}",
        "prefect.resource.name": f"EMAIL action {action_id}",
        "outbox.kind": "EMAIL",
        "outbox.state": state,
        "outbox.reason": reason,
        "outbox.trace.notice": "workspace_alert",
        "outbox.trace.message_id": trace["message_id"],
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
        assert event["resource"] == resource(engine, action_id, "UNCERTAIN", "PROVIDER_UNCERTAIN")
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
        assert event["resource"] == resource(engine, action_id, "FAILED", "PROVIDER_REFUSED")
        assert RECIPIENT not in json.dumps(event)


class RefusedHook(NumberedHook):
    """A webhook whose receiver answers 410 Gone to the first delivery and keeps the second: one lane, so the
    first enqueued is the first delivered."""

    name = "test.refused"
    endpoint = "prefect-hooks"

    def lane_key(self, event: dict[str, Any]) -> str:
        return self.name


async def test_a_webhook_the_receiver_refuses_is_one_event_with_its_webhook_id_signed_by_a_prefect_secret(
    prefect_server: PrefectServer, engine: Engine, outbox_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint's secret is neither in the code nor in the environment: the drain reads the Secret block
    outbox-webhook-<name>, and the receiver verifies the signature with it. The refused webhook (410) ends
    FAILED and is one event that names its webhook-id."""
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(event_registry, "_EVENTS", {})
    monkeypatch.delenv("OUTBOX_WEBHOOK_SECRET_PREFECT_HOOKS", raising=False)
    secret = "whsec_" + base64.b64encode(b"p" * 32).decode()
    await Secret(value=secret).asave("outbox-webhook-prefect-hooks", overwrite=True)
    hooks = WebhookReceiver(secret, ["410"]).start()
    try:
        register_endpoint("prefect-hooks", hooks.url)
        definition = register_webhook(RefusedHook())
        with engine.begin() as conn:
            refused, kept = (enqueue_webhook(conn, definition, {"n": n}).id for n in (1, 2))
        state = await drain(
            max_seconds=20, max_actions=2, adapters="outbox.webhook:webhook_adapters", return_state=True
        )
        flow_run_id = state.state_details.flow_run_id
        assert (await state.result())["by_result"] == {"FAILED": 1, "DONE": 1}
    finally:
        hooks.stop()
    assert ended(engine, "FAILED") == [refused] and ended(engine, "DONE") == [kept]
    assert len(hooks.deliveries()) == 1, "the second webhook's signature verified with the Secret block's value"
    with engine.connect() as conn:
        trace = conn.execute(text("SELECT trace FROM agent_action WHERE id = :id"), {"id": refused}).scalar_one()
    (event,) = events_of(prefect_server, flow_run_id, 1)
    assert event["event"] == "outbox.action.failed"
    assert event["resource"] == {
        "prefect.resource.id": f"outbox.action.{refused}",
        "prefect.resource.name": f"WEBHOOK action {refused}",
        "outbox.kind": "WEBHOOK",
        "outbox.state": "FAILED",
        "outbox.reason": "PROVIDER_REFUSED",
        "outbox.trace.event_type": "test.refused",
        "outbox.trace.endpoint": "prefect-hooks",
        "outbox.trace.webhook_id": trace["webhook_id"],
    }
    assert secret not in json.dumps(event)


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
            assert "kind: EMAIL\n" in body and "notice: workspace_alert\n" in body and "message_id: <outbox." in body
            assert f"reason: {expected[action_id][1]}\n" in body
            assert RECIPIENT not in json.dumps(notification) and "http" not in body
    finally:
        async with get_client() as client:
            for automation in await client.read_automations_by_name(AUTOMATION):
                await client.delete_automation(automation.id)


class SlowedHook(NumberedHook):
    """A webhook whose receiver asks twice to slow down (429 with Retry-After: 1), then keeps it."""

    name = "test.slowed"
    endpoint = "prefect-slowed"


async def test_a_destination_its_receiver_slows_down_is_a_paused_then_a_resumed_event(
    prefect_server: PrefectServer, engine: Engine, outbox_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver answers 429 (Retry-After: 1) twice: the run's executor pauses the destination
    `webhook:prefect-slowed` for every executor, and once the pause is over the webhook is delivered. Each
    pause is one `outbox.destination.paused` event and the pause's end one `outbox.destination.resumed`, the
    destination their resource, the receiver's answer their reason."""
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(event_registry, "_EVENTS", {})
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    monkeypatch.setenv("OUTBOX_WEBHOOK_SECRET_PREFECT_SLOWED", secret)
    hooks = WebhookReceiver(secret, ["429 1", "429 1"]).start()
    try:
        register_endpoint("prefect-slowed", hooks.url)
        definition = register_webhook(SlowedHook())
        with engine.begin() as conn:
            kept = enqueue_webhook(conn, definition, {"n": 1}).id
        # a time, not a number of claims: the last pause's end is seen by a sweep after the delivery
        state = await drain(max_seconds=15, adapters="outbox.webhook:webhook_adapters", return_state=True)
        flow_run_id = state.state_details.flow_run_id
        assert (await state.result())["by_result"] == {"DEFER": 2, "DONE": 1}
    finally:
        hooks.stop()
    assert ended(engine, "DONE") == [kept] and len(hooks.deliveries()) == 1

    name = "webhook:prefect-slowed"
    found: list[dict[str, Any]] = []

    def kept_events() -> bool:
        found[:] = prefect_server.events(flow_run_id, prefix="outbox.destination.")
        changes = [e["event"] for e in sorted(found, key=lambda e: str(e["occurred"]))]
        return bool(changes) and changes[-1] == "outbox.destination.resumed"

    until(kept_events, timeout=60, what="the run's destination events, the last a resume")
    changes = [e["event"].rpartition(".")[2] for e in sorted(found, key=lambda e: str(e["occurred"]))]
    assert set(changes) == {"paused", "resumed"} and changes.count("paused") >= changes.count("resumed"), changes
    for event in found:
        resource = event["resource"]
        assert {k: v for k, v in resource.items() if k not in ("outbox.reason", "outbox.seconds")} == {
            "prefect.resource.id": f"outbox.destination.{name}",
            "prefect.resource.name": f"WEBHOOK destination {name}",
            "outbox.kind": "WEBHOOK",
            "outbox.destination": name,
        }
        assert f"prefect.flow-run.{flow_run_id}" in {r["prefect.resource.id"] for r in event["related"]}
        if event["event"] == "outbox.destination.paused":
            assert resource["outbox.reason"].startswith("429"), resource
            assert 0 < float(resource["outbox.seconds"]) <= 1.0
        else:
            assert resource["outbox.reason"] == "its pause ended" and "outbox.seconds" not in resource
        assert secret not in json.dumps(event)


async def test_a_destination_broken_then_mended_is_a_broken_and_a_mended_event(
    prefect_server: PrefectServer, engine: Engine, aengine: AsyncEngine
) -> None:
    """The drain's destination listener on an executor whose attempts to `test_noop` all fail for its breaker's
    window (shortened here): `outbox.destination.broken`, then, once a probe succeeds, `mended`."""
    for n in range(6):
        enqueue(engine, lane=f"broken-{n}")
    calls = 0

    async def failing_then_taken(attempt: ActionAttempt) -> Result:
        nonlocal calls
        calls += 1
        if calls <= 12:  # two rounds of every lane: the breaker's window has passed by the second
            return Retry("503: the receiver did not take it")
        return await fence_and_confirm(attempt)

    config = ExecutorConfig(break_seconds=0.001, probe_seconds=0.001)
    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, failing_then_taken)], config, listen=False)
    executor.outcomes.destination_listeners.append(emit_destination)
    for _ in range(40):
        async with aengine.begin() as conn:
            await conn.execute(store_executor.MAKE_WAITING_DUE)
        await executor.run(until_idle=True)
        if set(states(engine)) == {"DONE"}:
            break
    assert set(states(engine)) == {"DONE"}
    assert [change for (_, change) in executor.outcomes.destinations] == ["broken", "mended"]

    name = "test_noop"
    found: list[dict[str, Any]] = []

    def kept() -> bool:
        body = {
            "filter": {
                "event": {"prefix": ["outbox.destination."]},
                "resource": {"id": [f"outbox.destination.{name}"]},
            },
            "limit": 10,
        }
        found[:] = prefect_server.post("/events/filter", body)["events"]
        return len(found) >= 2

    until(kept, timeout=60, what="the broken and mended events")
    by_event = {e["event"]: e["resource"] for e in found}
    assert set(by_event) == {"outbox.destination.broken", "outbox.destination.mended"}
    for event, resource in by_event.items():
        reason = resource.pop("outbox.reason")
        assert resource == {
            "prefect.resource.id": f"outbox.destination.{name}",
            "prefect.resource.name": f"TEST_NOOP destination {name}",
            "outbox.kind": "TEST_NOOP",
            "outbox.destination": name,
        }
        expected = "attempts in" if event.endswith("broken") else "an attempt succeeded"
        assert expected in reason, reason


def states(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT state FROM agent_action")).scalars())
