"""A destination whose provider refused its credentials: its actions wait uncounted, every executor holds it,
one probe every CREDENTIALS_PROBE_SECONDS, a gauge and an alert name it, an accepted attempt clears it.

    adapter ──CredentialsRefused──▶ Destinations.saw ──▶ REFUSE_CREDENTIALS (broken, reason kept, long probe)
    probe time ──▶ one head claimed ──Done──▶ MEND (credentials cleared) ──▶ the backlog drains

Real executors on the suite's PostgreSQL; the probe time is brought forward by moving `probe_at`, as the
minutes passing would.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import Metric
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.destinations import REFUSED, destinations, resume
from outbox.executor import ActionAttempt, CredentialsRefused, Executor, ExecutorConfig, Result
from outbox.executor.pacing import CREDENTIALS_PROBE_SECONDS
from outbox.metrics.collector import destination_families
from tests import kinds
from tests.adapters import ScriptedAdapter, fence_and_confirm
from tests.test_breaker import Replica, closed
from tests.test_destinations import gated_action, insert_due

REASON = "invalid_auth: the token is not valid"


class Provider:
    """Refuses every attempt's credentials (after its fence, as a request a provider answered would be) while
    `refusing`; then accepts."""

    def __init__(self) -> None:
        self.refusing = True
        self.calls = 0

    async def __call__(self, attempt: ActionAttempt) -> Result:
        self.calls += 1
        if not self.refusing:
            return await fence_and_confirm(attempt)
        window = await attempt.fence().begin_write()
        window.check()
        return CredentialsRefused(reason=REASON)


def executor(aengine: AsyncEngine, provider: Provider, concurrency: int = 1) -> Executor:
    adapter = ScriptedAdapter(kinds.NOOP, provider)
    return Executor(aengine, [adapter], ExecutorConfig(concurrency=concurrency), listen=False)


def actions(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT state, attempt, last_error, extract(epoch FROM due_at - now())::float8 AS due_in"
                    " FROM agent_action ORDER BY id"
                )
            )
        )


def destination_row(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT credentials_refused_at IS NOT NULL AS refused, credentials_reason, broken_since IS NOT NULL"
                " AS broken, extract(epoch FROM probe_at - now())::float8 AS probe_in"
                " FROM agent_destination WHERE name = 'a'"
            )
        ).one()


def gauges(engine: Engine) -> dict[str, float]:
    """The exporter's destination gauges for `a`, as it reads them from the database."""
    with engine.connect() as conn:
        families: list[Metric] = list(destination_families(destinations(conn)))
    return {
        family.name: sample.value
        for family in families
        for sample in family.samples
        if sample.labels.get("destination") == "a"
    }


async def test_refused_credentials_hold_the_destination_for_every_executor_until_a_probe_is_accepted(
    engine: Engine, aengine: AsyncEngine
) -> None:
    insert_due(engine, 10, destination="a")
    provider = Provider()

    # one attempt refused: the destination is held at once; the other nine wait, not one attempt spent
    await executor(aengine, provider).run(until_idle=True)
    assert provider.calls == 1
    found = actions(engine)
    assert [a.state for a in found] == ["ADMITTED"] * 10
    assert [a.attempt for a in found] == [0] * 10  # refused credentials never count
    refused = found[0]
    assert REASON in refused.last_error and refused.due_in > CREDENTIALS_PROBE_SECONDS - 30
    row = destination_row(engine)
    assert row.refused and row.broken and row.credentials_reason == REASON
    assert CREDENTIALS_PROBE_SECONDS - 30 < row.probe_in <= CREDENTIALS_PROBE_SECONDS
    with engine.connect() as conn:
        (shown,) = [d for d in destinations(conn) if d.name == "a"]
    assert shown.state == REFUSED and shown.credentials_reason == REASON
    metrics = gauges(engine)
    assert metrics["outbox_destination_credentials_refused"] == 1
    # the cause is known: the breaker's gauges (and its alert) stay quiet
    assert metrics["outbox_destination_broken"] == 0 and metrics["outbox_destination_broken_seconds"] == 0

    # another executor, started meanwhile with every slot free, claims nothing for it
    await executor(aengine, provider, concurrency=8).run(until_idle=True)
    assert provider.calls == 1

    # the probe's time comes and the provider refuses again: one attempt, the next probe as far off again
    with engine.begin() as conn:
        conn.execute(text("UPDATE agent_destination SET probe_at = now() WHERE name = 'a'"))
    await executor(aengine, provider, concurrency=8).run(until_idle=True)
    assert provider.calls == 2
    assert destination_row(engine).probe_in > CREDENTIALS_PROBE_SECONDS - 30
    assert [a.attempt for a in actions(engine)] == [0] * 10

    # the secret mended: the next probe is accepted, the destination mended, its due backlog drains
    provider.refusing = False
    with engine.begin() as conn:
        conn.execute(text("UPDATE agent_destination SET probe_at = now() WHERE name = 'a'"))
    drained = executor(aengine, provider, concurrency=8)
    await drained.run(until_idle=True)
    assert drained.outcomes.destinations[("a", "mended")] == 1
    row = destination_row(engine)
    assert not row.refused and not row.broken and row.credentials_reason is None
    assert gauges(engine)["outbox_destination_credentials_refused"] == 0
    states = [a.state for a in actions(engine)]
    assert states.count("DONE") == 8  # the two refused attempts' actions wait their own 5 minutes
    assert states.count("ADMITTED") == 2


async def test_refusals_of_attempts_in_flight_at_other_executors_make_one_change(engine: Engine) -> None:
    """Two executors' attempts that were in flight when the first refusal came are refused too: each keeps the
    destination refused and pushes its probe back, and only the first is a change (one WARNING line, one
    Prefect event), whichever executor saw it."""
    replicas = [Replica(engine) for _ in range(2)]
    try:
        for i in range(3):
            for replica in replicas:
                result = await replica.destinations.saw(gated_action(i), CredentialsRefused(reason=REASON))
                assert isinstance(result, CredentialsRefused) and result.after == CREDENTIALS_PROBE_SECONDS
    finally:
        await closed(replicas)
    changes = [replica.outcomes.destinations[("test_noop", "refused")] for replica in replicas]
    assert changes == [1, 0]


async def test_an_operators_resume_clears_refused_credentials(engine: Engine, aengine: AsyncEngine) -> None:
    """After the secret was mended, `outbox destinations resume` tries it at once instead of at the probe."""
    insert_due(engine, 1, destination="a")
    await executor(aengine, Provider()).run(until_idle=True)
    assert destination_row(engine).refused
    with engine.begin() as conn:
        shown = resume(conn, "a")
    assert shown.state == "open" and shown.credentials_refused_at is None
    assert not destination_row(engine).refused
