"""The statements the metrics exporter and the heartbeats run, named for what they read or write.

    writers (trigger, group commit) ──add rows──▶ tally tables ◀──merge_tallies (executor, purge)──
    exporter ──read only: sum(n) of every row, merged or not──▶ counters

Counters come from the tally tables: rows are only added, in the transactions they count, and folded into
one row per label set by `merge_tallies`, which every executor runs every 10 seconds and the retention purge
at its end, never the exporter. A merge keeps every sum, so the exporter's sums are the same before and
after one. Gauges are read at scrape time from the partial indexes, never from the ended
rows.
"""

from __future__ import annotations

from sqlalchemy import Connection, TextClause, text

from outbox.store.executor import HELD

# ---- counters: fold the added rows into one per label set (writers only), then read them ----------------

# pg_advisory_xact_lock key of the tally merge (the bytes of "outboxtl"): one merge at a time, the others skip
TALLY_MERGE_LOCK = 0x6F7574626F78746C
TRY_TALLY_MERGE_LOCK = text("SELECT pg_try_advisory_xact_lock(:key)")
# Each merge locks the oldest 100,000 rows of a table at most (SKIP LOCKED: rows another merge holds stay
# for the next one; a backlog goes in steps) and rewrites only the label sets that have more than one row
# among them. Inserts of new rows never wait for it. The three tables differ only in their columns.


def _merge_tally(table: str, labels: tuple[str, str, str], sums: tuple[str, ...]) -> TextClause:
    """The merge of one tally table (names written here, never a value): its label columns, and the columns
    summed into the merged row."""
    label_list = ", ".join(labels)
    kept = ", ".join(f"t.{column}" for column in (*labels, *sums))
    summed = ", ".join(f"sum({column})" for column in sums)
    return text(f"""
WITH held AS (
    SELECT id, {label_list} FROM {table} ORDER BY id LIMIT 100000 FOR UPDATE SKIP LOCKED
), folded AS (
    SELECT {label_list} FROM held GROUP BY {label_list} HAVING count(*) > 1
), gone AS (
    DELETE FROM {table} AS t USING held AS h JOIN folded AS f USING ({label_list})
     WHERE t.id = h.id
    RETURNING {kept}
)
INSERT INTO {table} ({label_list}, {", ".join(sums)})
SELECT {label_list}, {summed} FROM gone GROUP BY {label_list}
""")


MERGE_ATTEMPT_TALLIES = _merge_tally("agent_action_attempt_tally", ("kind", "result", "recorded"), ("n",))
MERGE_ENDED_TALLIES = _merge_tally("agent_action_ended_tally", ("kind", "state", "reason"), ("n",))
MERGE_LATENCY_TALLIES = _merge_tally("agent_action_latency_tally", ("kind", "metric", "le"), ("n", "total"))
MERGE_TALLIES = (MERGE_ATTEMPT_TALLIES, MERGE_ENDED_TALLIES, MERGE_LATENCY_TALLIES)
# a merge's transaction: each statement, each lock wait and each pause between statements at most :ms (a
# merging executor that freezes or loses its network mid-way holds the tally rows no longer than that)
BOUND_MERGE = text("""
SELECT set_config('statement_timeout', CAST(:ms AS text), true) AS statement_timeout,
       set_config('lock_timeout', CAST(:ms AS text), true) AS lock_timeout,
       set_config('idle_in_transaction_session_timeout', CAST(:ms AS text), true) AS idle_timeout
""")


def merge_tallies(conn: Connection) -> bool:
    """Fold the tally rows into one per label set, inside the caller's transaction; every sum stays the same.

    False, without waiting, when another transaction is merging (it does the work). The rows stay locked
    until the caller's transaction ends: call it in a short transaction of its own, or at the end of one.
    """
    if not conn.execute(TRY_TALLY_MERGE_LOCK, {"key": TALLY_MERGE_LOCK}).scalar_one():
        return False
    for merge in MERGE_TALLIES:
        conn.execute(merge)
    return True


