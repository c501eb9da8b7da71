"""Destinations, the store's layer: the statements of the claims a held destination allows, the slow-down, the
breaker, the rates the executors set, and the operator's commands.

    executor start ─▶ SET_RATES, CLEAR_RATES                 (the configured rates, for all executors)
    every sweep   ─▶ HELD_DESTINATIONS                       (the rows that hold a destination back)
    claim         ─▶ CLAIM_READY_HEADS, or CLAIM_OPEN_DESTINATION_HEADS while one is held (outbox.store.executor),
                     skips every destination HELD names;
                     CLAIM_DESTINATION_HEADS claims for one held destination: as many heads as its tokens,
                     one probe of a broken one at its probe time, none while it is paused
    before a fence ─▶ TAKE_SEND_TOKENS                       (the attempts of a held destination: their turns)
                   ─▶ SLOWED_AT, after waiting for the turn     (a provider's pause since voids it)
    slow-down     ─▶ ADD_DESTINATION, SLOW_DOWN              (pause; lower the pace)
                  ─▶ NOTIFY_PAUSED, when it paused the destination (every executor holds it at once)
    failure       ─▶ ADD_DESTINATION, NOTE_FAILURE            (the run of failures; broken once it lasted)
    credentials refused ─▶ ADD_DESTINATION, REFUSE_CREDENTIALS (broken at once, the reason kept; a long probe)
    success       ─▶ MEND, when held                          (a probe that succeeded)
    operator      ─▶ ADD_DESTINATION, PAUSE, RESUME (the list: outbox.store.destination_rows)
    testing.drain ─▶ END_PROVIDER_PAUSES

A destination without a row is open. The pace, the pause and the breaker are described with their numbers
in outbox.executor.pacing; every time is the database clock.

Destinations are one concept in three layers: the operator's (outbox.destinations), the executor's
(outbox.executor.destinations, pacing and turns) and the store's (outbox.store.destinations and destination_rows).
"""

from __future__ import annotations

from sqlalchemy import text

from outbox.store.executor import HELD, PAIR_DUE_HEADS, TAKE_HEADS

HELD_DESTINATIONS = text(f"""
SELECT name, kind, broken_since IS NOT NULL AS broken FROM agent_destination WHERE {HELD} ORDER BY name
""")

ADD_DESTINATION = text("""
INSERT INTO agent_destination (name, kind) VALUES (:name, :kind) ON CONFLICT (name) DO NOTHING
""")

# the rates configured in an executor's settings; the burst is the tokens its bucket holds at most
SET_RATES = text("""
INSERT INTO agent_destination AS d (name, kind, rate, burst, tokens)
SELECT r.name, r.kind, r.rate, r.burst, r.burst
  FROM unnest(CAST(:names AS text[]), CAST(:kinds AS text[]), CAST(:rates AS float8[]), CAST(:bursts AS float8[]))
       AS r (name, kind, rate, burst)
ON CONFLICT (name) DO UPDATE SET rate = excluded.rate, burst = excluded.burst, updated_at = now()
 WHERE (d.rate, d.burst) IS DISTINCT FROM (excluded.rate, excluded.burst)
""")
CLEAR_RATES = text("""
UPDATE agent_destination SET rate = NULL, updated_at = now()
 WHERE name = ANY (CAST(:names AS text[])) AND rate IS NOT NULL
""")

# The seconds from now until a time that may be an operator's pause without end ('infinity': Infinity; PostgreSQL
# before 17 refuses to subtract an infinite time)
_SECONDS_UNTIL = "(extract(epoch FROM {t}) - extract(epoch FROM now()))"

# A time as epoch seconds (float8), to compare as it was read
_EPOCH = "extract(epoch FROM {t})::float8"

# Until when a pace counts as used: its attempts' last turn (`send_tokens_at`, or a pause's start) and `:idle`
# seconds, or two tokens of the pace as lowered when longer
_USED_UNTIL = "{t}.send_tokens_at + make_interval(secs => greatest(:idle, 2 / {t}.pace))"

