"""The executor's statements: the claim of lane heads, the sweep, the group commit, and the histogram bounds.

    claim ─▶ CLAIM_READY_HEADS (CLAIM_OPEN_DESTINATION_HEADS while a destination is held, or could pass its
             share of the executor's slots)
    sweep ─▶ BEAT, EXPIRE_UNSTARTED, TAKE_BACK_EXPIRED_LEASES
    group commit (fences and results of many attempts) ─▶ FENCE_WRITES (the fences), COMMIT_WRITES (the rest)

`outbox.executor.store.ExecutorStore` runs them, each in a transaction of its own, on the executor's own
connections. The group commit is one statement for any mix of fences and results: it locks the rows it can
(SKIP LOCKED; a result's row FOR UPDATE, since ending a lane's holder waits for the enqueues behind it);
it writes each fence and result whose row still carries its claim's epoch, adds the attempt and latency
tallies of every result it decided and the ended tally of every end, and passes the lanes its ends let go of
to their next holder, in the same transaction as the results themselves (claims and fences fire no trigger,
and its results none either: revision 0024). What another transaction holds is reported as held and tried
again in the next batch.
"""

from __future__ import annotations

import math

from sqlalchemy import text

# Upper bounds (seconds) of the attempt duration and pickup delay histograms.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    math.inf,
)  # fmt: skip

CLAIMED_COLUMNS = (
    "a.id, a.kind, a.lane_key, a.idempotency_key, a.workspace_id, a.subject_account_id, a.payload, a.attempt,"
    " a.max_attempts,"
    " a.epoch, a.write_started_at, a.due_at,"
    " extract(epoch FROM a.lease_expires_at - now())::float8 AS lease_seconds,"
    " extract(epoch FROM now() - a.due_at)::float8 AS pickup_seconds, a.trace, a.trace_context, a.destination"
)

# What holds a destination back from the plain claim: a pause, a breaker, a rate or a pace. Its heads are
# claimed one destination at a time (outbox.store.destinations).
HELD = "paused_until > now() OR broken_since IS NOT NULL OR rate IS NOT NULL OR pace IS NOT NULL"

# The claim's write: the heads found (`heads`: their ids) start executing under a new epoch and a lease. The
# ids are read as an array, so that the rows are found by primary key: joined to the CTE, the planner expects
# as many heads as the claim's limit and, on a table of a few thousand rows (a paused destination's backlog),
# hashes them and reads the whole table to take one head (0.45 ms of the 0.7 a claim of one head took).
TAKE_HEADS = f"""
UPDATE agent_action AS a
   SET state = 'EXECUTING', epoch = a.epoch + 1, attempt = a.attempt + 1,
       lease_expires_at = now() + make_interval(secs => :lease_seconds)
 WHERE a.id = ANY (ARRAY(SELECT id FROM heads))
RETURNING {CLAIMED_COLUMNS}"""

# Due lane heads, many per round trip: the ADMITTED holders of their lanes (ix_agent_action_ready holds nothing
# else), by due time, but for the destinations held back (read once per statement from the few rows of
# agent_destination). The filter is wrapped in coalesce so that the planner does not estimate it from the
# column's statistics: with one destination it expected almost no row to pass, and read and sorted every due
# head instead of taking the first from the index. SKIP LOCKED, so two replicas never take one head and neither
# waits; a row that stopped holding its lane meanwhile is checked again, and left. FOR NO KEY UPDATE: an enqueue
# into the lane that has not committed (it holds the holder FOR KEY SHARE) does not hold the claim back. The
# holder stays marked while it executes, so a claim writes nothing but its own rows. The held destinations'
# heads are read and left: while one is held, CLAIM_OPEN_DESTINATION_HEADS takes this one's place.
CLAIM_READY_HEADS = text(f"""
WITH heads AS MATERIALIZED (
    SELECT a.id FROM agent_action AS a
     WHERE a.lane_head AND a.state = 'ADMITTED' AND a.due_at <= now()
       AND a.kind = ANY (CAST(:kinds AS text[])) AND (a.expires_at IS NULL OR a.expires_at > now())
       AND coalesce(a.destination <> ALL (ARRAY(SELECT name FROM agent_destination WHERE {HELD})), true)
     ORDER BY a.due_at
     LIMIT :limit
     FOR NO KEY UPDATE SKIP LOCKED
){TAKE_HEADS}
""")

