"""Every operator command reads indexes, never the whole of agent_action, on a table of a million ended rows.

The test loads 30 days of ended actions (1,000,000) and 10,000 pending ones into its own database, runs each
operator command through the `outbox` entry point while recording the statements it sends, then checks
the plan of each (EXPLAIN with the same parameters), never the wall time: an index scan, no sequential scan,
and no scan of an index over every row without a condition that bounds it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Engine, event, text

from tests.conftest import CliResult
from tests.test_cli_ops import OPERATOR_COMMANDS

ENDED = 1_000_000
# one ended row every 2.6 s: 30.1 days, so a purge with the default 30 days finds about 3,000 rows
SPACING_SECONDS = 2.6
AGENT_ACTION_INDEXES = ("agent_action_pkey", "ix_agent_action_", "ux_agent_action_")
# indexes over every row: a scan of one must be bounded by an index condition, or it reads the whole table
WHOLE_TABLE_INDEXES = {
    "agent_action_pkey",
    "ux_agent_action_idempotency_key",
    "ix_agent_action_state_created",
}
# a statement that reads the table (not one that only names it, as the schema check does: 'agent_action')
READS_AGENT_ACTION = re.compile(r"(?<!')\bagent_action\b(?!')")


def load(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))  # the guard would stamp ended_at
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, subject_account_id, max_attempts,
                                      state, attempt, epoch, stop_reason, write_started_at, created_at, ended_at)
            SELECT 'TEST_NOOP', 1, 'old-' || (g % 5000), 'old-' || g, g % 100000, 5,
                   s.state, 1, 1, s.reason, e.at, e.at - interval '1 minute', e.at
              FROM generate_series(1, :ended) AS g
             CROSS JOIN LATERAL (SELECT now() - (:ended - g) * make_interval(secs => :spacing) AS at) AS e
             CROSS JOIN LATERAL (
                SELECT CASE WHEN g % 1000 = 0 THEN 'UNCERTAIN' WHEN g % 100 = 1 THEN 'FAILED'
                            WHEN g % 100 = 2 THEN 'CANCELLED' ELSE 'DONE' END AS state,
                       CASE WHEN g % 1000 = 0 THEN 'PROVIDER_UNCERTAIN' WHEN g % 100 = 1 THEN 'PROVIDER_REFUSED'
                            WHEN g % 100 = 2 THEN 'EXPIRED' ELSE 'CONFIRMED' END AS reason
             ) AS s
            """),
            {"ended": ENDED, "spacing": SPACING_SECONDS},
        )
    with engine.begin() as conn:  # pending actions the ordinary way: the guard marks each lane's holder
        conn.execute(
            text("""
            INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id,
                                      max_attempts, state)
            SELECT 'TEST_NOOP', 1, 'lane-' || (g % 1000), 'new-' || g, '{}', g % 100000, 5,
                   CASE WHEN g % 50 = 0 THEN 'PROPOSED' ELSE 'ADMITTED' END
              FROM generate_series(1, 10000) AS g
            """)
        )
    with engine.connect() as conn:  # what autovacuum does on a live table
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE agent_action"))


def ids(engine: Engine, where: str) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text(f"SELECT id FROM agent_action WHERE {where} ORDER BY id LIMIT 2")).scalars())


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def test_every_operator_command_reads_indexes_on_a_large_table(engine: Engine, cli: Callable[..., CliResult]) -> None:
    load(engine)
    proposals = ids(engine, "state = 'PROPOSED'")
    [admitted, _] = ids(engine, "state = 'ADMITTED'")
    [uncertain, _] = ids(engine, "state = 'UNCERTAIN'")
    commands = [
        ["status"],
        ["lanes"],
        ["show", str(uncertain)],
        ["list"],
        ["list", "--state", "UNCERTAIN", "--since", "30d"],
        ["list", "--state", "EXECUTING", "--since", "30d"],
        ["list", "--kind", "TEST_NOOP", "--since", "30d", "--before-id", str(uncertain)],
        ["list", "--state", "DONE", "--kind", "TEST_NOOP", "--since", "30d", "--before-id", str(uncertain)],
        ["admit", str(proposals[0])],
        ["refuse", str(proposals[1])],
        ["cancel", str(admitted)],
        ["destinations"],
        ["destinations", "pause", "test_noop", "--for", "1h"],
        ["destinations", "resume", "test_noop"],
        ["erase-account", "77"],
        ["purge", "--dry-run"],
        ["purge"],
    ]
    assert {args[0] for args in commands} == set(OPERATOR_COMMANDS)

    sent: dict[str, tuple[str, Any]] = {}

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if READS_AGENT_ACTION.search(statement):
            sent[statement + repr(parameters)] = (statement, parameters)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        results = [cli(*args, "--json") for args in commands]
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert [(r.code, r.err) for r in results] == [(0, "")] * len(commands), results
    assert json.loads(results[-1].out)["deleted"] > 2_000  # the purge found its 30 days' worth
    assert json.loads(results[-3].out)["erased"] == 10 + 1  # ten ended, one pending

    assert len(sent) >= 15
    with engine.connect() as conn:
        for statement, parameters in sent.values():
            explained = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters).scalar_one()
            plan = list(nodes(explained[0]["Plan"]))
            shown = json.dumps(explained, indent=1)
            assert not [n for n in plan if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "agent_action"], (
                f"{statement}\n{shown}"
            )
            assert any(n.get("Index Name", "").startswith(AGENT_ACTION_INDEXES) for n in plan), f"{statement}\n{shown}"
            unbounded = [n for n in plan if n.get("Index Name") in WHOLE_TABLE_INDEXES and "Index Cond" not in n]
            assert not unbounded, f"{statement}\n{shown}"