# The pace now, a cubic of the seconds t since it was lowered: from the pace as lowered (t = 0) to its level
# (`pace * :levelled`, below where it was slowed down) at t = `:return_seconds`, level there, then rising above
# it ever faster (the same curve mirrored), to at most twice itself and one more (a pace far above what the
# executors reach would only find the limit again by a run of refusals); a pace unlowered for `:pace_hold` seconds
# is over (null). Above its level t counts only while the pace is used (_USED_UNTIL): an idle pace holds where
# it was (TAKE_SEND_TOKENS starts its curve again from there when it is used again).
_PACE_NOW = f"""CASE WHEN {{t}}.pace IS NULL OR now() - {{t}}.pace_at > make_interval(secs => :pace_hold) THEN NULL
     ELSE least(2 * {{t}}.pace + 1,
                {{t}}.pace * (:levelled + (:levelled - 1)
                    * ((extract(epoch FROM least(now(), greatest({{t}}.pace_at + make_interval(secs => :return_seconds),
                                                               coalesce({_USED_UNTIL}, now()))) - {{t}}.pace_at)
                        - :return_seconds) / :return_seconds) ^ 3)) END"""

# A destination's per-second allowance (`{t}` its row with `pace_now`): its rate or its pace, whichever is lower
_PER_SECOND = "least(coalesce({t}.rate, 'infinity'), coalesce({pace_now}, 'infinity'))"
# The tokens a bucket holds now: `{tokens}` at `{at}` (null: full), refilled at `{t}.per_second`, up to its
# size, the configured burst or `:burst_seconds` of the per-second allowance when that holds more
_TOKENS_NOW = """least(greatest({t}.burst, {t}.per_second * :burst_seconds),
                 coalesce({t}.{tokens} + {t}.per_second * extract(epoch FROM now() - {t}.{at}),
                          greatest({t}.burst, {t}.per_second * :burst_seconds)))"""

# the heads a held destination allows now (`allowed.available`, at most `:limit`)
_ALLOWED = "coalesce((SELECT greatest(0, least(:limit, floor(available)))::int FROM allowed), 0)"