# Up to `{limit}` due heads of one destination and kind (`{p}.destination`, `{p}.kind`), in due order, locked as
# the plain claim locks them: a range of ix_agent_action_ready_destination. The range is written as two row
# comparisons, not as equalities, so that the planner reads it in the index's order: with equalities it may
# walk ix_agent_action_ready instead, past every other destination's due heads.
PAIR_DUE_HEADS = """(
    SELECT a.id, a.due_at FROM agent_action AS a
     WHERE (a.destination, a.kind, a.due_at) >= ({p}.destination, {p}.kind, '-infinity')
       AND (a.destination, a.kind, a.due_at) <= ({p}.destination, {p}.kind, now())
       AND a.lane_head AND a.state = 'ADMITTED' AND (a.expires_at IS NULL OR a.expires_at > now())
     ORDER BY a.destination, a.kind, a.due_at
     LIMIT {limit}
     FOR NO KEY UPDATE SKIP LOCKED
)"""

# The plain claim while some destination is held, or while one destination could take more than its share of
# the executor's slots: the same heads, found destination by destination, so that a held destination's due
# heads cost nothing however many they are. The (destination, kind) pairs that have ready heads come from
# ix_agent_action_ready_destination, one descent each (a loose index scan); the pairs of `:kinds` whose
# destination is not held give up to `:limit` due heads each (one that may not pass its room: its room's worth,
# so that no head is locked that the claim could not take), locked, numbered in due order; the `:limit`
# claimed are first those within their destination's room (`:rooms` for the destinations this executor has
# attempts of in flight, `:busy`, else `:cap`), in due order, then the rest, the least far past its room
# first: while another destination has due heads, none takes more than its share, and a destination alone
# still fills every free slot (the rest are let go when the statement ends). Only the destinations of
# `:answered` (their last attempt here was accepted or refused for good; null: all) pass their room: one whose
# attempts have not come back yet, or came back unanswered (timed out, failed, slowed down), may be hanging,
# and a fresh executor's first claim would otherwise give it half the slots. With `:cap` = `:limit`, no room
# and `:answered` null, the `:limit` first due.
PAIR_LIMIT = "CASE WHEN d.answered THEN :limit ELSE least(:limit, greatest(0, d.room)) END"
CLAIM_OPEN_DESTINATION_HEADS = text(f"""
WITH RECURSIVE ready (destination, kind) AS (
    (SELECT a.destination, a.kind FROM agent_action AS a WHERE a.lane_head AND a.state = 'ADMITTED'
      ORDER BY a.destination, a.kind LIMIT 1)
    UNION ALL
    SELECT n.destination, n.kind FROM ready AS r CROSS JOIN LATERAL (
        SELECT a.destination, a.kind FROM agent_action AS a
         WHERE a.lane_head AND a.state = 'ADMITTED' AND (a.destination, a.kind) > (r.destination, r.kind)
         ORDER BY a.destination, a.kind LIMIT 1
    ) AS n
), rooms AS MATERIALIZED (
    SELECT b.name, b.room FROM unnest(CAST(:busy AS text[]), CAST(:rooms AS int[])) AS b (name, room)
), heads AS MATERIALIZED (
    SELECT h.id FROM ready AS r CROSS JOIN LATERAL (
        SELECT coalesce((SELECT o.room FROM rooms AS o WHERE o.name = r.destination), :cap) AS room,
               CAST(:answered AS text[]) IS NULL OR r.destination = ANY (CAST(:answered AS text[])) AS answered
    ) AS d CROSS JOIN LATERAL (
        SELECT p.id, p.due_at, row_number() OVER (ORDER BY p.due_at) AS n
          FROM {PAIR_DUE_HEADS.format(p="r", limit=PAIR_LIMIT)} AS p
    ) AS h
     WHERE r.kind = ANY (CAST(:kinds AS text[]))
       AND r.destination <> ALL (ARRAY(SELECT name FROM agent_destination WHERE {HELD}))
     ORDER BY greatest(0, h.n - d.room), h.due_at
     LIMIT :limit
){TAKE_HEADS}
""")

