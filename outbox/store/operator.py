"""The operators' read-only views of `agent_action`, named for what they show.

`outbox.ops` runs them for the CLI. Each reads an index made for it (migration 0003, or the lane and
pending indexes of 0001), never the whole table: ended rows are most of it and only grow until purged.
"""

from __future__ import annotations

import functools

from sqlalchemy import TextClause, text

from outbox.states import ActionState
from outbox.store.application import ACTION_COLUMNS

# whether outbox's schema is there at all (a statement that names a missing table fails when planned)
STORE_EXISTS = text("SELECT to_regclass('agent_action') IS NOT NULL")

# ---- outbox status ---------------------------------------------------------------------------------

# PROPOSED and ADMITTED from ix_agent_action_state_created alone (state leads, kind is included); EXECUTING
# from ux_agent_action_lane_executing (one row per executing lane), which the first index does not hold.
COUNT_UNENDED_BY_STATE_AND_KIND = text("""
SELECT state, kind, count(*) AS actions FROM agent_action
 WHERE state IN ('PROPOSED', 'ADMITTED')
 GROUP BY state, kind
UNION ALL
SELECT state, kind, count(*) FROM agent_action WHERE state = 'EXECUTING' GROUP BY state, kind
 ORDER BY state, kind
""")

# Whether the lane of holder `h` has a backlog: an action not started, the holder itself or one behind it
# while it executes (one probe of ix_agent_action_lane_pending, for executing holders only).
_HOLDER_HAS_BACKLOG = """(h.state <> 'EXECUTING' OR EXISTS (
           SELECT 1 FROM agent_action AS p WHERE p.lane_key = h.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
       ))"""

# Every lane's holder, one row per lane with an unended action (so few): the waiting holders from
# ux_agent_action_lane_head, the executing ones from ux_agent_action_lane_executing (both are in the first
# since revision 0027; a database at 0026, one revision behind, holds the waiting ones only there).
_HOLDERS = """(
    SELECT id, lane_key, state, due_at FROM agent_action WHERE lane_head AND state IN ('PROPOSED', 'ADMITTED')
    UNION ALL
    SELECT id, lane_key, state, due_at FROM agent_action WHERE state = 'EXECUTING' AND lane_head
)"""

# The lanes from their holders.
COUNT_LANES = text(f"""
SELECT count(*) FILTER (WHERE {_HOLDER_HAS_BACKLOG}) AS with_backlog,
       count(*) FILTER (WHERE h.state = 'ADMITTED' AND h.due_at <= now()) AS ready,
       count(*) FILTER (WHERE h.state = 'EXECUTING') AS executing
  FROM {_HOLDERS} AS h
""")

COUNT_UNCERTAIN_SINCE = text("""
SELECT kind, stop_reason, count(*) AS actions FROM agent_action
 WHERE state = 'UNCERTAIN' AND ended_at > now() - make_interval(secs => :seconds)
 GROUP BY kind, stop_reason ORDER BY kind, stop_reason
""")

# ---- outbox lanes ----------------------------------------------------------------------------------

# A lane's head (its oldest action not started, on ix_agent_action_lane_pending) and whether an action of it
# executes (ux_agent_action_lane_executing), for the lanes of `{lanes}` (a CTE with lane_key and depth).
_LANE_ROWS = """
SELECT l.lane_key, h.id AS head_id, h.state AS head_state,
       extract(epoch FROM now() - h.created_at)::float8 AS head_age_seconds,
       EXISTS (SELECT 1 FROM agent_action AS x WHERE x.lane_key = l.lane_key AND x.state = 'EXECUTING') AS executing,
       l.depth
  FROM {lanes} AS l
  LEFT JOIN LATERAL (
    SELECT p.id, p.state, p.created_at FROM agent_action AS p
     WHERE p.lane_key = l.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
     ORDER BY p.id LIMIT 1
  ) AS h ON true"""

# Depth of every lane with a backlog, counted on ix_agent_action_lane_pending.
DEEPEST_LANES = text(f"""
WITH deepest AS MATERIALIZED (
    SELECT lane_key, count(*) AS depth FROM agent_action
     WHERE state IN ('PROPOSED', 'ADMITTED')
     GROUP BY lane_key ORDER BY depth DESC, lane_key LIMIT :top
)
{_LANE_ROWS.format(lanes="deepest")}
 ORDER BY l.depth DESC, l.lane_key
""")

# The lanes whose holder came first (lane order is id order), among those with a backlog. The holders are
# read first (their two indexes), so the planner never walks the primary key through the ended rows looking
# for them; the depth is counted for those shown only.
OLDEST_LANES = text(f"""
WITH holders AS MATERIALIZED (
    SELECT h.lane_key, h.id FROM {_HOLDERS} AS h
     WHERE {_HOLDER_HAS_BACKLOG}
), oldest AS MATERIALIZED (
    SELECT o.lane_key, o.id AS holder_id, d.depth
      FROM (SELECT lane_key, id FROM holders ORDER BY id LIMIT :top) AS o
     CROSS JOIN LATERAL (
        SELECT count(*) AS depth FROM agent_action AS p
         WHERE p.lane_key = o.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
     ) AS d
)
{_LANE_ROWS.format(lanes="oldest")}
 ORDER BY l.holder_id
""")

# ---- outbox list -----------------------------------------------------------------------------------

SELECT_ACTION_POSITION = text("SELECT created_at, id FROM agent_action WHERE id = :id")


@functools.cache
def list_actions(*, state: bool, kind: bool, before: bool) -> TextClause:
    """Newest first (created_at, then id) since a time, with only the filters given, so each one is an index
    condition. With a state: ix_agent_action_state_created (ux_agent_action_lane_executing for EXECUTING,
    whose few rows are sorted). Without: the same per state, each state's newest `limit` merged."""
    conditions = ["created_at >= now() - make_interval(secs => :since_seconds)"]
    if kind:
        conditions.append("kind = :kind")
    if before:
        conditions.append("(created_at, id) < (:before_created_at, :before_id)")
    if state:
        return text(_newest(["state = :state", *conditions]))
    per_state = "\nUNION ALL\n".join("(" + _newest([f"state = '{s}'", *conditions]) + ")" for s in ActionState)
    return text(f"""
SELECT {ACTION_COLUMNS} FROM (
{per_state}
) AS a
 ORDER BY created_at DESC, id DESC
 LIMIT :limit
""")


def _newest(conditions: list[str]) -> str:
    return (
        f"SELECT {ACTION_COLUMNS} FROM agent_action\n WHERE {' AND '.join(conditions)}\n"
        " ORDER BY created_at DESC, id DESC\n LIMIT :limit"
    )


# leases that ran out and that no executor has taken back yet
COUNT_EXPIRED_LEASES = text("SELECT count(*) FROM agent_action WHERE state = 'EXECUTING' AND lease_expires_at <= now()")
