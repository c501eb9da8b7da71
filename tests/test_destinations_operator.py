"""Destinations as an operator sees and steers them, on a real database: `outbox destinations` and its pause
and resume through the `outbox` entry point, what an executor then claims, the lines of `outbox status`, and
the gauges the exporter reads (scraped, and checked by promtool).

The states a provider and the breaker give a destination are made with the statements the executors run
(outbox.store.destinations: SET_RATES, SLOW_DOWN, NOTE_FAILURE), with the executors' own parameters.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor import Executor
from outbox.executor.pacing import SLOW_DOWN
from outbox.store import destinations as store
from tests import kinds
from tests.adapters import ScriptedAdapter
from tests.conftest import CliResult
from tests.test_executor_results import enqueue, row
from tests.test_metrics import samples, scrape, value

Cli = Callable[..., CliResult]
NOOP, READBACK = kinds.NOOP.name, kinds.READBACK.name
# the destinations of the test kinds: their names in lower case
NOOP_TO, READBACK_TO = NOOP.lower(), READBACK.lower()
# the breaker's statement, judging a single failure at once: broken now, its first probe 15 s away
BROKEN_AT_ONCE = {"window": 0.0, "min_failures": 1, "probe_seconds": 15.0}


def ok(result: CliResult) -> CliResult:
    assert (result.code, result.err) == (0, ""), result
    return result


def rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT * FROM agent_destination ORDER BY name"))
        return [dict(r) for r in found.mappings()]


def listed(cli: Cli) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in ok(cli("destinations", "--json")).json()}


async def run_executor(aengine: AsyncEngine) -> None:
    await Executor(aengine, [ScriptedAdapter(kinds.NOOP)], listen=False).run(until_idle=True)


async def test_an_operators_pause_holds_every_claim_until_resumed(
    engine: Engine, aengine: AsyncEngine, cli: Cli
) -> None:
    first = enqueue(engine, lane="a")
    enqueue(engine, lane="a")
    enqueue(engine, lane="b", proposed=True)
    assert rows(engine) == [], "a destination nothing held back has no row"
    shown = listed(cli)[NOOP_TO]
    assert (shown["kind"], shown["state"], shown["waiting"], shown["due"], shown["executing"]) == (
        NOOP,
        "open",
        3,
        1,
        0,
    )
    assert (shown["rate"], shown["pace"], shown["paused_by"]) == (None, None, None)

    paused = ok(cli("destinations", "pause", NOOP_TO, "--for", "10m", "--reason", "relay maintenance")).out
    assert paused.startswith(f"destination {NOOP_TO} is paused until ") and paused.endswith(
        " UTC by operator: relay maintenance\n"
    ), paused
    [made] = rows(engine)
    assert (made["name"], made["kind"], made["paused_by"], made["pause_reason"]) == (
        NOOP_TO,
        NOOP,
        "operator",
        "relay maintenance",
    )
    with engine.connect() as conn:
        left = conn.execute(text("SELECT extract(epoch FROM paused_until - now()) FROM agent_destination")).scalar_one()
    assert 590 < left <= 600
    await run_executor(aengine)
    assert row(engine, first)["state"] == "ADMITTED", "no executor claims for a paused destination"

    # without --for: until resumed, whatever it was before
    ok(cli("destinations", "pause", NOOP_TO))
    shown = listed(cli)[NOOP_TO]
    assert (shown["state"], shown["until_resumed"], shown["paused_until"], shown["pause_reason"]) == (
        "paused",
        True,
        None,
        None,
    )
    table = ok(cli("destinations")).out
    assert "paused until resumed by operator" in table and NOOP in table
    status = ok(cli("status")).out
    assert f"destination {NOOP_TO} ({NOOP}): paused until resumed by operator; 3 waiting" in status
    assert [d["name"] for d in ok(cli("status", "--json")).json()["held_destinations"]] == [NOOP_TO]
    await run_executor(aengine)
    assert row(engine, first)["state"] == "ADMITTED"

    assert ok(cli("destinations", "resume", NOOP_TO)).out == f"destination {NOOP_TO} is open\n"
    assert listed(cli)[NOOP_TO]["state"] == "open"
    assert "destination " not in ok(cli("status")).out
    await run_executor(aengine)
    assert row(engine, first)["state"] == "DONE"


def test_a_provider_pause_a_breaker_and_a_pace_as_the_list_and_status_show_them(engine: Engine, cli: Cli) -> None:
    enqueue(engine, lane="a")
    enqueue(engine, lane="b", kind=kinds.READBACK, workspace_id=None)
    with engine.begin() as conn:
        conn.execute(store.SET_RATES, {"names": ["paced"], "kinds": [NOOP], "rates": [10.0], "bursts": [1.0]})
        pace_lowered(conn, "paced")
        slow_down(conn, NOOP_TO, NOOP, after=120.0)
        conn.execute(store.ADD_DESTINATION, {"name": READBACK_TO, "kind": READBACK})
        conn.execute(store.NOTE_FAILURE, BROKEN_AT_ONCE | {"name": READBACK_TO})
    found = listed(cli)
    assert {name: d["state"] for name, d in found.items()} == {
        "paced": "paced",
        NOOP_TO: "paused",
        READBACK_TO: "broken",
    }
    assert found["paced"]["rate"] == 10.0 and 8.9 < found["paced"]["pace"] < 9.5
    assert (found[NOOP_TO]["paused_by"], found[NOOP_TO]["pause_reason"]) == ("provider", "421 slow down")
    assert found[READBACK_TO]["broken_seconds"] >= 0 and found[READBACK_TO]["waiting"] == 1

    [line] = [line for line in ok(cli("destinations")).out.splitlines() if "paced" in line.split()]
    assert re.search(r"│ 10/s │ 9(\.\d+)?/s │", line), line  # the pace rises a little as time passes
    status = ok(cli("status")).out
    assert (
        f"destination {NOOP_TO} ({NOOP}): paused until " in status
        and " by provider: 421 slow down; 1 waiting" in status
    )
    assert f"destination {READBACK_TO} ({READBACK}): broken since " in status
    assert f"destination paced ({NOOP}): paced; 0 waiting" in status

    # an operator's resume ends the provider's pause, the breaker and the learned pace; the rate stays
    for name in ("paced", NOOP_TO, READBACK_TO):
        ok(cli("destinations", "resume", name))
    found = listed(cli)
    assert {name: d["state"] for name, d in found.items()} == {"paced": "open", NOOP_TO: "open", READBACK_TO: "open"}
    assert (found["paced"]["rate"], found["paced"]["pace"]) == (10.0, None)


def slow_down(conn: Any, name: str, kind: str, *, after: float | None) -> None:
    """A provider's slow-down of `name`, as an executor records it."""
    conn.execute(store.ADD_DESTINATION, {"name": name, "kind": kind})
    conn.execute(store.SLOW_DOWN, {"name": name, "after": after, "reason": "421 slow down", **SLOW_DOWN})