# Executing actions whose lease expired. An at-most-once action whose write started ends UNCERTAIN;
# one at its last attempt ends FAILED (UNCERTAIN if its write started); every other is claimed again
# without waiting for its lane. FOR UPDATE: an end waits for the enqueues behind the holder that have not
# committed (SKIP LOCKED: it is taken in a later sweep), so the lane passes to them too.
TAKE_BACK_EXPIRED_LEASES = text(f"""
WITH stale AS MATERIALIZED (
    SELECT id,
           CASE WHEN write_started_at IS NOT NULL AND kind = ANY (CAST(:at_most_once AS text[]))
                    THEN 'UNCERTAIN'
                WHEN attempt >= max_attempts AND write_started_at IS NOT NULL THEN 'UNCERTAIN'
                WHEN attempt >= max_attempts THEN 'FAILED'
                ELSE 'EXECUTING' END AS next_state
      FROM agent_action
     WHERE state = 'EXECUTING' AND lease_expires_at <= now() AND kind = ANY (CAST(:kinds AS text[]))
     ORDER BY lease_expires_at
     LIMIT :limit
     FOR UPDATE SKIP LOCKED
)
UPDATE agent_action AS a
   SET state = s.next_state,
       stop_reason = CASE s.next_state WHEN 'UNCERTAIN' THEN 'LEASE_LOST_AFTER_WRITE'
                                        WHEN 'FAILED' THEN 'ATTEMPTS_EXHAUSTED' END,
       epoch = a.epoch + (s.next_state = 'EXECUTING')::int,
       attempt = a.attempt + (s.next_state = 'EXECUTING')::int,
       lease_expires_at = CASE WHEN s.next_state = 'EXECUTING'
                               THEN now() + make_interval(secs => :lease_seconds) END
  FROM stale AS s
 WHERE a.id = s.id
RETURNING {CLAIMED_COLUMNS}, a.state, a.stop_reason
""")

# Actions that expired before they started end CANCELLED / EXPIRED (FOR UPDATE, as the lease sweep's ends).
EXPIRE_UNSTARTED = text("""
WITH expired AS MATERIALIZED (
    SELECT id FROM agent_action
     WHERE state IN ('PROPOSED', 'ADMITTED') AND expires_at IS NOT NULL AND expires_at <= now()
     ORDER BY expires_at
     LIMIT :limit
     FOR UPDATE SKIP LOCKED
)
UPDATE agent_action AS a SET state = 'CANCELLED', stop_reason = 'EXPIRED'
  FROM expired AS e
 WHERE a.id = e.id
RETURNING a.id, a.kind, a.trace
""")

# Fences alone, the executor's most frequent write, as one plain UPDATE from typed arrays: each row still
# EXECUTING with the write window left, locked without waiting (FOR NO KEY UPDATE SKIP LOCKED, as in the group
# commit), written when it still carries its claim's epoch. The ids written come back; every other fence
# (held, gone, stale, short) goes to COMMIT_WRITES, which tells which. `:traces`: each fence's trace as JSON
# text, or null to keep the stored one.
FENCE_WRITES = text("""
WITH lockable AS MATERIALIZED (
    SELECT id FROM agent_action
     WHERE id = ANY (CAST(:ids AS bigint[])) AND state = 'EXECUTING'
       AND lease_expires_at >= now() + make_interval(secs => :window_seconds)
     ORDER BY id
     FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE agent_action AS a SET write_started_at = now(), trace = coalesce(f.trace, a.trace)
  FROM unnest(CAST(:ids AS bigint[]), CAST(:epochs AS bigint[]), CAST(:traces AS jsonb[])) AS f (id, epoch, trace)
 WHERE a.id = f.id AND a.epoch = f.epoch AND a.id IN (SELECT id FROM lockable)
RETURNING a.id
""")