# Heads of one held destination, as many as it allows now (its row locked FOR UPDATE: one executor at a time
# takes its tokens): paused, none; broken, one probe when its probe time has come (the next is then
# `:probe_seconds` later); paced, as many as its token bucket holds (the rate and the pace, whichever is lower,
# refill it, up to its burst: the configured one, or `:burst_seconds` of the pace when that holds more). A pace
# at its ceiling (twice itself and one more) whose tokens this claim used up starts its curve again there,
# levelled (`pace_at` `:return_seconds` back): the executors keep up with it and the provider still accepts. Every
# row comes back with the seconds until the destination may allow more (`next_seconds`: the end of its pause,
# its probe time, or its next token when the tokens, not the due heads, ran out; else null), and the claimed
# action's columns (null when none).
CLAIM_DESTINATION_HEADS = text(f"""
WITH locked AS MATERIALIZED (
    SELECT * FROM agent_destination WHERE name = :name FOR UPDATE
), found AS MATERIALIZED (
    SELECT l.name, coalesce(l.paused_until > now(), false) AS paused, l.broken_since IS NOT NULL AS broken, l.probe_at,
           l.paused_until, l.pace, {_PACE_NOW.format(t="l")} AS pace_now, l.rate, l.burst, l.tokens, l.tokens_at
      FROM locked AS l
), priced AS MATERIALIZED (
    SELECT f.*, {_PER_SECOND.format(t="f", pace_now="f.pace_now")} AS per_second FROM found AS f
), allowed AS MATERIALIZED (
    SELECT p.*,
           CASE WHEN p.paused THEN 0
                WHEN p.broken THEN CASE WHEN p.probe_at IS NULL OR p.probe_at <= now() THEN 1 ELSE 0 END
                WHEN p.per_second = 'infinity' THEN :limit
                ELSE {_TOKENS_NOW.format(t="p", tokens="tokens", at="tokens_at")} END
           AS available
      FROM priced AS p
), pairs AS MATERIALIZED (
    SELECT CAST(:name AS text) AS destination, k.kind FROM unnest(CAST(:kinds AS text[])) AS k (kind)
), heads AS MATERIALIZED (
    SELECT h.id FROM pairs AS p CROSS JOIN LATERAL {PAIR_DUE_HEADS.format(p="p", limit=_ALLOWED)} AS h
     ORDER BY h.due_at
     LIMIT {_ALLOWED}
), claimed AS ({TAKE_HEADS}
), taken AS MATERIALIZED (
    SELECT count(*) AS n FROM claimed
), ceiling AS MATERIALIZED (
    SELECT NOT g.paused AND NOT g.broken AND g.pace_now >= 2 * g.pace + 1 AND g.per_second = g.pace_now
           AND (SELECT n FROM taken) >= floor(g.available) AS used_up
      FROM allowed AS g
), spent AS (
    UPDATE agent_destination AS d
       SET tokens = CASE WHEN g.per_second = 'infinity' OR g.paused OR g.broken THEN d.tokens
                         ELSE g.available - (SELECT n FROM taken) END,
           tokens_at = CASE WHEN g.per_second = 'infinity' OR g.paused OR g.broken THEN d.tokens_at ELSE now() END,
           pace = CASE WHEN g.pace_now IS NULL THEN NULL
                       WHEN (SELECT used_up FROM ceiling) THEN g.pace_now / :levelled ELSE d.pace END,
           pace_at = CASE WHEN g.pace_now IS NULL THEN NULL
                          WHEN (SELECT used_up FROM ceiling) THEN now() - make_interval(secs => :return_seconds)
                          ELSE d.pace_at END,
           probe_at = CASE WHEN g.broken AND (SELECT n FROM taken) > 0
                           THEN now() + make_interval(secs => :probe_seconds) ELSE d.probe_at END
      FROM allowed AS g
     WHERE d.name = g.name
)
SELECT c.*,
       CASE WHEN g.paused THEN {_SECONDS_UNTIL.format(t="g.paused_until")}
            WHEN g.broken THEN greatest(0, extract(epoch FROM coalesce(g.probe_at, now()) - now()))
            WHEN g.per_second = 'infinity' OR (SELECT n FROM taken) < floor(g.available) THEN NULL
            ELSE greatest(0, 1 - (g.available - (SELECT n FROM taken))) / g.per_second END::float8 AS next_seconds
  FROM allowed AS g LEFT JOIN claimed AS c ON true
""")

