"""Destinations, the store's layer: the statements `outbox destinations`, `outbox status` and the metrics read
them with (outbox.destinations runs them), beside the executors' and the operator's own in outbox.store.destinations.

    DESTINATION_ROWS       every destination with a row or an action not ended, as they read it
    LIVE_DESTINATION_KIND  the kind a pause of a destination without a row gives it
    DECLARED_DESTINATION_KIND  else, the declared kind whose own destination it is (nothing named it yet)

Destinations are one concept in three layers: the operator's (outbox.destinations), the executor's
(outbox.executor.destinations, pacing and turns) and the store's (outbox.store.destinations and destination_rows).
"""

from __future__ import annotations

from sqlalchemy import text

from outbox.store.destinations import _PACE_NOW

# Every destination that has a row or an action not ended: its row; its actions waiting (PROPOSED or ADMITTED,
# on ix_agent_action_state_created), due (ready lane heads) and executing (ux_agent_action_lane_executing);
# an operator's pause until resumed (its paused_until is 'infinity', which no client clock holds) as
# `until_resumed`; how long a broken one has been broken; since when and why its credentials are refused; its
# pace now (`:levelled`, `:return_seconds`, `:pace_hold`, `:idle` of outbox.executor.pacing); and the age of its
# oldest due head (ADMITTED, not expired: what the claim takes when the destination allows;
# ix_agent_action_ready), the wait an action's expires_at bounds. A head
# that deferrals moved (its destination's pause, a turn far off) is due since it first was (`due_since`),
# whoever paused the destination: `due` counts it, and the age counts from then.
DESTINATION_ROWS = text(f"""
WITH live AS (
    SELECT destination AS name, kind, count(*) AS waiting,
           count(*) FILTER (WHERE state = 'ADMITTED' AND lane_head AND (due_at <= now() OR due_since IS NOT NULL))
           AS due, 0 AS executing
      FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED') GROUP BY destination, kind
    UNION ALL
    SELECT destination, kind, 0, 0, count(*) FROM agent_action WHERE state = 'EXECUTING' GROUP BY destination, kind
), counted AS (
    SELECT name, kind, sum(waiting)::bigint AS waiting, sum(due)::bigint AS due, sum(executing)::bigint AS executing
      FROM live GROUP BY name, kind
), oldest AS (
    SELECT destination AS name, kind,
           extract(epoch FROM now() - min(coalesce(due_since, due_at)))::float8 AS oldest_due_seconds
      FROM agent_action
     WHERE lane_head AND state = 'ADMITTED' AND (due_at <= now() OR due_since IS NOT NULL)
       AND (expires_at IS NULL OR expires_at > now())
     GROUP BY destination, kind
), found AS (
    SELECT coalesce(d.name, l.name) AS name, coalesce(d.kind, l.kind) AS kind,
           coalesce(d.paused_until > now(), false) AS paused, d.paused_until, d.paused_by, d.pause_reason,
           d.broken_since, d.credentials_refused_at, d.credentials_reason, d.rate, {_PACE_NOW.format(t="d")} AS pace,
           coalesce(l.waiting, 0) AS waiting, coalesce(l.due, 0) AS due, coalesce(l.executing, 0) AS executing
      FROM agent_destination AS d FULL JOIN counted AS l ON l.name = d.name
)
SELECT f.name, f.kind, f.paused, CASE WHEN isfinite(f.paused_until) THEN f.paused_until END AS paused_until,
       f.paused AND NOT isfinite(f.paused_until) AS until_resumed, f.paused_by, f.pause_reason, f.broken_since,
       extract(epoch FROM now() - f.broken_since)::float8 AS broken_seconds, f.credentials_refused_at,
       f.credentials_reason, f.rate, f.pace, f.waiting, f.due,
       f.executing, coalesce(o.oldest_due_seconds, 0) AS oldest_due_seconds
  FROM found AS f LEFT JOIN oldest AS o ON o.name = f.name AND o.kind = f.kind
 ORDER BY f.kind, f.name
""")

# the kind of a live action that names a destination (an operator's pause of a destination without a row): the
# actions not started on ix_agent_action_state_created, the executing ones on ux_agent_action_lane_executing
LIVE_DESTINATION_KIND = text("""
SELECT kind FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED') AND destination = :name GROUP BY kind
UNION
SELECT kind FROM agent_action WHERE state = 'EXECUTING' AND destination = :name GROUP BY kind
 ORDER BY 1 LIMIT 1
""")

# a declared kind (agent_action_kind) whose own destination is `:name`: one of `:kinds` (the kinds the registry
# of this process names it for), or else a kind whose name in lower case it is (what an action inserted without
# a destination goes to), unless the registry gives that kind another (`:registered`: every kind it knows)
DECLARED_DESTINATION_KIND = text("""
SELECT name FROM agent_action_kind
 WHERE name = ANY (CAST(:kinds AS text[]))
    OR (lower(name) = :name AND name <> ALL (CAST(:registered AS text[])))
 ORDER BY name LIMIT 1
""")