# The group commit: fences ('fence'), results ('finish') and results that write nothing ('none', tallied
# only), each named by its claim's epoch, in one statement.
#   fence:  write_started_at, while at least the write window of the lease is left
#   finish: the result's values; an end lets go of its lane (lane_head). The statement writes the ended tally
#           and calls hold_agent_lanes for the lanes whose holder ended or went back to wait (`outbox.own_ends`
#           tells the row trigger after_agent_action_move, which does both for other writers, to leave them).
#           `fence`: keep, clear, or restore the value the attempt found at its claim (a deferral writes
#           nothing, so an earlier write stays known). A deferral while the action's destination is held
#           (its pause, a turn far off) keeps when the action first became due (`due_since`: its due time
#           before the first such deferral moved it), which the age gauges count from; any other result
#           (a retry's backoff, an adapter's own deferral such as greylisting: the action's own wait)
#           clears it. `last_error`: the result's reason; a result without one keeps the earlier reason,
#           DONE clears it.
#           The row values the guard stamps on an end (ended_at, no payload, no lane_head) and on any result (no lease)
#           are written here, so its trigger's WHEN condition lets the row through without entering PL/pgSQL.
#   both:   `trace`, the attempt's whole trace (what its claim found and what it noted) when it noted
#           something; null keeps the stored one.
# Each write comes back with its outcome: written; held (its row is locked by another transaction, for a
# result also by an enqueue behind it that has not committed: try again); gone (erased); stale (another
# claim took it; with the row's epoch and state); short (a fence with less than the window left); none
# (nothing to write). The attempt and latency tallies count every result decided here (not the held ones),
# recorded or not; the ended tally every end written.
# The writes as rows, from one typed array per column (`WRITE_COLUMNS`, in order; the parameters are named
# after them), as the fences are: no JSON to decode, no text to cast. Read as a CTE where a hash join serves,
# and again in the result's UPDATE, where a function scan lets the planner probe agent_action by primary key
# for each write.
WRITE_COLUMNS = (
    ("id", "bigint"), ("epoch", "bigint"), ("op", "text"), ("state", "text"), ("stop_reason", "text"),
    ("readback_ref", "text"), ("delay", "float8"), ("uncount", "int"), ("fence", "text"),
    ("prior_write", "timestamptz"), ("last_error", "text"), ("kind", "text"), ("result", "text"),
    ("attempt_seconds", "float8"), ("attempt_le", "float8"), ("pickup_seconds", "float8"), ("pickup_le", "float8"),
    ("trace", "jsonb"),
)  # fmt: skip
_WRITES = (
    "unnest("
    + ", ".join(f"CAST(:w_{name} AS {kind}[])" for name, kind in WRITE_COLUMNS)
    + ") AS {alias} ("
    + ", ".join(name for name, _ in WRITE_COLUMNS)
    + ")"
)