def pace_lowered(conn: Any, name: str, kind: str = NOOP) -> None:
    """A slow-down of the rated destination `name`: its pace lowered to 0.9 of its rate, its pause then over."""
    end_pause = text("UPDATE agent_destination SET paused_until = now() - interval '1 second' WHERE name = :name")
    slow_down(conn, name, kind, after=None)
    conn.execute(end_pause, {"name": name})


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["destinations", "pause", "nowhere"], "destination 'nowhere' is unknown: it has no row"),
        (["destinations", "resume", "nowhere"], "destination 'nowhere' is unknown: it has no row"),
        (["destinations", "pause", "SMTP!"], "NAME: 'SMTP!' is not a destination name"),
        (["destinations", "resume", "a b"], "NAME: 'a b' is not a destination name"),
        (["destinations", "pause", NOOP_TO, "--for", "10 minutes"], "--for: '10 minutes' is not a duration"),
        (["destinations", "pause", NOOP_TO, "--for", "0s"], "--for: a pause lasts at least 1s"),
        (["destinations", "pause", NOOP_TO, "--for", "36501d"], "--for: '36501d' is more than 100 years"),
        (["destinations", "pause", NOOP_TO, "--reason", "x" * 501], "--reason: at most 500 characters, not 501"),
        (["destinations", "pause"], "Missing argument 'NAME'"),
        (["destinations", "stop", NOOP_TO], "No such command 'stop'"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(engine: Engine, cli: Cli, args: list[str], error: str) -> None:
    enqueue(engine)  # NOOP_TO is a destination an action names
    result = cli(*args)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith(f"error: {error}") and result.err.count("\n") == 1, result.err
    assert rows(engine) == []


def test_the_gauges_are_each_destinations_state(engine: Engine) -> None:
    enqueue(engine, lane="a")
    enqueue(engine, lane="a")
    with engine.begin() as conn:
        conn.execute(text("UPDATE agent_action SET due_at = now() - interval '90 seconds'"))
        conn.execute(store.SET_RATES, {"names": ["paced"], "kinds": [NOOP], "rates": [10.0], "bursts": [1.0]})
        pace_lowered(conn, "paced")
        slow_down(conn, NOOP_TO, NOOP, after=120.0)
        conn.execute(store.ADD_DESTINATION, {"name": READBACK_TO, "kind": READBACK})
        conn.execute(store.NOTE_FAILURE, BROKEN_AT_ONCE | {"name": READBACK_TO})
        conn.execute(
            text("UPDATE agent_destination SET broken_since = now() - interval '11 minutes' WHERE kind = :k"),
            {"k": READBACK},
        )
    found = samples(scrape(engine))

    def gauge(name: str, destination: str, kind: str = NOOP) -> float:
        return value(found, f"outbox_destination_{name}", kind=kind, destination=destination)

    assert (gauge("paused", NOOP_TO), gauge("paused", "paced"), gauge("paused", READBACK_TO, READBACK)) == (1, 0, 0)
    assert (gauge("broken", NOOP_TO), gauge("broken", READBACK_TO, READBACK)) == (0, 1)
    assert 660 <= gauge("broken_seconds", READBACK_TO, READBACK) < 720 and gauge("broken_seconds", NOOP_TO) == 0
    assert gauge("rate", "paced") == 10 and 8.9 < gauge("pace", "paced") < 9.5
    assert not [
        k for k in found if k[0] in ("outbox_destination_rate", "outbox_destination_pace") and NOOP_TO in str(k)
    ]
    assert (gauge("waiting_actions", NOOP_TO), gauge("waiting_actions", "paced")) == (2, 0)
    assert 90 <= gauge("oldest_due_age_seconds", NOOP_TO) < 150 and gauge("oldest_due_age_seconds", "paced") == 0

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs Debian's prometheus"
    checked = subprocess.run([promtool, "check", "metrics"], input=scrape(engine).encode(), capture_output=True)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout.decode() + checked.stderr.decode()