# The attempts of a held destination waiting at one executor's gate, just before their fences: `:count` turns,
# each a token of the second bucket, the one that shapes when attempts reach the provider (the claim's bounds
# what is in flight), one row per attempt in the order asked (`turn` 0 first). Paused: no token, and
# `wait_seconds` is the rest of the pause (the attempts ask again after it). Otherwise each turn takes a token
# even when the bucket holds less than one (it goes below zero: the turns given to attempts already waiting),
# and `wait_seconds` is the time until that turn (0: now); but a turn more than `:gate_wait` seconds away is not
# taken (its attempt does not wait for it: it ends Defer, and a token it never uses would push every later turn
# further off, until no attempt's turn came within `:gate_wait` and the destination sent nothing): each attempt
# whose turn is not taken is told the first such turn, as if it had asked alone after those taken. The bucket
# refills at the rate or the pace, whichever is lower, and holds as much as the claim's; it starts full, and again
# from empty at each pause a provider asks for (`slowed_at`, returned with the turns: the turns given before it
# are void). An open destination (no rate, no pace) never waits. A turn taken after the pace was left idle above
# its level (_USED_UNTIL passed) starts its curve again from where it held, levelled (`pace_at` `:return_seconds`
# back).
# The seconds until turn `{i}` (0 first) of a bucket `{t}` that holds `available` tokens and refills at `per_second`
_TURN_SECONDS = "greatest(0, 1 + {i} - {t}.available) / {t}.per_second"
TAKE_SEND_TOKENS = text(f"""
WITH paced AS MATERIALIZED (
    SELECT d.name, coalesce(d.paused_until > now(), false) AS paused, d.paused_until, d.burst, d.send_tokens,
           d.send_tokens_at, d.rate, {_PACE_NOW.format(t="d")} AS pace_now,
           now() > {_USED_UNTIL.format(t="d")} AND now() > d.pace_at + make_interval(secs => :return_seconds)
           AS resumes
      FROM agent_destination AS d WHERE d.name = :name FOR UPDATE
), found AS MATERIALIZED (
    SELECT p.*, {_PER_SECOND.format(t="p", pace_now="p.pace_now")} AS per_second FROM paced AS p
), allowed AS MATERIALIZED (
    SELECT f.*,
           CASE WHEN f.paused OR f.per_second = 'infinity' THEN NULL
                ELSE {_TOKENS_NOW.format(t="f", tokens="send_tokens", at="send_tokens_at")} END AS available
      FROM found AS f
), taking AS MATERIALIZED (
    SELECT g.*, (SELECT count(*) FROM generate_series(0, :count - 1) AS i
                  WHERE {_TURN_SECONDS.format(i="i", t="g")} <= :gate_wait) AS taken
      FROM allowed AS g
), taken AS (
    UPDATE agent_destination AS d
       SET send_tokens = CASE WHEN g.taken > 0 THEN g.available - g.taken ELSE d.send_tokens END,
           send_tokens_at = CASE WHEN g.taken > 0 THEN now() ELSE d.send_tokens_at END,
           pace = CASE WHEN g.taken > 0 AND g.resumes AND g.pace_now IS NOT NULL THEN g.pace_now / :levelled
                       ELSE d.pace END,
           pace_at = CASE WHEN g.taken > 0 AND g.resumes AND g.pace_now IS NOT NULL
                          THEN now() - make_interval(secs => :return_seconds) ELSE d.pace_at END
      FROM taking AS g
     WHERE d.name = g.name
    RETURNING g.paused, g.paused_until, g.available, g.per_second, g.taken,
              {_EPOCH.format(t="d.slowed_at")} AS slowed_at
)
SELECT i AS turn, t.paused,
       CASE WHEN t.paused THEN {_SECONDS_UNTIL.format(t="t.paused_until")}
            WHEN t.available IS NULL THEN 0
            ELSE {_TURN_SECONDS.format(i="least(i, t.taken)", t="t")} END::float8 AS wait_seconds,
       t.slowed_at
  FROM taken AS t CROSS JOIN generate_series(0, :count - 1) AS i
 ORDER BY i
""")

# An attempt that waited for its turn, just before its fence: when the provider last paused the destination
# (a pause since its turn was given voids the turn: the attempt takes another)
SLOWED_AT = text(f"""
SELECT {_EPOCH.format(t="slowed_at")} AS slowed_at FROM agent_destination WHERE name = :name
""")