COMMIT_WRITES = text(f"""
WITH own_ends AS MATERIALIZED (
    -- read before any row is written (every write below goes through w): this transaction's ends are tallied
    -- and their lanes handed over here, so the row trigger after_agent_action_move leaves them
    SELECT set_config('outbox.own_ends', 'written', true)
), w AS MATERIALIZED (
    SELECT w.* FROM own_ends CROSS JOIN {_WRITES.format(alias="w")}
), locked_for_results AS MATERIALIZED (
    -- FOR UPDATE: a result may end its lane's holder, which waits for the enqueues behind it that have not
    -- committed (they hold its row FOR KEY SHARE); such a result is held, and tried again
    SELECT id, epoch, state, lease_expires_at >= now() + make_interval(secs => :window_seconds) AS has_window,
           lane_key, lane_head
      FROM agent_action
     WHERE id = ANY (ARRAY(SELECT id FROM w WHERE op = 'finish'))
     ORDER BY id
     FOR UPDATE SKIP LOCKED
), locked_for_fences AS MATERIALIZED (
    -- FOR NO KEY UPDATE: a fence never waits for an enqueue
    SELECT id, epoch, state, lease_expires_at >= now() + make_interval(secs => :window_seconds) AS has_window,
           lane_key, lane_head
      FROM agent_action
     WHERE id = ANY (ARRAY(SELECT id FROM w WHERE op = 'fence' EXCEPT SELECT id FROM w WHERE op = 'finish'))
     ORDER BY id
     FOR NO KEY UPDATE SKIP LOCKED
), locked AS MATERIALIZED (
    SELECT * FROM locked_for_results UNION ALL SELECT * FROM locked_for_fences
), current AS MATERIALIZED (
    -- the writes whose row this statement holds, still under their epoch: nobody can change them now,
    -- so the updates below need no other condition (and find each row by primary key)
    SELECT w.id, w.op, l.has_window FROM w JOIN locked AS l ON l.id = w.id
     WHERE l.epoch = w.epoch AND l.state = 'EXECUTING'
), fenced AS (
    UPDATE agent_action AS a SET write_started_at = now(), trace = coalesce(w.trace, a.trace)
      FROM w
     WHERE a.id = w.id AND w.id = ANY (ARRAY(SELECT id FROM current WHERE op = 'fence' AND has_window))
    RETURNING a.id
), finished AS (
    UPDATE agent_action AS a
       SET state = f.state,
           stop_reason = f.stop_reason,
           readback_ref = coalesce(f.readback_ref, a.readback_ref),
           last_error = CASE WHEN f.state = 'DONE' THEN NULL ELSE coalesce(f.last_error, a.last_error) END,
           due_at = CASE WHEN f.state = 'ADMITTED' THEN now() + make_interval(secs => f.delay) ELSE a.due_at END,
           due_since = CASE WHEN f.state = 'ADMITTED' AND f.result = 'DEFER' AND EXISTS (
                                     SELECT FROM agent_destination AS d WHERE d.name = a.destination AND ({HELD}))
                            THEN coalesce(a.due_since, a.due_at) END,
           attempt = a.attempt - f.uncount,
           write_started_at = CASE f.fence WHEN 'clear' THEN NULL WHEN 'restore' THEN f.prior_write
                                           ELSE a.write_started_at END,
           trace = coalesce(f.trace, a.trace),
           ended_at = CASE WHEN f.state IN ('DONE', 'FAILED', 'UNCERTAIN', 'CANCELLED') THEN now() ELSE a.ended_at END,
           payload = CASE WHEN f.state IN ('DONE', 'FAILED', 'UNCERTAIN', 'CANCELLED') THEN NULL ELSE a.payload END,
           lane_head = a.lane_head AND f.state NOT IN ('DONE', 'FAILED', 'UNCERTAIN', 'CANCELLED'),
           lease_expires_at = NULL
      FROM {_WRITES.format(alias="f")}
     WHERE a.id = f.id AND f.id = ANY (ARRAY(SELECT id FROM current WHERE op = 'finish'))
    RETURNING a.id, a.kind, a.state, a.stop_reason
), ended AS (
    INSERT INTO agent_action_ended_tally (kind, state, reason, n)
    SELECT kind, state, stop_reason, count(*) FROM finished
     WHERE state IN ('DONE', 'FAILED', 'UNCERTAIN', 'CANCELLED')
     GROUP BY kind, state, stop_reason
), handed_over AS MATERIALIZED (
    -- after every result is written (the array reads all of finished): the lanes whose holder ended, or went
    -- back to wait (an earlier action that had not started may take the lane), get their next holder in a
    -- snapshot that sees these ends
    SELECT hold_agent_lanes(h.lanes) FROM (
        SELECT ARRAY(SELECT DISTINCT l.lane_key FROM finished AS x JOIN locked_for_results AS l ON l.id = x.id
                      WHERE l.lane_head OR x.state = 'ADMITTED') AS lanes
    ) AS h
     WHERE cardinality(h.lanes) > 0
), decided AS MATERIALIZED (
    SELECT w.id, w.op, w.kind, w.result, w.attempt_seconds, w.attempt_le, w.pickup_seconds, w.pickup_le,
           l.epoch AS found_epoch, l.state AS found_state,
           CASE WHEN w.op = 'none' THEN 'none'
                WHEN w.id IN (SELECT id FROM fenced) OR w.id IN (SELECT id FROM finished) THEN 'written'
                WHEN l.id IS NULL AND EXISTS (SELECT 1 FROM agent_action AS e WHERE e.id = w.id) THEN 'held'
                WHEN l.id IS NULL THEN 'gone'
                WHEN l.epoch <> w.epoch OR l.state <> 'EXECUTING' THEN 'stale'
                ELSE 'short' END AS outcome
      FROM w LEFT JOIN locked AS l ON l.id = w.id
), tallied AS MATERIALIZED (
    SELECT * FROM decided WHERE op <> 'fence' AND outcome <> 'held'
), attempts AS (
    INSERT INTO agent_action_attempt_tally (kind, result, recorded, n)
    SELECT kind, result, outcome = 'written', count(*) FROM tallied GROUP BY kind, result, outcome = 'written'
), latencies AS (
    INSERT INTO agent_action_latency_tally (kind, metric, le, n, total)
    SELECT kind, 'attempt_duration', attempt_le, count(*), sum(attempt_seconds) FROM tallied
     GROUP BY kind, attempt_le
    UNION ALL
    SELECT kind, 'pickup_delay', pickup_le, count(*), sum(pickup_seconds) FROM tallied
     WHERE pickup_seconds IS NOT NULL GROUP BY kind, pickup_le
)
SELECT d.id, d.outcome, d.found_epoch, d.found_state
  FROM decided AS d CROSS JOIN (SELECT count(*) FROM handed_over) AS handed
""")

# `outbox.testing.drain`, before each round: every waiting action due now (a drain cuts retries' backoff and
# deferrals short)
MAKE_WAITING_DUE = text("UPDATE agent_action SET due_at = now() WHERE state = 'ADMITTED' AND due_at > now()")
