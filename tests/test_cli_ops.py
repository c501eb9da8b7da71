"""The operator commands, run through the `outbox` entry point on a real database: what they show and change,
and the one-line error (exit 2, nothing changed) that bad input gets."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.cli import app
from outbox.store import executor as store_executor
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.conftest import CliResult
from tests.support import insert_ended
from tests.test_executor_results import enqueue, row

Cli = Callable[..., CliResult]
NOOP = kinds.NOOP.name
OPERATOR_COMMANDS = [
    "status",
    "lanes",
    "show",
    "list",
    "admit",
    "refuse",
    "cancel",
    "erase-account",
    "purge",
    "destinations",
]


def ok(result: CliResult) -> CliResult:
    assert (result.code, result.err) == (0, ""), result
    return result


@pytest.mark.parametrize("command", OPERATOR_COMMANDS)
def test_every_operator_command_has_help(cli: Cli, command: str) -> None:
    result = ok(cli(command, "--help"))
    assert "Usage:" in result.out and "--json" in result.out


DATABASE_COMMANDS = [*OPERATOR_COMMANDS, "run", "metrics serve", "db upgrade", "db downgrade", "db current", "db check"]


@pytest.mark.parametrize("command", DATABASE_COMMANDS)
def test_every_database_command_lists_the_database_options_in_its_help(
    cli: Cli, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # one line per option
    shown = ok(cli(*command.split(), "--help")).out
    for option in ("--database-url", "--connect-timeout", "--statement-timeout", "--cell"):
        assert option in shown, (option, shown)
    assert "OUTBOX_DATABASE_URL" in shown and "OUTBOX_CONNECT_TIMEOUT_SECONDS" in shown


def test_status_shows_the_backlog_lanes_leases_and_recent_uncertain_actions(engine: Engine, cli: Cli) -> None:
    lost = enqueue(engine, lane="lane-lost")
    with engine.begin() as conn:  # an executor took it and died: its lease ran out
        params = {"limit": 1, "lease_seconds": 300, "kinds": [NOOP]}
        assert conn.execute(store_executor.CLAIM_READY_HEADS, params).one().id == lost
        conn.execute(text("UPDATE agent_action SET lease_expires_at = now() - interval '1 second'"))
    enqueue(engine, lane="lane-1")
    enqueue(engine, lane="lane-1")
    enqueue(engine, lane="lane-proposed", proposed=True)
    insert_ended(engine, ended_ago=timedelta(hours=1), state="UNCERTAIN", stop_reason="PROVIDER_UNCERTAIN")
    insert_ended(engine, ended_ago=timedelta(hours=25), state="UNCERTAIN", stop_reason="ERROR_AFTER_WRITE")
    insert_ended(engine, ended_ago=timedelta(hours=1), count=3)

    status = ok(cli("status", "--json")).json()
    assert status["unended"] == [
        {"state": "ADMITTED", "kind": NOOP, "actions": 2},
        {"state": "EXECUTING", "kind": NOOP, "actions": 1},
        {"state": "PROPOSED", "kind": NOOP, "actions": 1},
    ]
    # claimable now: the lost lease and lane-1's head; lane-1's second action waits for its head
    assert status["due"] == 2 and status["oldest_due_seconds"] >= 0 and status["waiting_for_lane"] == 1
    assert (status["lanes_with_backlog"], status["lanes_ready"], status["lanes_executing"]) == (2, 1, 1)
    assert (status["executing"], status["expired_leases"]) == (1, 1)
    assert status["uncertain"] == [{"kind": NOOP, "stop_reason": "PROVIDER_UNCERTAIN", "actions": 1}]

    shown = ok(cli("status")).out
    assert "1 executing, 1 expired" in shown and "UNCERTAIN in the last 24 h: 1" in shown
    assert "due: 2 to claim now" in shown and "1 more due, waiting for their lane" in shown


def test_lanes_shows_the_deepest_and_the_oldest(engine: Engine, cli: Cli) -> None:
    oldest = [enqueue(engine, lane="first") for _ in range(2)]
    deepest = [enqueue(engine, lane="deep") for _ in range(3)]
    proposal = enqueue(engine, lane="proposal", proposed=True)

    report = ok(cli("lanes", "--top", "2", "--json")).json()
    assert [(lane["lane_key"], lane["depth"], lane["head_id"]) for lane in report["deepest"]] == [
        ("deep", 3, deepest[0]),
        ("first", 2, oldest[0]),
    ]
    assert [(lane["lane_key"], lane["head_state"]) for lane in report["oldest"]] == [
        ("first", "ADMITTED"),
        ("deep", "ADMITTED"),
    ]
    everything = ok(cli("lanes", "--json")).json()
    assert {"lane_key": "proposal", "head_id": proposal, "head_state": "PROPOSED", "depth": 1} == {
        key: everything["oldest"][2][key] for key in ("lane_key", "head_id", "head_state", "depth")
    }
    assert "deepest lanes" in ok(cli("lanes")).out


async def test_show_has_the_payload_only_while_the_action_has_one(
    engine: Engine, aengine: AsyncEngine, cli: Cli
) -> None:
    action_id = enqueue(engine, payload={"notice": "welcome"})
    shown = ok(cli("show", str(action_id), "--json")).json()
    assert (shown["state"], shown["payload"], shown["lane_key"]) == ("ADMITTED", {"notice": "welcome"}, "lane-1")
    assert "welcome" in ok(cli("show", str(action_id))).out

    await drain(aengine, [ScriptedAdapter(kinds.NOOP)])
    shown = ok(cli("show", str(action_id), "--json")).json()
    assert (shown["state"], shown["stop_reason"], shown["readback_ref"]) == ("DONE", "CONFIRMED", f"ref-{action_id}")
    assert shown["payload"] is None and shown["ended_at"] is not None
    table = ok(cli("show", str(action_id))).out
    assert "payload" not in table and "CONFIRMED" in table


def test_show_names_the_webhook_id_and_the_stream_sequence_of_ended_webhooks_and_events(
    engine: Engine, cli: Cli
) -> None:
    """What finds a webhook or an event at its provider once its payload is gone: the webhook-id and the
    endpoint; the Nats-Msg-Id, the subject and the stream's sequence (the readback reference)."""
    (hook,) = insert_ended(engine, ended_ago=timedelta(minutes=5), state="UNCERTAIN", stop_reason="PROVIDER_UNCERTAIN")
    (event,) = insert_ended(engine, ended_ago=timedelta(minutes=5))
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))  # ended rows are guarded
        conn.execute(
            text(
                'UPDATE agent_action SET kind = \'WEBHOOK\', trace = \'{"event_type": "invoice.paid",'
                ' "endpoint": "billing", "webhook_id": "msg_0f3a"}\' WHERE id = :id'
            ),
            {"id": hook},
        )
        conn.execute(
            text(
                "UPDATE agent_action SET kind = 'NATS_EVENT', readback_ref = 'stream=ORDERS seq=42',"
                ' trace = \'{"subject": "orders.created.ev9", "msg_id": "ev9"}\' WHERE id = :id'
            ),
            {"id": event},
        )
    shown = ok(cli("show", str(hook))).out
    assert "webhook-id" in shown and "msg_0f3a" in shown and "billing" in shown and "invoice.paid" in shown
    shown = ok(cli("show", str(event))).out
    assert "stream=ORDERS seq=42" in shown and "Nats-Msg-Id" in shown and "orders.created.ev9" in shown
    assert ok(cli("show", str(event), "--json")).json()["trace"] == {"subject": "orders.created.ev9", "msg_id": "ev9"}


