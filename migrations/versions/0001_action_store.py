"""The action store: agent_action, its lifecycle guard, and the lane index that finds lane heads directly.

agent_action holds one row per effect. guard_agent_action (BEFORE, per row) refuses every move the
lifecycle does not allow. agent_lane holds one row per lane that has an unended action: its head (the
oldest action not started) and `ready_at`, the head's due time while the lane may start it. Statement
triggers keep agent_lane exact under the lane row's lock, so the claim reads ready lanes from one small
partial index instead of walking every blocked action of a deep lane.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE agent_action (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind               text        NOT NULL,
    workspace_id       bigint,
    lane_key           text        NOT NULL,
    idempotency_key    text        NOT NULL,
    payload            jsonb,
    subject_account_id bigint,
    max_attempts       integer     NOT NULL,
    expires_at         timestamptz,
    state              text        NOT NULL,
    attempt            integer     NOT NULL DEFAULT 0,
    epoch              bigint      NOT NULL DEFAULT 0,
    due_at             timestamptz NOT NULL DEFAULT now(),
    lease_expires_at   timestamptz,
    write_started_at   timestamptz,
    stop_reason        text,
    readback_ref       text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    ended_at           timestamptz,
    -- "Add a kind", step 2: every kind is listed here
    CONSTRAINT ck_agent_action_kind CHECK (kind = ANY (ARRAY['EMAIL'])),
    -- "Add a kind", step 2: the first list may run without a workspace (instance level),
    -- the second inside one; a kind may be in both (EMAIL: the notice decides)
    CONSTRAINT ck_agent_action_workspace CHECK (
        (workspace_id IS NOT NULL OR kind = ANY (ARRAY['EMAIL']))
        AND (workspace_id IS NULL OR kind = ANY (ARRAY['EMAIL']))
    ),
    CONSTRAINT ux_agent_action_idempotency_key UNIQUE (idempotency_key),
    CONSTRAINT ck_agent_action_state CHECK (
        state IN ('PROPOSED', 'ADMITTED', 'EXECUTING', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
    ),
    CONSTRAINT ck_agent_action_stop_reason CHECK (
        CASE state
            WHEN 'DONE' THEN stop_reason = 'CONFIRMED'
            WHEN 'FAILED' THEN stop_reason IN ('PROVIDER_REFUSED', 'ATTEMPTS_EXHAUSTED')
            WHEN 'UNCERTAIN' THEN stop_reason IN
                ('PROVIDER_UNCERTAIN', 'ERROR_AFTER_WRITE', 'LEASE_LOST_AFTER_WRITE')
            WHEN 'CANCELLED' THEN stop_reason IN
                ('EXPIRED', 'PROPOSAL_REFUSED', 'NOT_WANTED', 'OPERATOR_CANCELLED')
            ELSE stop_reason IS NULL
        END
    ),
    CONSTRAINT ck_agent_action_ended_at CHECK ((ended_at IS NULL) = (stop_reason IS NULL)),
    CONSTRAINT ck_agent_action_max_attempts CHECK (max_attempts > 0),
    CONSTRAINT ck_agent_action_attempt CHECK (attempt >= 0 AND attempt <= max_attempts),
    CONSTRAINT ck_agent_action_lane_key CHECK (lane_key <> ''),
    CONSTRAINT ck_agent_action_idempotency_key CHECK (idempotency_key <> '')
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- One executing action per lane, also when two replicas claim at the same moment (the backstop).
CREATE UNIQUE INDEX ux_agent_action_lane_executing ON agent_action (lane_key) WHERE state = 'EXECUTING';
-- A lane's head: its oldest action that has not started.
CREATE INDEX ix_agent_action_lane_pending ON agent_action (lane_key, id)
    WHERE state IN ('PROPOSED', 'ADMITTED');
-- Leases to take back: few rows, only the executing ones.
CREATE INDEX ix_agent_action_lease ON agent_action (lease_expires_at) WHERE state = 'EXECUTING';
-- Actions that may expire before they start.
CREATE INDEX ix_agent_action_expires ON agent_action (expires_at)
    WHERE state IN ('PROPOSED', 'ADMITTED') AND expires_at IS NOT NULL;
-- The retention purge walks ended rows by age.
CREATE INDEX ix_agent_action_ended ON agent_action (ended_at) WHERE ended_at IS NOT NULL;
-- Erasure by account.
CREATE INDEX ix_agent_action_subject ON agent_action (subject_account_id)
    WHERE subject_account_id IS NOT NULL;

CREATE TABLE agent_lane (
    lane_key  text PRIMARY KEY,
    head_id   bigint,                         -- the oldest PROPOSED or ADMITTED action
    executing boolean NOT NULL DEFAULT false, -- an action of the lane is EXECUTING
    ready_at  timestamptz                     -- head's due_at while the head is ADMITTED and nothing executes
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02);

CREATE INDEX ix_agent_lane_ready ON agent_lane (ready_at) WHERE ready_at IS NOT NULL;

CREATE FUNCTION guard_agent_action() RETURNS trigger LANGUAGE plpgsql AS $guard$
DECLARE
    -- "Add a kind", step 2: the at-most-once kinds; the database refuses to reclaim them after the
    -- write started, because nothing can tell whether the earlier attempt reached the provider.
    at_most_once_kinds CONSTANT text[] := ARRAY['EMAIL'];
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
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL
           AND OLD.kind = ANY (at_most_once_kinds) THEN
            RAISE EXCEPTION 'agent_action %: % is at most once and its write started; it is never claimed again',
                OLD.id, OLD.kind USING ERRCODE = 'check_violation';
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
$guard$;

CREATE TRIGGER guard_agent_action BEFORE INSERT OR UPDATE ON agent_action
    FOR EACH ROW EXECUTE FUNCTION guard_agent_action();

-- Recompute the given lanes under their row locks. Every writer of a lane's actions passes here, and
-- the lock makes the last writer see every committed change before it, so agent_lane stays exact.
CREATE FUNCTION refresh_agent_lanes(lanes text[]) RETURNS void LANGUAGE plpgsql AS $refresh$
DECLARE
    locked integer;
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
    UPDATE agent_lane AS l
       SET head_id = f.head_id,
           executing = f.executing,
           ready_at = CASE WHEN f.head_state = 'ADMITTED' AND NOT f.executing THEN f.head_due_at END
      FROM (
        SELECT k.lane_key, h.id AS head_id, h.state AS head_state, h.due_at AS head_due_at,
               EXISTS (SELECT 1 FROM agent_action e
                        WHERE e.lane_key = k.lane_key AND e.state = 'EXECUTING') AS executing
          FROM unnest(lanes) AS k (lane_key)
          LEFT JOIN LATERAL (
            SELECT p.id, p.state, p.due_at FROM agent_action p
             WHERE p.lane_key = k.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
             ORDER BY p.id LIMIT 1
          ) AS h ON true
      ) AS f
     WHERE l.lane_key = f.lane_key
       AND (l.head_id, l.executing, l.ready_at) IS DISTINCT FROM
           (f.head_id, f.executing,
            CASE WHEN f.head_state = 'ADMITTED' AND NOT f.executing THEN f.head_due_at END);

    DELETE FROM agent_lane WHERE lane_key = ANY (lanes) AND head_id IS NULL AND NOT executing;

    -- a lane that may start now wakes the idle executors when this transaction commits, whoever made
    -- it ready: an enqueue, an admission, the end of its previous action, a refusal or an erasure
    IF EXISTS (SELECT 1 FROM agent_lane WHERE lane_key = ANY (lanes) AND ready_at <= now()) THEN
        PERFORM pg_notify('outbox_action', '');
    END IF;
END
$refresh$;

CREATE FUNCTION track_agent_lane() RETURNS trigger LANGUAGE plpgsql AS $track$
DECLARE
    lanes text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(DISTINCT lane_key) INTO lanes FROM new_rows;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(DISTINCT n.lane_key) INTO lanes
          FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
         WHERE n.state <> o.state OR n.due_at <> o.due_at;
    ELSE
        SELECT array_agg(DISTINCT lane_key) INTO lanes
          FROM old_rows WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING');
    END IF;
    IF lanes IS NOT NULL THEN
        PERFORM refresh_agent_lanes(lanes);
    END IF;
    RETURN NULL;
END
$track$;

CREATE TRIGGER track_agent_lane_insert AFTER INSERT ON agent_action
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION track_agent_lane();
CREATE TRIGGER track_agent_lane_update AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION track_agent_lane();
CREATE TRIGGER track_agent_lane_delete AFTER DELETE ON agent_action
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION track_agent_lane();
"""

DOWNGRADE = r"""
DROP TABLE agent_action;
DROP TABLE agent_lane;
DROP FUNCTION track_agent_lane();
DROP FUNCTION refresh_agent_lanes(text[]);
DROP FUNCTION guard_agent_action();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
