"""The statements the metrics exporter and the heartbeats run, named for what they read or write.

Counters come from the tally tables (merged here so they stay small); gauges are read at scrape time from
the partial indexes and `agent_lane`, never from the ended rows.
"""

from __future__ import annotations

from sqlalchemy import text

# ---- counters: merge the added rows into one per label set, then read them ------------------------------

MERGE_ATTEMPT_TALLIES = text("""
WITH gone AS (DELETE FROM agent_action_attempt_tally RETURNING kind, result, recorded, n)
INSERT INTO agent_action_attempt_tally (kind, result, recorded, n)
SELECT kind, result, recorded, sum(n) FROM gone GROUP BY kind, result, recorded
""")
MERGE_ENDED_TALLIES = text("""
WITH gone AS (DELETE FROM agent_action_ended_tally RETURNING kind, state, reason, n)
INSERT INTO agent_action_ended_tally (kind, state, reason, n)
SELECT kind, state, reason, sum(n) FROM gone GROUP BY kind, state, reason
""")
MERGE_LATENCY_TALLIES = text("""
WITH gone AS (DELETE FROM agent_action_latency_tally RETURNING kind, metric, le, n, total)
INSERT INTO agent_action_latency_tally (kind, metric, le, n, total)
SELECT kind, metric, le, sum(n), sum(total) FROM gone GROUP BY kind, metric, le
""")

ATTEMPT_COUNTS = text(
    "SELECT kind, result, recorded, sum(n)::bigint AS n FROM agent_action_attempt_tally GROUP BY 1, 2, 3"
)
ENDED_COUNTS = text("SELECT kind, state, reason, sum(n)::bigint AS n FROM agent_action_ended_tally GROUP BY 1, 2, 3")
LATENCY_BUCKETS = text("""
SELECT kind, metric, le, sum(n)::bigint AS n, sum(total) AS total
  FROM agent_action_latency_tally GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
""")

# ---- gauges ----------------------------------------------------------------------------------------------

DUE_BY_KIND = text("""
SELECT kind, count(*) AS actions, extract(epoch FROM now() - min(due_at))::float8 AS oldest_due_seconds
  FROM agent_action WHERE state = 'ADMITTED' AND due_at <= now() GROUP BY kind
""")
LEASES_BY_KIND = text("""
SELECT kind, count(*) AS executing, count(*) FILTER (WHERE lease_expires_at <= now()) AS expired
  FROM agent_action WHERE state = 'EXECUTING' GROUP BY kind
""")
# How many lanes have each backlog depth: one group per lane on ix_agent_action_lane_pending, folded by
# depth, so few rows and no lane key leave the database.
LANES_BY_DEPTH = text("""
SELECT depth, count(*) AS lanes FROM (
    SELECT count(*) AS depth FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED') GROUP BY lane_key
) AS lanes GROUP BY depth
""")
LIVE_EXECUTORS = text("SELECT count(*) FROM agent_executor WHERE seen_at > now() - make_interval(secs => :seconds)")
LAST_PURGE = text("""
SELECT extract(epoch FROM last_success_at)::float8 AS at, last_removed FROM agent_maintenance WHERE job = 'purge'
""")

# ---- heartbeats and maintenance ------------------------------------------------------------------------

BEAT = text("""
INSERT INTO agent_executor (executor_id) VALUES (:executor_id)
ON CONFLICT (executor_id) DO UPDATE SET seen_at = now()
""")
LEAVE = text("DELETE FROM agent_executor WHERE executor_id = :executor_id")
FORGET_SILENT_EXECUTORS = text("DELETE FROM agent_executor WHERE seen_at < now() - interval '1 day'")
PURGE_SUCCEEDED = text("""
INSERT INTO agent_maintenance (job, last_success_at, last_removed) VALUES ('purge', now(), :removed)
ON CONFLICT (job) DO UPDATE SET last_success_at = now(), last_removed = excluded.last_removed
""")
