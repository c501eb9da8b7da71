"""A fence is a HOT update (no index entry written), and what read ix_agent_action_lease reads the executing rows
from an index bounded to them instead (ux_agent_action_lane_executing), on a table of many ended rows.

    enqueue ─▶ the executor's store: claim, fence ─▶ pg_stat_user_tables: n_tup_hot_upd against n_tup_upd
    20,000 ended rows, a few executing ─▶ EXPLAIN of the lease sweep, the status count, the metrics
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine, TextClause, text

from outbox._internal.connections.engines import conninfo
from outbox.executor.store import ExecutorStore, Write
from outbox.store import executor, metrics, operator
from tests import kinds
from tests.support import until
from tests.test_ops_plans import AGENT_ACTION_INDEXES, nodes

ACTIONS = 200


def table_updates(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'agent_action'")
        ).one()
    return int(found[0]), int(found[1])


def test_fences_are_hot_updates(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state)"
                " SELECT :kind, 1, 'lane-' || g, 'k' || g, '{\"to\": \"someone@example.com\"}', 5, 'ADMITTED'"
                " FROM generate_series(1, :n) AS g"
            ),
            {"kind": kinds.NOOP.name, "n": ACTIONS},
        )

    async def claim_and_fence() -> None:
        store = ExecutorStore(conninfo(engine))
        try:
            claimed = await store.claim(ACTIONS, 300, [kinds.NOOP.name])
            assert len(claimed) == ACTIONS
            fenced = await store.commit([Write(a) for a in claimed], 60.0)
            assert {o.outcome for o in fenced} == {"written"}
        finally:
            await store.close()

    asyncio.run(claim_and_fence())
    # the store's session flushes its counts when it ends
    until(lambda: table_updates(engine)[0] == 2 * ACTIONS, what="the claims' and fences' counts")
    updates, hot = table_updates(engine)
    # a claim changes the state (indexed): never HOT. Nearly every fence finds room on its row's page (179 of
    # 200 with the lane holder's column, 180 before it: the row is a few bytes wider)
    assert hot >= 0.85 * ACTIONS, (updates, hot)


def load(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("SET LOCAL session_replication_role = replica")
        )  # past the guard, the lane and the destination triggers
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, max_attempts, state, attempt,
                                      epoch, stop_reason, created_at, ended_at)
            SELECT :kind, 1, 'old-' || g, 'old-' || g, 5, 'DONE', 1, 1, 'CONFIRMED', now() - interval '1 day', now()
              FROM generate_series(1, 20000) AS g
            """),
            {"kind": kinds.NOOP.name},
        )
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts, state,
                                      attempt, epoch, lease_expires_at, destination)
            SELECT :kind, 1, 'busy-' || g, 'busy-' || g, '{}', 5, 'EXECUTING', 1, 1,
                   now() + (g - 10) * interval '1 min', lower(:kind)
              FROM generate_series(1, 40) AS g
            """),
            {"kind": kinds.NOOP.name},
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE agent_action"))


def scans_of_agent_action(engine: Engine, statement: TextClause, params: dict[str, Any]) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        plan = conn.execute(text("EXPLAIN (FORMAT JSON) " + statement.text), params).scalar_one()[0]
    return [
        (node["Node Type"], node.get("Index Name", ""), node.get("Index Cond", ""))
        for node in nodes(plan["Plan"])
        # a bitmap index scan names its index only, its heap scan the table
        if node.get("Relation Name") == "agent_action" or node.get("Index Name", "").startswith(AGENT_ACTION_INDEXES)
    ]


STATEMENTS: list[tuple[str, TextClause, dict[str, Any]]] = [
    (
        "the lease sweep",
        executor.TAKE_BACK_EXPIRED_LEASES,
        {"limit": 64, "lease_seconds": 300.0, "at_most_once": [kinds.ONCE.name], "kinds": [kinds.NOOP.name]},
    ),
    ("outbox status's expired leases", operator.COUNT_EXPIRED_LEASES, {}),
    ("the metrics' leases by kind", metrics.LEASES_BY_KIND, {}),
    ("the metrics' claimable actions", metrics.CLAIMABLE_BY_KIND, {}),
]


def test_what_read_the_lease_index_reads_only_the_executing_rows(engine: Engine) -> None:
    load(engine)
    for what, statement, params in STATEMENTS:
        scans = scans_of_agent_action(engine, statement, params)
        assert scans and all("Index" in node or node in ("ModifyTable", "Bitmap Heap Scan") for node, _, _ in scans), (
            what,
            scans,
        )
        # the executing rows come from an index bounded to them, however many rows have ended
        assert any(
            index == "ux_agent_action_lane_executing" or "state = 'EXECUTING'" in condition
            for _, index, condition in scans
        ), (what, scans)
