"""A lane's holder index leaves executing holders to ux_agent_action_lane_executing: a claim writes one index
entry fewer.

    ux_agent_action_lane_head       (lane_key) WHERE lane_head AND state IN ('PROPOSED', 'ADMITTED')
                                    the waiting holders: one per lane (was: every holder, executing ones too)
    ux_agent_action_lane_executing  (lane_key) WHERE state = 'EXECUTING'               (unchanged)
                                    the executing action, always its lane's holder: one per lane

- A claim moves a holder from ADMITTED to EXECUTING with its mark kept; the holder index held it again
  under its new version (an index entry and a unique check per claimed action) although
  ux_agent_action_lane_executing already holds it and refuses a second one.
- The guard looks for a new action's holder in both: the waiting holder first, then the executing one (a
  waiting holder claimed between the two is found by the second). `hold_agent_lanes` lets go only of waiting
  holders (an executing action is its lane's holder by the rule), so its update reads the new index.
- `outbox status` and `outbox lanes` read the holders from the two indexes (outbox.store.operator).

The index is built anew under a name of its own, then takes the old one's: `CREATE UNIQUE INDEX` blocks writes
to `agent_action` while it reads the table, as revision 0015's did (the holders are few, but the build reads
every row; docs/operations.md gives the time on a large table).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

# The guard as revision 0015 left it, but for the holder's probe: the waiting holder, then the executing one.
GUARD = r"""CREATE OR REPLACE FUNCTION guard_agent_action() RETURNS trigger LANGUAGE plpgsql AS $$
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
        -- A waiting holder from ux_agent_action_lane_head, else the executing one from
        -- ux_agent_action_lane_executing (looked for second: a waiting holder claimed meanwhile is found there).
        -- No holder: this action holds the lane; ux_agent_action_lane_head refuses a second one that an
        -- enqueue into the same lane, not committed yet, marked meanwhile.
        NEW.lane_head := false;
        SELECT h.id, h.state INTO holder_id, holder_state
          FROM agent_action AS h WHERE h.lane_key = NEW.lane_key AND h.lane_head AND h.state IN ('PROPOSED', 'ADMITTED')
           FOR KEY SHARE;
        IF NOT FOUND THEN
            SELECT h.id, h.state INTO holder_id, holder_state
              FROM agent_action AS h WHERE h.lane_key = NEW.lane_key AND h.state = 'EXECUTING' AND h.lane_head
               FOR KEY SHARE;
        END IF;
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

EARLIER_GUARD = r"""CREATE OR REPLACE FUNCTION guard_agent_action() RETURNS trigger LANGUAGE plpgsql AS $$
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

# hold_agent_lanes as revision 0015 wrote it, but for the let-go: waiting holders only.
HOLD_LANES = r"""
CREATE OR REPLACE FUNCTION hold_agent_lanes(lanes text[]) RETURNS void LANGUAGE plpgsql AS $$
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
        -- a holder that is no longer the rule's (a retried one, behind an earlier action not started) lets go;
        -- an executing action is always its lane's holder
        UPDATE agent_action SET lane_head = false
         WHERE lane_key = ANY (lanes) AND lane_head AND state IN ('PROPOSED', 'ADMITTED') AND NOT (id = ANY (holders));
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
"""

EARLIER_HOLD_LANES = r"""
CREATE OR REPLACE FUNCTION hold_agent_lanes(lanes text[]) RETURNS void LANGUAGE plpgsql AS $$
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
"""

UPGRADE = rf"""
CREATE UNIQUE INDEX ux_agent_action_lane_waiting ON agent_action (lane_key)
    WHERE lane_head AND state IN ('PROPOSED', 'ADMITTED');
DROP INDEX ux_agent_action_lane_head;
ALTER INDEX ux_agent_action_lane_waiting RENAME TO ux_agent_action_lane_head;
{GUARD}
{HOLD_LANES}
"""

DOWNGRADE = rf"""
CREATE UNIQUE INDEX ux_agent_action_lane_marked ON agent_action (lane_key) WHERE lane_head;
DROP INDEX ux_agent_action_lane_head;
ALTER INDEX ux_agent_action_lane_marked RENAME TO ux_agent_action_lane_head;
{EARLIER_GUARD}
{EARLIER_HOLD_LANES}
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
