"""What waits for a held destination, as the operator and the gauges see it, on a real database.

a head due 10 minutes ago ──claim──▶ its destination paused: SlowDown, the head deferred (due_at moved
    to the pause's end) ──▶ agent_action.due_since keeps its first due time
──▶ `outbox destinations`: due 1, oldest due 10 minutes; outbox_destination_oldest_due_age_seconds alike
──▶ the head accepted later ──▶ due_since cleared
`outbox destinations pause smtp` on a database where no email was ever enqueued ──▶ paused by operator
`outbox status`: the actions behind a held destination's heads wait for it, not "for their lane"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import ActionAttempt, Defer, Done, Executor, Result, SlowDown
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.conftest import CliResult
from tests.test_destinations import insert_due
from tests.test_destinations_operator import listed, ok
from tests.test_executor_results import enqueue
from tests.test_metrics import samples, scrape, value

Cli = Callable[..., CliResult]
NOOP_TO = kinds.NOOP.name.lower()
TEN_MINUTES = 600.0


def due_since(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return [row.due_since for row in conn.execute(text("SELECT due_since FROM agent_action ORDER BY id")).all()]


async def test_a_head_a_pause_deferred_keeps_its_age_until_it_is_accepted(
    engine: Engine, aengine: AsyncEngine, cli: Cli
) -> None:
    insert_due(engine, 1, due_hours_ago=TEN_MINUTES / 3600)
    answers: list[Result] = [SlowDown(60.0, "429; Retry-After 60", named=True), Done("ok")]

    async def behaviour(attempt: ActionAttempt) -> Result:
        return answers.pop(0)

    executor = Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], listen=False)
    await executor.run(until_idle=True)
    with engine.connect() as conn:
        ahead = conn.execute(text("SELECT extract(epoch FROM due_at - now()) FROM agent_action")).scalar_one()
    assert 50 < ahead <= 60  # the head's due time is the pause's end
    found = listed(cli)[NOOP_TO]
    assert found["state"] == "paused" and found["due"] == 1
    assert TEN_MINUTES <= found["oldest_due_seconds"] < TEN_MINUTES + 60, found
    gauge = value(samples(scrape(engine)), "outbox_destination_oldest_due_age_seconds", kind="TEST_NOOP",
                  destination=NOOP_TO)  # fmt: skip
    assert TEN_MINUTES <= gauge < TEN_MINUTES + 60, gauge

    # the pause is over: the head is accepted, and its first due time forgotten
    with engine.begin() as conn:
        conn.execute(text("UPDATE agent_destination SET paused_until = now(), pace = NULL"))
        conn.execute(text("UPDATE agent_action SET due_at = now()"))
    await Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], listen=False).run(until_idle=True)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state, due_since FROM agent_action")).one() == ("DONE", None)


async def test_an_adapter_s_own_deferral_is_the_action_s_own_wait_not_an_age(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """A greylisting relay's "try later" (a Defer, the destination not held): no first due time is kept."""
    insert_due(engine, 1, due_hours_ago=TEN_MINUTES / 3600)

    async def behaviour(attempt: ActionAttempt) -> Result:
        return Defer(300.0, "450 greylisted")

    await Executor(aengine, [ScriptedAdapter(kinds.NOOP, behaviour)], listen=False).run(until_idle=True)
    assert due_since(engine) == [None]
    assert value(samples(scrape(engine)), "outbox_oldest_due_age_seconds", kind="TEST_NOOP") == 0


def test_the_relay_can_be_paused_before_any_email_names_it(engine: Engine, cli: Cli) -> None:
    ok(cli("destinations", "pause", "smtp", "--for", "2h", "--reason", "relay maintenance"))
    found = listed(cli)["smtp"]
    assert (found["kind"], found["state"], found["paused_by"]) == ("EMAIL", "paused", "operator")
    assert found["pause_reason"] == "relay maintenance"


def test_a_kind_s_own_destination_by_its_name_can_be_paused_before_any_action(engine: Engine, cli: Cli) -> None:
    ok(cli("destinations", "pause", NOOP_TO))
    assert listed(cli)[NOOP_TO]["kind"] == kinds.NOOP.name
    # a name no kind goes to stays unknown, and EMAIL's name in lower case is not its destination
    for name in ("nowhere", "email"):
        refused = cli("destinations", "pause", name)
        assert refused.code == 2 and "is unknown" in refused.err, refused


def test_status_says_a_held_destination_s_actions_wait_for_it_not_for_their_lane(engine: Engine, cli: Cli) -> None:
    for _ in range(3):
        enqueue(engine, lane="a")  # a head and two behind it, all due
    enqueue(engine, lane="b")
    ok(cli("destinations", "pause", NOOP_TO))
    shown = ok(cli("status")).out
    assert "0 more due, waiting for their lane" in shown, shown
    assert f"destination {NOOP_TO} (TEST_NOOP): paused" in shown and "4 waiting" in shown, shown