def test_list_pages_newest_first_and_filters(engine: Engine, cli: Cli) -> None:
    ids = [enqueue(engine, lane=f"lane-{n}") for n in range(5)]
    proposal = enqueue(engine, lane="p", proposed=True)
    [old] = insert_ended(engine, ended_ago=timedelta(days=2))

    def page(*args: str) -> tuple[list[int], int | None]:
        listed = ok(cli("list", "--json", *args)).json()
        return [a["id"] for a in listed["actions"]], listed["next_before_id"]

    assert page("--limit", "4") == ([proposal, ids[4], ids[3], ids[2]], ids[2])
    assert page("--limit", "4", "--before-id", str(ids[2])) == ([ids[1], ids[0]], None)
    assert page("--state", "proposed") == ([proposal], None)
    assert page("--state", "ADMITTED", "--kind", NOOP, "--limit", "5") == (ids[::-1], ids[0])
    assert page("--kind", "email") == ([], None)
    assert page("--since", "3d", "--state", "DONE") == ([old], None)
    assert page("--since", "1h", "--state", "DONE") == ([], None)
    assert f"next page: --before-id {ids[4]}" in ok(cli("list", "--limit", "2")).out


async def test_admit_refuse_and_cancel(engine: Engine, aengine: AsyncEngine, cli: Cli) -> None:
    admitted = enqueue(engine, proposed=True)
    refused = enqueue(engine, lane="refused", proposed=True)
    cancelled = enqueue(engine, lane="cancelled")
    behind = enqueue(engine, lane="cancelled")

    assert ok(cli("admit", str(admitted), "--json")).json()["state"] == "ADMITTED"
    assert ok(cli("refuse", str(refused))).out.strip() == f"action {refused} is CANCELLED (PROPOSAL_REFUSED)"
    decided = ok(cli("cancel", str(cancelled), "--json")).json()
    assert (decided["state"], decided["stop_reason"]) == ("CANCELLED", "OPERATOR_CANCELLED")

    adapter = ScriptedAdapter(kinds.NOOP)
    await drain(aengine, [adapter])
    assert sorted(call.id for call in adapter.calls) == [admitted, behind]  # the cancelled head left its lane

    result = cli("cancel", str(admitted))
    assert (result.code, result.err) == (2, f"error: action {admitted} is DONE; it cannot become CANCELLED\n")
    assert row(engine, admitted)["state"] == "DONE"