# the exporter reads every row: merged ones and those added since the last merge
ATTEMPT_COUNTS = text(
    "SELECT kind, result, recorded, sum(n)::bigint AS n FROM agent_action_attempt_tally GROUP BY 1, 2, 3"
)
ENDED_COUNTS = text("SELECT kind, state, reason, sum(n)::bigint AS n FROM agent_action_ended_tally GROUP BY 1, 2, 3")
LATENCY_BUCKETS = text("""
SELECT kind, metric, le, sum(n)::bigint AS n, sum(total) AS total
  FROM agent_action_latency_tally GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
""")

# ---- gauges ----------------------------------------------------------------------------------------------

KIND_NAMES = text("SELECT name FROM agent_action_kind")
# What an executor could claim now, by kind: the lane holders that are ADMITTED, due and not expired
# (ix_agent_action_ready), as the claim takes them; and the expired leases the sweep takes back, claimable
# since their lease expired. An expired lease that the sweep ends instead (an at-most-once write that
# started, or the last attempt) is no claim. The heads of a destination held back (paused, broken, paced or
# rated) wait for their destination, not for an executor: `actions` and `oldest_due_seconds` (0: none) leave
# them out, and the destinations' own figures (outbox.store.destination_rows) count them; `heads` counts
# the due lane heads of the other destinations, so that what waits behind a head is DUE_ADMITTED_BY_KIND's
# actions less `heads`. A head
# that deferrals moved (a pause, a turn far off) has waited since it first became due (`due_since`): the age
# counts from then, though its due time is still to come.
CLAIMABLE_BY_KIND = text(f"""
WITH held AS MATERIALIZED (
    SELECT coalesce(array_agg(name), '{{}}') AS names FROM agent_destination WHERE {HELD}
), claimable AS (
    SELECT a.kind, coalesce(a.due_since, a.due_at) AS since, a.due_at <= now() AS due, true AS head,
           coalesce(a.destination = ANY (h.names), false) AS held
      FROM agent_action AS a CROSS JOIN held AS h
     WHERE a.lane_head AND a.state = 'ADMITTED' AND (a.due_at <= now() OR a.due_since IS NOT NULL)
       AND (a.expires_at IS NULL OR a.expires_at > now())
    UNION ALL
    SELECT a.kind, a.lease_expires_at, true, false, false
      FROM agent_action AS a JOIN agent_action_kind AS k ON k.name = a.kind
     WHERE a.state = 'EXECUTING' AND a.lease_expires_at <= now() AND a.attempt < a.max_attempts
       AND NOT (k.at_most_once AND a.write_started_at IS NOT NULL)
)
SELECT kind, count(*) FILTER (WHERE due AND NOT held) AS actions,
       count(*) FILTER (WHERE due AND head AND NOT held) AS heads,
       coalesce(extract(epoch FROM now() - min(since) FILTER (WHERE NOT held)), 0)::float8 AS oldest_due_seconds
  FROM claimable GROUP BY kind
""")
# ADMITTED actions due and not expired, by kind (ix_agent_action_admitted_due), but for the destinations held
# back (whose actions wait for their destination: outbox.store.destination_rows counts them): the claimable
# lane heads among them, and every action that waits for its lane (behind its head, or its executing action)
DUE_ADMITTED_BY_KIND = text(f"""
SELECT kind, count(*) AS actions FROM agent_action
 WHERE state = 'ADMITTED' AND due_at <= now() AND (expires_at IS NULL OR expires_at > now())
   AND coalesce(destination <> ALL (ARRAY(SELECT name FROM agent_destination WHERE {HELD})), true)
 GROUP BY kind
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
# an executor that has not beaten for this long counts as gone
EXECUTOR_SILENCE_SECONDS = 30
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

# ---- the collector's snapshot --------------------------------------------------------------------------

READ_ONLY_SNAPSHOT = text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
BOUND_STATEMENTS = text("SELECT set_config('statement_timeout', CAST(:ms AS text), true)")