# A provider's slow-down (its row made first by ADD_DESTINATION). While a pause lasts, the slow-downs of the
# attempts claimed before it change nothing but for a longer wait the provider names. Otherwise, unless the pace was
# lowered less than `:settle` seconds (or two of its tokens) ago, the pace is lowered to `:decrease` of what it was
# (the pace now, else the configured rate; no more than what the provider accepted, from as few as `:min_accepted`:
# the attempts that ended accepted in the last `:measure` seconds, a second since the first ended, over at least
# `:measure_floor`; for a first pace (none yet), those sent since its last pausing refusal (`slowed_at`: its bucket
# was empty then), a second over the time since, when that refusal came within `:measure` seconds (or in a row) and
# at least `:measure_floor` ago and at least `:min_accepted` were, else those sent in the last `:measure` seconds, a
# second since the first was sent (in a row, from as few as one); with no pace or rate, that alone, or no pace: the
# pause alone; for a slow-down in a row, the pace now, else the rate, else what it accepted, measured so), never
# below `:min_pace`, nor, in a row or for a first pace not measured from the refusal, below `:recent_share` of what
# the provider accepted (ended) in the last `:recent` seconds, a second since the first ended, over at least
# `:recent_span`; and the claim's token bucket is emptied. A slow-down that pauses the destination sets
# `slowed_at` and empties the send bucket: the turns given before it are void (an attempt that waited for one reads
# `slowed_at` and takes another). The pause is the provider's wait, or else one token of the pace, at least
# `:min_pause` (no pace: `:base` seconds), doubling with each slow-down in a row (one after the last pause ended,
# within twice its length, with nothing accepted since), at most `:cap`. An operator's pause stays the operator's.
SLOW_DOWN = text(f"""
WITH found AS MATERIALIZED (
    SELECT d.*, coalesce(d.paused_until > now(), false) AS paused,
           d.paused_until IS NOT NULL AND now() < d.paused_until + 2 * l.pause_was
               AND NOT EXISTS (SELECT FROM agent_action AS a WHERE a.ended_at > d.paused_until
                                  AND a.destination = d.name AND a.state = 'DONE') AS in_a_row,
           l.pause_was, {_PACE_NOW.format(t="d")} AS pace_now
      FROM agent_destination AS d
     CROSS JOIN LATERAL (
         SELECT make_interval(secs => least(:cap, :base * 2 ^ least(greatest(d.slow_downs - 1, 0), 30))) AS pause_was
     ) AS l
     WHERE d.name = :name FOR UPDATE OF d
), again AS MATERIALIZED (
    SELECT f.*, f.in_a_row AND NOT f.paused AS again, f.pace_now IS NULL AS first_pace,
           coalesce(f.slowed_at > now() - make_interval(secs => :measure) OR f.in_a_row, false) AS from_refusal
      FROM found AS f
), since AS MATERIALIZED (
    SELECT g.*, now() - make_interval(secs => :measure) AS measured_since,
           now() - make_interval(secs => :recent) AS recent_since,
           least(now() - make_interval(secs => greatest(:measure, :recent)),
                 CASE WHEN g.from_refusal THEN g.slowed_at END) AS read_since
      FROM again AS g
), accepted AS MATERIALIZED (
    SELECT count(*) FILTER (WHERE a.ended_at > g.recent_since) AS recent,
           min(a.ended_at) FILTER (WHERE a.ended_at > g.recent_since) AS first_recent,
           count(*) FILTER (WHERE a.ended_at > g.measured_since) AS n,
           min(a.ended_at) FILTER (WHERE a.ended_at > g.measured_since) AS first_ended,
           count(*) FILTER (WHERE a.write_started_at > g.measured_since) AS sent,
           min(a.write_started_at) FILTER (WHERE a.write_started_at > g.measured_since) AS first_sent,
           count(*) FILTER (WHERE g.from_refusal AND a.write_started_at > g.slowed_at) AS sent_since_refusal
      FROM agent_action AS a, since AS g
     WHERE a.ended_at > g.read_since AND a.destination = :name AND a.state = 'DONE'
), measured AS MATERIALIZED (
    SELECT g.*,
           CASE WHEN g.paused THEN g.slow_downs WHEN g.in_a_row THEN g.slow_downs + 1 ELSE 1 END AS streak,
           (SELECT CASE WHEN NOT g.first_pace
                        THEN CASE WHEN a.n >= :min_accepted
                                  THEN a.n / greatest(:measure_floor, extract(epoch FROM now() - a.first_ended)) END
                        ELSE coalesce(
                            CASE WHEN a.sent_since_refusal >= :min_accepted
                                      AND now() - g.slowed_at >= make_interval(secs => :measure_floor)
                                 THEN a.sent_since_refusal / extract(epoch FROM now() - g.slowed_at) END,
                            CASE WHEN a.sent >= CASE WHEN g.again THEN 1 ELSE :min_accepted END
                                 THEN a.sent / greatest(:measure_floor, extract(epoch FROM now() - a.first_sent)) END)
                   END
              FROM accepted AS a) AS accepted_pace,
           (SELECT coalesce(a.sent_since_refusal >= :min_accepted
                            AND now() - g.slowed_at >= make_interval(secs => :measure_floor), false)
              FROM accepted AS a) AS since_refusal,
           (SELECT :recent_share * a.recent / greatest(:recent_span, extract(epoch FROM now() - a.first_recent))
              FROM accepted AS a WHERE a.recent > 0) AS recent_floor
      FROM since AS g
), lowered AS MATERIALIZED (
    SELECT m.*, CASE WHEN m.again THEN coalesce(m.pace_now, m.rate, m.accepted_pace)
                     ELSE least(coalesce(m.pace_now, m.rate), m.accepted_pace) END AS pace_was,
           NOT m.paused AND coalesce(m.pace_now, m.rate, m.accepted_pace) IS NOT NULL
               AND (m.pace IS NULL OR now() - m.pace_at >= make_interval(secs => greatest(:settle, 2 / m.pace)))
           AS lowers
      FROM measured AS m
), counted AS MATERIALIZED (
    SELECT l.*, CASE WHEN l.lowers
                     THEN greatest(:min_pace, :decrease * l.pace_was,
                                   CASE WHEN l.again OR (l.first_pace AND NOT l.since_refusal) THEN l.recent_floor END)
                     ELSE l.pace_now END AS pace_then
      FROM lowered AS l
)
UPDATE agent_destination AS d
   SET slow_downs = c.streak,
       paused_until = CASE
           WHEN c.paused AND CAST(:after AS float8) IS NULL THEN d.paused_until
           ELSE greatest(d.paused_until, now() + make_interval(secs => coalesce(
               CAST(:after AS float8),
               least(:cap, greatest(:min_pause, coalesce(1 / c.pace_then, :base)) * 2 ^ least(c.streak - 1, 30))))) END,
       paused_by = CASE WHEN c.paused AND d.paused_by = 'operator' THEN 'operator' ELSE 'provider' END,
       pause_reason = CASE WHEN c.paused AND d.paused_by = 'operator' THEN d.pause_reason
                           ELSE left(:reason, 500) END,
       slowed_at = CASE WHEN c.paused THEN d.slowed_at ELSE now() END,
       pace = CASE WHEN c.lowers THEN c.pace_then ELSE d.pace END,
       pace_at = CASE WHEN c.lowers THEN now() ELSE d.pace_at END,
       tokens = CASE WHEN c.lowers THEN 0 ELSE d.tokens END,
       tokens_at = CASE WHEN c.lowers THEN now() ELSE d.tokens_at END,
       send_tokens = CASE WHEN c.paused THEN d.send_tokens ELSE 0 END,
       send_tokens_at = CASE WHEN c.paused THEN d.send_tokens_at ELSE now() END,
       updated_at = now()
  FROM counted AS c
 WHERE d.name = c.name
RETURNING {_SECONDS_UNTIL.format(t="d.paused_until")}::float8 AS pause_seconds, d.pace, NOT c.paused AS newly_paused
""")