def test_erase_account(engine: Engine, cli: Cli) -> None:
    mine = [enqueue(engine, lane=f"l-{n}", subject_account_id=42) for n in range(2)]
    insert_ended(engine, ended_ago=timedelta(days=1), subject_account_id=42)
    theirs = enqueue(engine, subject_account_id=43)
    assert ok(cli("erase-account", "42", "--json")).json() == {"account_id": 42, "erased": 3}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM agent_action")).scalars().all() == [theirs]
    assert ok(cli("erase-account", str(mine[0]))).out.strip() == f"erased 0 actions of account {mine[0]}"


def test_purge_and_its_dry_run(engine: Engine, cli: Cli) -> None:
    insert_ended(engine, ended_ago=timedelta(days=31), count=3)
    insert_ended(engine, ended_ago=timedelta(days=2), count=2, key_prefix="young")

    assert ok(cli("purge", "--dry-run", "--json")).json() == {"older_than_seconds": 2_592_000, "would_delete": 3}
    assert "would delete 3 actions" in ok(cli("purge", "--dry-run")).out
    purged = ok(cli("purge", "--batch-size", "2", "--json")).json()
    assert (purged["deleted"], purged["older_than_seconds"]) == (3, 2_592_000)
    assert "deleted 2 actions that ended more than 1d ago" in ok(cli("purge", "--older-than", "1d")).out
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one() == 0


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["list", "--state", "DONEISH"], "--state: unknown state 'DONEISH' (one of PROPOSED, ADMITTED,"),
        (["list", "--kind", "SMS"], "--kind: unknown action kind 'SMS' (the database declares EMAIL,"),
        (["list", "--since", "3 weeks"], "--since: '3 weeks' is not a duration"),
        (["list", "--limit", "0"], "Invalid value for '--limit': 0 is not in the range 1<=x<=1000"),
        (["list", "--before-id", "999999"], "action 999999 does not exist"),
        (["lanes", "--top", "0"], "Invalid value for '--top': 0 is not in the range 1<=x<=1000"),
        (["show", "999999"], "action 999999 does not exist"),
        (["show", "first"], "Invalid value for 'ID'"),
        (["admit", "999999"], "action 999999 does not exist"),
        (["erase-account"], "Missing argument 'ACCOUNT_ID'"),
        (["erase-account", "0"], "Invalid value for 'ACCOUNT_ID': 0 is not in the range 1<=x<="),
        (["purge", "--older-than", "30"], "--older-than: '30' is not a duration"),
        (["purge", "--batch-size", "0"], "Invalid value for '--batch-size': 0 is not in the range 1<=x<="),
        (["purge", "--dry-run", "--batch-size", "-5"], "Invalid value for '--batch-size': -5 is not in the"),
        (["purge", "--bogus"], "No such option: --bogus"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(engine: Engine, cli: Cli, args: list[str], error: str) -> None:
    kept = insert_ended(engine, ended_ago=timedelta(days=40))
    result = cli(*args)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith(f"error: {error}") and result.err.count("\n") == 1, result.err
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM agent_action")).scalars().all() == kept


def test_the_operator_commands_are_registered() -> None:
    registered = {command.name for command in app.registered_commands} | {g.name for g in app.registered_groups}
    assert set(OPERATOR_COMMANDS) <= registered
