"""Each result (outbox.executor.results), each exception path, expiry and the fence's refusals, on a real database."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from outbox.executor import (
    Abandoned,
    ActionAttempt,
    Cancelled,
    Defer,
    Done,
    Executor,
    ExecutorConfig,
    Failed,
    FenceRefused,
    Result,
    Retry,
    Uncertain,
)
from outbox.testing import drain
from tests import kinds
from tests.adapters import ScriptedAdapter

_keys = itertools.count()


def enqueue(engine: Engine, lane: str = "lane-1", **changes: Any) -> int:
    values: dict[str, Any] = {
        "kind": kinds.NOOP,
        "workspace_id": 1,
        "lane_key": lane,
        "idempotency_key": f"key-{next(_keys)}",
        "payload": {"n": 1},
    }
    values.update(changes)
    with engine.begin() as conn:
        return outbox.enqueue(conn, outbox.ActionRequest(**values)).id


def row(engine: Engine, action_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT *, extract(epoch FROM due_at - now()) AS due_in FROM agent_action WHERE id = :id"),
            {"id": action_id},
        )
        return dict(found.mappings().one())


async def run_once(aengine: AsyncEngine, adapter: ScriptedAdapter, **config: Any) -> Executor:
    executor = Executor(aengine, [adapter], ExecutorConfig(**config), listen=False)
    await executor.run(until_idle=True)
    return executor


def returning(result: Result, *, fence: bool = True):  # type: ignore[no-untyped-def]
    async def behaviour(attempt: ActionAttempt) -> Result:
        if fence:
            (await attempt.fence().begin_write()).check()
        return result

    return behaviour


async def test_done_records_the_providers_reference(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)
    await run_once(aengine, ScriptedAdapter(kinds.NOOP, returning(Done("msg-1"))))
    done = row(engine, action_id)
    assert (done["state"], done["stop_reason"], done["readback_ref"]) == ("DONE", "CONFIRMED", "msg-1")
    assert (done["attempt"], done["epoch"]) == (1, 1)
    assert done["write_started_at"] is not None and done["payload"] is None


async def test_retry_waits_out_a_backoff_and_clears_the_fence(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)
    await run_once(aengine, ScriptedAdapter(kinds.NOOP, returning(Retry("relay said 451"))))
    retried = row(engine, action_id)
    assert (retried["state"], retried["attempt"], retried["epoch"]) == ("ADMITTED", 1, 1)
    assert retried["write_started_at"] is None and retried["lease_expires_at"] is None
    assert 2.0 <= retried["due_in"] <= 5.0  # first retry: 2.5 to 5 s


async def test_retry_after_a_given_wait(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)
    await run_once(aengine, ScriptedAdapter(kinds.NOOP, returning(Retry("later", after=600))))
    assert 595 <= row(engine, action_id)["due_in"] <= 600


async def test_retry_at_the_last_attempt_ends_failed(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine, max_attempts=3)
    adapter = ScriptedAdapter(kinds.NOOP, returning(Retry("still down")))
    outcomes = await drain(aengine, [adapter])
    failed = row(engine, action_id)
    assert (failed["state"], failed["stop_reason"], failed["attempt"]) == ("FAILED", "ATTEMPTS_EXHAUSTED", 3)
    assert len(adapter.calls) == 3
    assert outcomes.ended[(kinds.NOOP.name, "FAILED", "ATTEMPTS_EXHAUSTED")] == 1


async def test_defer_waits_without_counting_the_attempt(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)
    await run_once(aengine, ScriptedAdapter(kinds.NOOP, returning(Defer(120, "rate limited"), fence=False)))
    deferred = row(engine, action_id)
    assert (deferred["state"], deferred["attempt"], deferred["epoch"]) == ("ADMITTED", 0, 1)
    assert 115 <= deferred["due_in"] <= 120


async def test_defer_keeps_the_mark_of_an_earlier_write(engine: Engine, aengine: AsyncEngine) -> None:
    """A read-back kind whose earlier attempt may have written must still know it after a deferral."""
    action_id = enqueue(engine)
    with engine.begin() as conn:  # an earlier holder fenced and lost its lease
        conn.execute(
            text(
                "UPDATE agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
                " lease_expires_at = now() - interval '1 s', write_started_at = now() - interval '1 min'"
                " WHERE id = :id"
            ),
            {"id": action_id},
        )
    seen: list[bool] = []

    async def defer_after_looking(attempt: ActionAttempt) -> Result:
        seen.append(attempt.write_started())
        (await attempt.fence().begin_write()).check()
        return Defer(60)

    await run_once(aengine, ScriptedAdapter(kinds.NOOP, defer_after_looking))
    deferred = row(engine, action_id)
    assert seen == [True]
    assert deferred["state"] == "ADMITTED" and deferred["attempt"] == 1 and deferred["epoch"] == 2
    assert deferred["write_started_at"] is not None


@pytest.mark.parametrize(
    ("result", "state", "reason"),
    [
        (Uncertain("relay dropped after DATA"), "UNCERTAIN", "PROVIDER_UNCERTAIN"),
        (Failed("550 no such user"), "FAILED", "PROVIDER_REFUSED"),
        (Cancelled("unsubscribed"), "CANCELLED", "NOT_WANTED"),
    ],
)
async def test_ending_results(engine: Engine, aengine: AsyncEngine, result: Result, state: str, reason: str) -> None:
    action_id = enqueue(engine)
    executor = await run_once(aengine, ScriptedAdapter(kinds.NOOP, returning(result)))
    ended = row(engine, action_id)
    assert (ended["state"], ended["stop_reason"], ended["attempt"], ended["epoch"]) == (state, reason, 1, 1)
    assert ended["ended_at"] is not None and ended["payload"] is None
    assert executor.outcomes.ended == {(kinds.NOOP.name, state, reason): 1}


async def test_abandoned_writes_nothing(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)
    executor = await run_once(aengine, ScriptedAdapter(kinds.NOOP, returning(Abandoned("not mine"), fence=False)))
    untouched = row(engine, action_id)
    assert (untouched["state"], untouched["epoch"], untouched["attempt"]) == ("EXECUTING", 1, 1)
    assert executor.outcomes.attempts == {(kinds.NOOP.name, "ABANDONED", False): 1}


async def test_an_exception_before_the_fence_is_a_retry(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)

    async def explode(attempt: ActionAttempt) -> Result:
        raise ConnectionRefusedError("relay unreachable")

    await run_once(aengine, ScriptedAdapter(kinds.NOOP, explode))
    retried = row(engine, action_id)
    assert (retried["state"], retried["attempt"], retried["write_started_at"]) == ("ADMITTED", 1, None)


async def test_an_exception_after_the_fence_is_uncertain(
    engine: Engine, aengine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    action_id = enqueue(engine)

    async def explode_mid_write(attempt: ActionAttempt) -> Result:
        await attempt.fence().begin_write()
        raise TimeoutError("no answer after DATA")

    await run_once(aengine, ScriptedAdapter(kinds.NOOP, explode_mid_write))
    ended = row(engine, action_id)
    assert (ended["state"], ended["stop_reason"]) == ("UNCERTAIN", "ERROR_AFTER_WRITE")
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "UNCERTAIN" in r.getMessage()]
    assert len(warnings) == 1 and str(action_id) in warnings[0].getMessage()
    assert "n" not in warnings[0].getMessage().split(":")[-1]  # the reason, never the payload


async def test_an_action_past_expires_at_is_never_claimed_and_ends_expired(
    engine: Engine, aengine: AsyncEngine
) -> None:
    with engine.connect() as conn:
        soon = conn.execute(text("SELECT now() + interval '1 hour'")).scalar_one()
    action_id = enqueue(engine, expires_at=soon)
    with engine.begin() as conn:  # an hour passes
        conn.execute(
            text("UPDATE agent_action SET expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )
    adapter = ScriptedAdapter(kinds.NOOP)
    executor = await run_once(aengine, adapter)
    expired = row(engine, action_id)
    assert (expired["state"], expired["stop_reason"], expired["attempt"]) == ("CANCELLED", "EXPIRED", 0)
    assert adapter.calls == [] and executor.outcomes.ended == {(kinds.NOOP.name, "CANCELLED", "EXPIRED"): 1}


async def test_a_lane_runs_in_id_order_and_waits_for_a_head_in_backoff(engine: Engine, aengine: AsyncEngine) -> None:
    first, second, third = (enqueue(engine, lane="ordered") for _ in range(3))
    other = enqueue(engine, lane="other")

    async def first_fails_once(attempt: ActionAttempt) -> Result:
        if attempt.action.id == first and attempt.action.attempt == 1:
            return Retry("try later", after=3600)
        return await returning(Done("ok"))(attempt)

    adapter = ScriptedAdapter(kinds.NOOP, first_fails_once)
    await run_once(aengine, adapter)
    # the head waits out its backoff, and the lane waits with it; other lanes go on
    assert [c.id for c in adapter.calls] in ([first, other], [other, first])
    assert row(engine, second)["state"] == "ADMITTED" and row(engine, second)["epoch"] == 0
    await drain(aengine, [adapter])
    assert [c.id for c in adapter.calls if c.lane_key == "ordered"] == [first, first, second, third]


async def test_a_proposed_head_holds_its_lane_until_decided(engine: Engine, aengine: AsyncEngine) -> None:
    proposal = enqueue(engine, lane="proposals", proposed=True)
    behind = enqueue(engine, lane="proposals")
    adapter = ScriptedAdapter(kinds.NOOP)
    await drain(aengine, [adapter])
    assert adapter.calls == []
    with engine.begin() as conn:
        outbox.refuse(conn, proposal)
    await drain(aengine, [adapter])
    assert [c.id for c in adapter.calls] == [behind]


async def test_the_fence_refuses_when_another_claim_took_the_action(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)
    refusals: list[str] = []

    async def lose_the_claim(attempt: ActionAttempt) -> Result:
        with engine.begin() as conn:  # the lease ran out and another replica claimed it again
            conn.execute(
                text("UPDATE agent_action SET epoch = epoch + 1, attempt = attempt + 1 WHERE id = :id"),
                {"id": action_id},
            )
        try:
            await attempt.fence().begin_write()
        except FenceRefused as refused:
            refusals.append(refused.reason)
            return Abandoned(refused.reason)
        return Done("must not happen")

    await run_once(aengine, ScriptedAdapter(kinds.NOOP, lose_the_claim))
    assert refusals == ["another claim took the action (epoch 2, EXECUTING)"]
    assert row(engine, action_id)["write_started_at"] is None


async def test_the_fence_refuses_an_erased_action(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)

    async def erased_meanwhile(attempt: ActionAttempt) -> Result:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM agent_action WHERE id = :id"), {"id": action_id})
        await attempt.fence().begin_write()  # raises: the executor counts it Abandoned
        return Done("must not happen")

    executor = await run_once(aengine, ScriptedAdapter(kinds.NOOP, erased_meanwhile))
    assert executor.outcomes.attempts == {(kinds.NOOP.name, "ABANDONED", False): 1}


@pytest.mark.parametrize(("lease_left", "fenced"), [(59, False), (61, True)])
async def test_the_fence_needs_sixty_seconds_of_lease(
    engine: Engine, aengine: AsyncEngine, lease_left: int, fenced: bool
) -> None:
    action_id = enqueue(engine)
    outcome: list[str] = []

    async def short_lease(attempt: ActionAttempt) -> Result:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE agent_action SET lease_expires_at = now() + make_interval(secs => :s) WHERE id = :id"),
                {"s": lease_left, "id": action_id},
            )
        try:
            window = await attempt.fence().begin_write()
        except FenceRefused as refused:
            outcome.append(refused.reason)
            return Abandoned(refused.reason)
        outcome.append(f"window {window.remaining():.0f}")
        return Done("sent")

    await run_once(aengine, ScriptedAdapter(kinds.NOOP, short_lease))
    assert outcome == (["window 60"] if fenced else ["less than 60 s of the lease are left"])
    assert (row(engine, action_id)["write_started_at"] is not None) is fenced


async def test_a_window_that_closed_before_the_provider_call_is_a_retry(engine: Engine, aengine: AsyncEngine) -> None:
    action_id = enqueue(engine)

    async def too_late(attempt: ActionAttempt) -> Result:
        window = await attempt.fence().begin_write()
        window.deadline = 0.0  # the adapter was held up past its deadline
        window.check()
        return Done("must not happen")

    await run_once(aengine, ScriptedAdapter(kinds.NOOP, too_late))
    retried = row(engine, action_id)
    assert (retried["state"], retried["write_started_at"]) == ("ADMITTED", None)


def test_a_lease_must_hold_the_write_window() -> None:
    with pytest.raises(ValueError, match="must exceed the 60 s write window"):
        ExecutorConfig(lease_seconds=30)


async def test_an_executor_needs_one_adapter_per_kind(aengine: AsyncEngine) -> None:
    with pytest.raises(ValueError, match="has two adapters"):
        Executor(aengine, [ScriptedAdapter(kinds.NOOP), ScriptedAdapter(kinds.NOOP)])


def test_a_result_names_a_stop_reason_of_its_own_state() -> None:
    with pytest.raises(ValueError, match="CANCELLED result needs a CANCELLED stop reason"):
        Cancelled("x", outbox.StopReason.CONFIRMED)
    with pytest.raises(ValueError, match="UNCERTAIN result needs"):
        Uncertain("x", outbox.StopReason.EXPIRED)