# The channel on which a slow-down that paused a destination tells every listening executor (payload: the
# destination's kind and name, a space between): they hold it at once instead of at their next sweep, so the
# attempts they have in flight ask for their turns, which wait for the pause
PAUSED_CHANNEL = "outbox_destination_paused"
NOTIFY_PAUSED = text(f"SELECT pg_notify('{PAUSED_CHANNEL}', :kind || ' ' || :name) IS NULL AS sent")

# An attempt that failed, or a slow-down that paused it, of a destination not known broken (its row made first by
# ADD_DESTINATION): one more failure in its run (`failing_since`: the run's start, kept; `failures`: its count). When
# the run has lasted `:window` seconds with at least `:min_failures`, the provider's record is read once
# (ix_agent_action_ended, newest first): an attempt it accepted since the run began restarts the run from that
# acceptance (this failure counted); none: the destination is broken, its first probe `:probe_seconds` later. Judged so
# from the row, a dead receiver is broken whichever executor saw its attempts and however far apart they came (heads
# that timed out, then waited their retries). `newly`: this call broke it; `broken`: it is.
NOTE_FAILURE = text("""
WITH locked AS MATERIALIZED (
    SELECT name, failing_since, failures, broken_since FROM agent_destination WHERE name = :name FOR UPDATE
), run AS MATERIALIZED (
    SELECT l.*, coalesce(l.failing_since, now()) AS since,
           CASE WHEN l.failing_since IS NULL THEN 0 ELSE l.failures END + 1 AS counted
      FROM locked AS l
), judged AS MATERIALIZED (
    SELECT r.*, r.broken_since IS NULL AND r.counted >= :min_failures
                AND r.since <= now() - make_interval(secs => :window) AS due_for_judgement
      FROM run AS r
), accepted AS MATERIALIZED (
    SELECT j.*, CASE WHEN j.due_for_judgement THEN (
               SELECT a.ended_at FROM agent_action AS a
                WHERE a.ended_at > j.since AND a.destination = j.name AND a.state = 'DONE'
                ORDER BY a.ended_at DESC LIMIT 1) END AS last_accepted
      FROM judged AS j
), decided AS MATERIALIZED (
    SELECT a.*, a.due_for_judgement AND a.last_accepted IS NULL AS breaks FROM accepted AS a
)
UPDATE agent_destination AS d
   SET failing_since = coalesce(c.last_accepted, c.since),
       failures = CASE WHEN c.last_accepted IS NOT NULL THEN 1 ELSE c.counted END,
       broken_since = CASE WHEN c.breaks THEN now() ELSE d.broken_since END,
       probe_at = CASE WHEN c.breaks THEN now() + make_interval(secs => :probe_seconds) ELSE d.probe_at END,
       updated_at = CASE WHEN c.breaks THEN now() ELSE d.updated_at END
  FROM decided AS c
 WHERE d.name = c.name
RETURNING c.breaks AS newly, d.broken_since IS NOT NULL AS broken, d.failures,
          extract(epoch FROM now() - d.failing_since)::float8 AS failing_seconds
""")

