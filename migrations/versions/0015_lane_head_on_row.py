"""A lane's holder is marked on its own row: no lane table, one trigger pass per statement.

    enqueue (INSERT):   the guard marks the new action `lane_head` when its lane has no unended action (one
                        probe of ux_agent_action_lane_head); nothing else is written for a lane of one action.
                        Behind a holder, it locks the holder's row (FOR KEY SHARE) until the enqueue commits
    claim:              due holders from ix_agent_action_ready (ADMITTED, lane_head), by due time, SKIP LOCKED;
                        the holder stays marked while it executes, so a claim changes no other row
    result (UPDATE) ─▶ after_agent_action_update, once per statement over the transition tables:
                        the ended tally, and for the lanes whose holder ended (or was retried while an
                        earlier action had not started) the next holder, in a snapshot taken after the end
                        had its row lock
    erasure (DELETE) ─▶ after_agent_action_delete, for each deleted holder only: its lane's next holder; the
                        retention purge (ended rows) enters no trigger function and keeps no transition table

- `agent_action.lane_head`: true on the one action that holds its lane, the executing one or else the oldest
  that has not started; false on every other and on every ended action. `ux_agent_action_lane_head` makes
  two holders of one lane impossible, whatever the isolation level of the writer.
- `agent_lane` goes, and with it three writes per action alone in its lane (its lane row made, updated at the
  claim, deleted at the end) and the functions that kept it.
- No lock beyond rows: an enqueue behind a holder holds the holder's row FOR KEY SHARE until it commits, and
  every end of a holder takes its row FOR UPDATE (a DELETE does; the executor's statements say so; the guard
  does it for any other writer), so the end waits for the enqueue and then sees the new action. A claim and a
  fence (FOR NO KEY UPDATE) never wait for an enqueue. Two enqueues into an empty lane both find no holder;
  `ux_agent_action_lane_head` lets one in, and the other (an INSERT ... ON CONFLICT DO NOTHING) inserts nothing
  and enqueues again behind it.
- `tally_agent_action_ended` and the lane upkeep run in one function, `after_agent_action_update`: one pass
  over the transition tables per statement, which finds the rows whose state moved.

The holders are marked from the rule itself (the executing action of each lane, or else its oldest one not
started), then the indexes are built; the revision holds writes to `agent_action` while it reads the table.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# The guard as revision 0012 left it, plus: a new action's lane holder mark (INSERT), cleared on an end.
GUARD = r"""
CREATE OR REPLACE FUNCTION guard_agent_action() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- the kind's row (agent_action_kind), read once on INSERT
    may_run_alone boolean;
    may_run_in_workspace boolean;
    ended CONSTANT text[] := ARRAY['DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'];
    is_claim boolean;
    holder_id bigint;
    holder_state text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'agent_action: a new action is PROPOSED or ADMITTED, not %', NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.attempt <> 0 OR NEW.epoch <> 0 OR NEW.lease_expires_at IS NOT NULL
           OR NEW.write_started_at IS NOT NULL THEN
            RAISE EXCEPTION 'agent_action: a new action has no attempt, epoch, lease or write'
                USING ERRCODE = 'check_violation';
        END IF;
        -- where the kind may run; a kind without a row finds none here, and fk_agent_action_kind refuses it
        SELECT k.instance_level, k.workspace_level INTO may_run_alone, may_run_in_workspace
          FROM agent_action_kind AS k WHERE k.name = NEW.kind;
        IF NEW.workspace_id IS NULL AND NOT may_run_alone THEN
            RAISE EXCEPTION 'agent_action: % is not instance level (agent_action_kind.instance_level): it needs a workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.workspace_id IS NOT NULL AND NOT may_run_in_workspace THEN
            RAISE EXCEPTION 'agent_action: % is not workspace level (agent_action_kind.workspace_level): it takes no workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;

        -- The lane's holder (a new snapshot: every holder committed so far, and the rows this statement inserted
        -- before this one), locked until this transaction ends: its end waits for us, then sees this action.
        -- No holder: this action holds the lane; ux_agent_action_lane_head refuses a second one that an
        -- enqueue into the same lane, not committed yet, marked meanwhile.
        NEW.lane_head := false;
        SELECT h.id, h.state INTO holder_id, holder_state
          FROM agent_action AS h WHERE h.lane_key = NEW.lane_key AND h.lane_head
           FOR KEY SHARE;
        IF NOT FOUND THEN
            NEW.lane_head := true;
        ELSIF holder_state <> 'EXECUTING' AND holder_id > NEW.id
              AND NOT EXISTS (SELECT 1 FROM agent_action AS d WHERE d.idempotency_key = NEW.idempotency_key) THEN
            -- an earlier action (its transaction took its id first, and committed later) holds the lane
            -- before a later one that has not started; a repeated key inserts nothing, so it takes nothing
            UPDATE agent_action SET lane_head = false
             WHERE id = holder_id AND lane_head AND state IN ('PROPOSED', 'ADMITTED');
            NEW.lane_head := FOUND;
        END IF;
        -- a lane that may start now wakes the idle executors when this transaction commits
        IF NEW.lane_head AND NEW.state = 'ADMITTED' AND NEW.due_at <= now() THEN
            PERFORM pg_notify('outbox_action', '');
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.state = ANY (ended) THEN
        RAISE EXCEPTION 'agent_action %: an ended action (%) never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.id <> OLD.id OR NEW.kind <> OLD.kind OR NEW.lane_key <> OLD.lane_key
       OR NEW.idempotency_key <> OLD.idempotency_key THEN
        RAISE EXCEPTION 'agent_action %: id, kind, lane_key and idempotency_key never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- A claim moves an action to EXECUTING, or takes an EXECUTING one again: the epoch rises.
    is_claim := NEW.state = 'EXECUTING' AND (OLD.state <> 'EXECUTING' OR NEW.epoch <> OLD.epoch);

    IF NEW.state <> OLD.state OR NEW.epoch <> OLD.epoch THEN
        IF NOT (
            (OLD.state = 'PROPOSED' AND NEW.state IN ('ADMITTED', 'CANCELLED'))
            OR (OLD.state = 'ADMITTED' AND NEW.state IN ('EXECUTING', 'CANCELLED'))
            OR (OLD.state = 'EXECUTING' AND NEW.state IN
                ('EXECUTING', 'ADMITTED', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
        ) OR (NEW.epoch <> OLD.epoch AND NOT is_claim) THEN
            RAISE EXCEPTION 'agent_action %: % -> % is not an allowed transition', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF is_claim THEN
        IF NEW.epoch <> OLD.epoch + 1 OR NEW.attempt <> OLD.attempt + 1 THEN
            RAISE EXCEPTION 'agent_action %: a claim raises epoch and attempt by exactly one', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        -- an at-most-once kind is never reclaimed after its write started: nothing can tell whether the
        -- earlier attempt reached the provider. The kind's row is read here only, after a write started.
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL THEN
            IF (SELECT k.at_most_once FROM agent_action_kind AS k WHERE k.name = OLD.kind) THEN
                RAISE EXCEPTION 'agent_action %: % is at most once and its write started; it is never claimed again',
                    OLD.id, OLD.kind USING ERRCODE = 'check_violation';
            END IF;
        END IF;
        IF NEW.lease_expires_at IS NULL THEN
            RAISE EXCEPTION 'agent_action %: a claim sets the lease', OLD.id USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF NOT is_claim AND NEW.attempt <> OLD.attempt
       AND NOT (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED' AND NEW.attempt = OLD.attempt - 1) THEN
        RAISE EXCEPTION 'agent_action %: attempt rises by exactly one with a claim, and falls by one only when an attempt that does not count goes back',
            OLD.id USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.state = ANY (ended) THEN
        IF NEW.stop_reason IS NULL THEN
            RAISE EXCEPTION 'agent_action %: ending as % needs a stop_reason', OLD.id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.lane_head THEN
            -- the holder's end waits for the enqueues behind it that have not committed (they hold its row
            -- FOR KEY SHARE), so the next holder is chosen among them too
            PERFORM 1 FROM agent_action WHERE id = OLD.id FOR UPDATE;
        END IF;
        NEW.ended_at := now();
        NEW.payload := NULL;
        NEW.lease_expires_at := NULL;
        NEW.lane_head := false;
    ELSIF NEW.state <> 'EXECUTING' THEN
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END
$$;
"""

# The executor's own moves pass in the WHEN condition, as in revision 0012; an end also clears lane_head.
GUARD_TRIGGER = r"""
DROP TRIGGER guard_agent_action ON agent_action;
CREATE TRIGGER guard_agent_action BEFORE UPDATE ON agent_action
    FOR EACH ROW WHEN ((
        NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.lane_key = OLD.lane_key
        AND NEW.idempotency_key = OLD.idempotency_key
        AND (
            (NEW.state = 'EXECUTING'
             AND (OLD.state = 'ADMITTED' OR (OLD.state = 'EXECUTING' AND OLD.write_started_at IS NULL))
             AND NEW.epoch = OLD.epoch + 1 AND NEW.attempt = OLD.attempt + 1 AND NEW.lease_expires_at IS NOT NULL)
            OR (NEW.state = OLD.state AND OLD.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
                AND NEW.epoch = OLD.epoch AND NEW.attempt = OLD.attempt
                AND (NEW.state = 'EXECUTING' OR NEW.lease_expires_at IS NULL))
            OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED' AND NEW.epoch = OLD.epoch
                AND NEW.attempt IN (OLD.attempt, OLD.attempt - 1) AND NEW.lease_expires_at IS NULL)
            OR (OLD.state = 'EXECUTING' AND NEW.state IN ('DONE', 'FAILED', 'UNCERTAIN', 'CANCELLED')
                AND NEW.epoch = OLD.epoch AND NEW.attempt = OLD.attempt AND NEW.stop_reason IS NOT NULL
                AND NEW.ended_at = now() AND NEW.payload IS NULL AND NEW.lease_expires_at IS NULL
                AND NOT NEW.lane_head)
        )
    ) IS NOT TRUE)
    EXECUTE FUNCTION guard_agent_action();
"""

LANE_UPKEEP = r"""
-- The lanes given get their holder from the rule: the executing action, or else the oldest one not started.
-- Each round reads in a new snapshot; a row that changed before we could mark it (cancelled, deleted) is
-- left, and the next round chooses again.
CREATE FUNCTION hold_agent_lanes(lanes text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    holders bigint[];
    unmarked bigint[];
    marked integer;
    wake boolean := false;
    woken boolean;
BEGIN
    LOOP
        -- the executing action from ux_agent_action_lane_executing, the oldest waiting one from
        -- ix_agent_action_lane_pending: one probe each, however many actions wait
        WITH wanted AS MATERIALIZED (
            SELECT coalesce(x.id, p.id) AS id, coalesce(x.lane_head, p.lane_head) AS lane_head
              FROM unnest(lanes) AS k (lane_key)
              LEFT JOIN LATERAL (
                SELECT e.id, e.lane_head FROM agent_action AS e
                 WHERE e.lane_key = k.lane_key AND e.state = 'EXECUTING'
              ) AS x ON true
              LEFT JOIN LATERAL (
                SELECT w.id, w.lane_head FROM agent_action AS w
                 WHERE w.lane_key = k.lane_key AND w.state IN ('PROPOSED', 'ADMITTED')
                 ORDER BY w.id LIMIT 1
              ) AS p ON true
        )
        SELECT coalesce(array_agg(id) FILTER (WHERE id IS NOT NULL), '{}'),
               coalesce(array_agg(id) FILTER (WHERE id IS NOT NULL AND NOT lane_head), '{}')
          INTO holders, unmarked
          FROM wanted;
        EXIT WHEN cardinality(unmarked) = 0;
        -- a holder that is no longer the rule's (a retried one, behind an earlier action not started) lets go
        UPDATE agent_action SET lane_head = false
         WHERE lane_key = ANY (lanes) AND lane_head AND NOT (id = ANY (holders));
        WITH now_held AS (
            UPDATE agent_action SET lane_head = true
             WHERE id = ANY (unmarked) AND NOT lane_head AND state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
            RETURNING state, due_at
        )
        SELECT count(*), coalesce(bool_or(state = 'ADMITTED' AND due_at <= now()), false) INTO marked, woken
          FROM now_held;
        wake := wake OR woken;
        EXIT WHEN marked = cardinality(unmarked);
    END LOOP;
    -- a lane whose next action may start now wakes the idle executors when this transaction commits
    IF wake THEN
        PERFORM pg_notify('outbox_action', '');
    END IF;
END
$$;

-- Once per UPDATE statement: the ended tally, and the lanes whose holder ended, or went back to
-- wait (it may hold the lane no longer: an earlier action that had not started takes it).
CREATE FUNCTION after_agent_action_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    lanes text[];
BEGIN
    WITH moved AS MATERIALIZED (
        SELECT n.kind, n.state, n.stop_reason, n.lane_key, o.lane_head AS held, n.lane_head AS holds,
               o.state AS was
          FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
         WHERE n.state <> o.state
    ), tallied AS (
        INSERT INTO agent_action_ended_tally (kind, state, reason, n)
        SELECT kind, state, stop_reason, count(*) FROM moved
         WHERE state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
         GROUP BY kind, state, stop_reason
    )
    SELECT array_agg(DISTINCT lane_key) FILTER (WHERE (held AND NOT holds) OR (was = 'EXECUTING' AND state = 'ADMITTED'))
      INTO lanes FROM moved;
    IF lanes IS NOT NULL THEN
        PERFORM hold_agent_lanes(lanes);
    END IF;
    RETURN NULL;
END
$$;

-- For each deleted holder only (the trigger's WHEN condition): the retention purge deletes ended rows, which
-- hold no lane, so it enters no function and keeps no transition table.
CREATE FUNCTION after_agent_action_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM hold_agent_lanes(ARRAY[OLD.lane_key]);
    RETURN NULL;
END
$$;
"""

UPGRADE = rf"""
DROP TRIGGER track_agent_lane_insert ON agent_action;
DROP TRIGGER track_agent_lane_update ON agent_action;
DROP TRIGGER track_agent_lane_delete ON agent_action;
DROP TRIGGER tally_agent_action_ended ON agent_action;
DROP FUNCTION track_agent_lane();
DROP FUNCTION refresh_agent_lanes(text[]);
DROP FUNCTION tally_agent_action_ended();
DROP TABLE agent_lane;

ALTER TABLE agent_action ADD COLUMN lane_head boolean NOT NULL DEFAULT false;
UPDATE agent_action SET lane_head = true
 WHERE id IN (SELECT DISTINCT ON (lane_key) id FROM agent_action
               WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
               ORDER BY lane_key, state = 'EXECUTING' DESC, id);
CREATE UNIQUE INDEX ux_agent_action_lane_head ON agent_action (lane_key) WHERE lane_head;
CREATE INDEX ix_agent_action_ready ON agent_action (due_at) WHERE lane_head AND state = 'ADMITTED';

{GUARD}
{GUARD_TRIGGER}
{LANE_UPKEEP}
CREATE TRIGGER after_agent_action_update AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION after_agent_action_update();
CREATE TRIGGER after_agent_action_delete AFTER DELETE ON agent_action
    FOR EACH ROW WHEN (OLD.lane_head) EXECUTE FUNCTION after_agent_action_delete();
GRANT SELECT (lane_head) ON agent_action TO outbox_reader;
"""

# Revision 0014's lane table, its functions and triggers, and the guard as revision 0012 left it.
DOWNGRADE = r"""
DROP TRIGGER after_agent_action_update ON agent_action;
DROP TRIGGER after_agent_action_delete ON agent_action;
DROP FUNCTION after_agent_action_update();
DROP FUNCTION after_agent_action_delete();
DROP FUNCTION hold_agent_lanes(text[]);

CREATE TABLE agent_lane (
    lane_key  text PRIMARY KEY,
    head_id   bigint,
    executing boolean NOT NULL DEFAULT false,
    ready_at  timestamptz
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02);
CREATE INDEX ix_agent_lane_ready ON agent_lane (ready_at) WHERE ready_at IS NOT NULL;
INSERT INTO agent_lane (lane_key, head_id, executing, ready_at)
SELECT k.lane_key, h.id, e.lane_key IS NOT NULL,
       CASE WHEN h.state = 'ADMITTED' AND e.lane_key IS NULL THEN h.due_at END
  FROM (SELECT DISTINCT lane_key FROM agent_action WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')) AS k
  LEFT JOIN LATERAL (
    SELECT p.id, p.state, p.due_at FROM agent_action AS p
     WHERE p.lane_key = k.lane_key AND p.state IN ('PROPOSED', 'ADMITTED') ORDER BY p.id LIMIT 1
  ) AS h ON true
  LEFT JOIN LATERAL (
    SELECT x.lane_key FROM agent_action AS x WHERE x.lane_key = k.lane_key AND x.state = 'EXECUTING'
  ) AS e ON true;
GRANT SELECT ON agent_lane TO outbox_reader;

CREATE OR REPLACE FUNCTION guard_agent_action() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- the kind's row (agent_action_kind), read once on INSERT
    may_run_alone boolean;
    may_run_in_workspace boolean;
    ended CONSTANT text[] := ARRAY['DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'];
    is_claim boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'agent_action: a new action is PROPOSED or ADMITTED, not %', NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.attempt <> 0 OR NEW.epoch <> 0 OR NEW.lease_expires_at IS NOT NULL
           OR NEW.write_started_at IS NOT NULL THEN
            RAISE EXCEPTION 'agent_action: a new action has no attempt, epoch, lease or write'
                USING ERRCODE = 'check_violation';
        END IF;
        -- where the kind may run; a kind without a row finds none here, and fk_agent_action_kind refuses it
        SELECT k.instance_level, k.workspace_level INTO may_run_alone, may_run_in_workspace
          FROM agent_action_kind AS k WHERE k.name = NEW.kind;
        IF NEW.workspace_id IS NULL AND NOT may_run_alone THEN
            RAISE EXCEPTION 'agent_action: % is not instance level (agent_action_kind.instance_level): it needs a workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.workspace_id IS NOT NULL AND NOT may_run_in_workspace THEN
            RAISE EXCEPTION 'agent_action: % is not workspace level (agent_action_kind.workspace_level): it takes no workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.state = ANY (ended) THEN
        RAISE EXCEPTION 'agent_action %: an ended action (%) never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.id <> OLD.id OR NEW.kind <> OLD.kind OR NEW.lane_key <> OLD.lane_key
       OR NEW.idempotency_key <> OLD.idempotency_key THEN
        RAISE EXCEPTION 'agent_action %: id, kind, lane_key and idempotency_key never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- A claim moves an action to EXECUTING, or takes an EXECUTING one again: the epoch rises.
    is_claim := NEW.state = 'EXECUTING' AND (OLD.state <> 'EXECUTING' OR NEW.epoch <> OLD.epoch);

    IF NEW.state <> OLD.state OR NEW.epoch <> OLD.epoch THEN
        IF NOT (
            (OLD.state = 'PROPOSED' AND NEW.state IN ('ADMITTED', 'CANCELLED'))
            OR (OLD.state = 'ADMITTED' AND NEW.state IN ('EXECUTING', 'CANCELLED'))
            OR (OLD.state = 'EXECUTING' AND NEW.state IN
                ('EXECUTING', 'ADMITTED', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
        ) OR (NEW.epoch <> OLD.epoch AND NOT is_claim) THEN
            RAISE EXCEPTION 'agent_action %: % -> % is not an allowed transition', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF is_claim THEN
        IF NEW.epoch <> OLD.epoch + 1 OR NEW.attempt <> OLD.attempt + 1 THEN
            RAISE EXCEPTION 'agent_action %: a claim raises epoch and attempt by exactly one', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        -- an at-most-once kind is never reclaimed after its write started: nothing can tell whether the
        -- earlier attempt reached the provider. The kind's row is read here only, after a write started.
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL THEN
            IF (SELECT k.at_most_once FROM agent_action_kind AS k WHERE k.name = OLD.kind) THEN
                RAISE EXCEPTION 'agent_action %: % is at most once and its write started; it is never claimed again',
                    OLD.id, OLD.kind USING ERRCODE = 'check_violation';
            END IF;
        END IF;
        IF NEW.lease_expires_at IS NULL THEN
            RAISE EXCEPTION 'agent_action %: a claim sets the lease', OLD.id USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF NOT is_claim AND NEW.attempt <> OLD.attempt
       AND NOT (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED' AND NEW.attempt = OLD.attempt - 1) THEN
        RAISE EXCEPTION 'agent_action %: attempt rises by exactly one with a claim, and falls by one only when an attempt that does not count goes back',
            OLD.id USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.state = ANY (ended) THEN
        IF NEW.stop_reason IS NULL THEN
            RAISE EXCEPTION 'agent_action %: ending as % needs a stop_reason', OLD.id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.ended_at := now();
        NEW.payload := NULL;
        NEW.lease_expires_at := NULL;
    ELSIF NEW.state <> 'EXECUTING' THEN
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION refresh_agent_lanes(lanes text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    locked integer;
    wake boolean;
BEGIN
    LOOP
        INSERT INTO agent_lane (lane_key) SELECT k FROM unnest(lanes) AS k ORDER BY k
            ON CONFLICT (lane_key) DO NOTHING;
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM agent_lane WHERE lane_key = ANY (lanes) ORDER BY lane_key FOR UPDATE
        ) AS held;
        -- a lane row deleted by a transaction that committed meanwhile: insert it again
        EXIT WHEN locked = cardinality(lanes);
    END LOOP;

    -- a new statement, so a new snapshot: it sees every change committed before we got the locks
    WITH found AS MATERIALIZED (
        SELECT k.lane_key, h.id AS head_id, e.lane_key IS NOT NULL AS executing,
               CASE WHEN h.state = 'ADMITTED' AND e.lane_key IS NULL THEN h.due_at END AS ready_at
          FROM unnest(lanes) AS k (lane_key)
          LEFT JOIN LATERAL (
            SELECT p.id, p.state, p.due_at FROM agent_action AS p
             WHERE p.lane_key = k.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
             ORDER BY p.id LIMIT 1
          ) AS h ON true
          LEFT JOIN LATERAL (
            SELECT x.lane_key FROM agent_action AS x
             WHERE x.lane_key = k.lane_key AND x.state = 'EXECUTING'
             LIMIT 1
          ) AS e ON true
    ), emptied AS (
        DELETE FROM agent_lane AS l USING found AS f
         WHERE l.lane_key = f.lane_key AND f.head_id IS NULL AND NOT f.executing
    ), changed AS (
        UPDATE agent_lane AS l SET head_id = f.head_id, executing = f.executing, ready_at = f.ready_at
          FROM found AS f
         WHERE l.lane_key = f.lane_key AND (f.head_id IS NOT NULL OR f.executing)
           AND (l.head_id, l.executing, l.ready_at) IS DISTINCT FROM (f.head_id, f.executing, f.ready_at)
    )
    SELECT coalesce(bool_or(ready_at <= now()), false) INTO wake FROM found;

    -- a lane that may start now wakes the idle executors when this transaction commits, whoever made
    -- it ready: an enqueue, an admission, the end of its previous action, a refusal or an erasure
    IF wake THEN
        PERFORM pg_notify('outbox_action', '');
    END IF;
END
$$;

CREATE FUNCTION tally_agent_action_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_action_ended_tally (kind, state, reason, n)
    SELECT n.kind, n.state, n.stop_reason, count(*)
      FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
     WHERE n.ended_at IS NOT NULL AND o.ended_at IS NULL
     GROUP BY n.kind, n.state, n.stop_reason;
    RETURN NULL;
END
$$;

CREATE FUNCTION track_agent_lane() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    lanes text[];
    claimed text[];
    ended text[];
    wake boolean := false;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- as revision 0009: a lane with no row gets one made from the new actions alone
        WITH firsts AS MATERIALIZED (
            SELECT DISTINCT ON (lane_key) lane_key, id, state, due_at FROM new_rows ORDER BY lane_key, id
        ), made AS (
            INSERT INTO agent_lane (lane_key, head_id, executing, ready_at)
            SELECT lane_key, id, false, CASE WHEN state = 'ADMITTED' THEN due_at END FROM firsts ORDER BY lane_key
            ON CONFLICT (lane_key) DO NOTHING
            RETURNING lane_key, ready_at
        )
        SELECT array_agg(f.lane_key) FILTER (WHERE m.lane_key IS NULL),
               coalesce(bool_or(m.ready_at <= now()), false)
          INTO lanes, wake
          FROM firsts AS f LEFT JOIN made AS m ON m.lane_key = f.lane_key;
        IF wake THEN
            PERFORM pg_notify('outbox_action', '');
        END IF;
    ELSIF TG_OP = 'UPDATE' THEN
        -- each lane's moves in this statement: a lane with exactly one, a claim or an end, is updated from
        -- that move; every other lane is recomputed
        WITH moved AS MATERIALIZED (
            SELECT n.lane_key,
                   CASE WHEN o.state = 'ADMITTED' AND n.state = 'EXECUTING' THEN 'claim'
                        WHEN o.state = 'EXECUTING' AND n.state IN ('DONE', 'FAILED', 'UNCERTAIN', 'CANCELLED')
                            THEN 'end'
                        ELSE 'other' END AS move,
                   count(*) OVER (PARTITION BY n.lane_key) AS moves
              FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
             WHERE n.state <> o.state OR n.due_at <> o.due_at
        )
        SELECT array_agg(lane_key ORDER BY lane_key) FILTER (WHERE moves = 1 AND move = 'claim'),
               array_agg(lane_key ORDER BY lane_key) FILTER (WHERE moves = 1 AND move = 'end'),
               array_agg(DISTINCT lane_key) FILTER (WHERE moves > 1 OR move = 'other')
          INTO claimed, ended, lanes
          FROM moved;

        -- a claim: an action of the lane executes now, and the head is the next action not started. The lane
        -- row exists (the lane has an action not ended): the lock first, then the head in a new snapshot that
        -- sees every change committed before the lock, as refresh_agent_lanes does
        IF claimed IS NOT NULL THEN
            PERFORM 1 FROM agent_lane WHERE lane_key = ANY (claimed) ORDER BY lane_key FOR UPDATE;
            UPDATE agent_lane AS l
               SET executing = true, ready_at = NULL,
                   head_id = (SELECT p.id FROM agent_action AS p
                               WHERE p.lane_key = l.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
                               ORDER BY p.id LIMIT 1)
             WHERE l.lane_key = ANY (claimed);
        END IF;

        -- an end: nothing of the lane executes any more (one executing action per lane at most); the head is
        -- unchanged, ready at its due time if it is ADMITTED; a lane with no head has nothing left
        IF ended IS NOT NULL THEN
            PERFORM 1 FROM agent_lane WHERE lane_key = ANY (ended) ORDER BY lane_key FOR UPDATE;
            WITH emptied AS (
                DELETE FROM agent_lane WHERE lane_key = ANY (ended) AND head_id IS NULL
            ), waiting AS (
                UPDATE agent_lane AS l
                   SET executing = false,
                       ready_at = (SELECT CASE WHEN h.state = 'ADMITTED' THEN h.due_at END
                                     FROM agent_action AS h WHERE h.id = l.head_id)
                 WHERE l.lane_key = ANY (ended) AND l.head_id IS NOT NULL
                RETURNING l.ready_at
            )
            SELECT coalesce(bool_or(ready_at <= now()), false) INTO wake FROM waiting;
            -- the lane's next action may start now: wake the idle executors when this transaction commits
            IF wake THEN
                PERFORM pg_notify('outbox_action', '');
            END IF;
        END IF;
    ELSE
        SELECT array_agg(DISTINCT lane_key) INTO lanes
          FROM old_rows WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING');
    END IF;
    IF lanes IS NOT NULL THEN
        PERFORM refresh_agent_lanes(lanes);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER guard_agent_action ON agent_action;
CREATE TRIGGER guard_agent_action BEFORE UPDATE ON agent_action
    FOR EACH ROW WHEN ((
        NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.lane_key = OLD.lane_key
        AND NEW.idempotency_key = OLD.idempotency_key
        AND (
            (NEW.state = 'EXECUTING'
             AND (OLD.state = 'ADMITTED' OR (OLD.state = 'EXECUTING' AND OLD.write_started_at IS NULL))
             AND NEW.epoch = OLD.epoch + 1 AND NEW.attempt = OLD.attempt + 1 AND NEW.lease_expires_at IS NOT NULL)
            OR (NEW.state = OLD.state AND OLD.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
                AND NEW.epoch = OLD.epoch AND NEW.attempt = OLD.attempt
                AND (NEW.state = 'EXECUTING' OR NEW.lease_expires_at IS NULL))
            OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED' AND NEW.epoch = OLD.epoch
                AND NEW.attempt IN (OLD.attempt, OLD.attempt - 1) AND NEW.lease_expires_at IS NULL)
            OR (OLD.state = 'EXECUTING' AND NEW.state IN ('DONE', 'FAILED', 'UNCERTAIN', 'CANCELLED')
                AND NEW.epoch = OLD.epoch AND NEW.attempt = OLD.attempt AND NEW.stop_reason IS NOT NULL
                AND NEW.ended_at = now() AND NEW.payload IS NULL AND NEW.lease_expires_at IS NULL)
        )
    ) IS NOT TRUE)
    EXECUTE FUNCTION guard_agent_action();
CREATE TRIGGER track_agent_lane_insert AFTER INSERT ON agent_action
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION track_agent_lane();
CREATE TRIGGER track_agent_lane_update AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION track_agent_lane();
CREATE TRIGGER track_agent_lane_delete AFTER DELETE ON agent_action
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION track_agent_lane();
CREATE TRIGGER tally_agent_action_ended AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tally_agent_action_ended();

DROP INDEX ix_agent_action_ready;
DROP INDEX ux_agent_action_lane_head;
ALTER TABLE agent_action DROP COLUMN lane_head;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