# The provider refused the destination's credentials (its row made first by ADD_DESTINATION): broken from now, if it
# was not, its next probe `:probe_seconds` from now (a probe refused again pushes it so), and the reason kept.
# `newly`: the credentials were not known refused before.
REFUSE_CREDENTIALS = text("""
UPDATE agent_destination AS d
   SET credentials_refused_at = coalesce(d.credentials_refused_at, now()), credentials_reason = left(:reason, 500),
       broken_since = coalesce(d.broken_since, now()), probe_at = now() + make_interval(secs => :probe_seconds),
       updated_at = now()
  FROM (SELECT credentials_refused_at IS NULL AS newly FROM agent_destination WHERE name = :name FOR UPDATE) AS o
 WHERE d.name = :name
RETURNING o.newly
""")

# An attempt succeeded (a probe, or any attempt that was in flight): the destination is no longer broken, its
# run of failures is over, and its credentials are no longer known refused.
MEND = text("""
UPDATE agent_destination
   SET broken_since = NULL, probe_at = NULL, failing_since = NULL, failures = 0, credentials_refused_at = NULL,
       credentials_reason = NULL, updated_at = now()
 WHERE name = :name AND broken_since IS NOT NULL
RETURNING name
""")

# ---- the operator's ------------------------------------------------------------------------------

PAUSE = text("""
UPDATE agent_destination
   SET paused_until = CASE WHEN CAST(:seconds AS float8) IS NULL THEN 'infinity'
                           ELSE now() + make_interval(secs => :seconds) END,
       paused_by = 'operator', pause_reason = left(:reason, 500), updated_at = now()
 WHERE name = :name
RETURNING name
""")

# An operator's resume: open again, paused by nobody, not broken (its run of failures and refused credentials
# forgotten: its next attempt tries them again), the learned pace forgotten (a configured rate stays)
RESUME = text("""
UPDATE agent_destination
   SET paused_until = NULL, paused_by = NULL, pause_reason = NULL, slow_downs = 0, broken_since = NULL,
       probe_at = NULL, failing_since = NULL, failures = 0, pace = NULL, pace_at = NULL, slowed_at = NULL,
       credentials_refused_at = NULL, credentials_reason = NULL, updated_at = now()
 WHERE name = :name
RETURNING name
""")

# `outbox.testing.drain`, before each round: every pause a provider asked for over, every learned pace
# forgotten (an operator's pause and a configured rate stay)
END_PROVIDER_PAUSES = text("""
UPDATE agent_destination
   SET paused_until = CASE WHEN paused_by = 'provider' THEN NULL ELSE paused_until END,
       paused_by = CASE WHEN paused_by = 'provider' THEN NULL ELSE paused_by END,
       pace = NULL, pace_at = NULL, slowed_at = NULL, slow_downs = 0
 WHERE paused_by = 'provider' OR pace IS NOT NULL
""")
