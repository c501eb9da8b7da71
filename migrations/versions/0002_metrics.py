"""Durable metric tallies, and a read-only role for dashboards.

Counters must survive a worker that dies a moment after an action ended, replicas, and flow runs in
short-lived subprocesses, so they live in the database, written in the transaction of what they count:
- agent_action_ended_tally: a statement trigger adds one row per (kind, state, reason) of every statement
  that ends actions, whoever ends them (executor, expiry, an operator, a refusal);
- agent_action_attempt_tally and agent_action_latency_tally: the executor's group commit adds them in
  the transaction of the attempts' results.
Rows are only ever added, then merged by the exporter; the retention purge never touches them, so a
counter never goes backwards. agent_executor holds a heartbeat per running executor and agent_maintenance
the last success of the purge, for "executor down" and "purge failing" alerts. outbox_reader may read every
outbox table (Grafana's PostgreSQL datasource).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE agent_action_attempt_tally (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind     text    NOT NULL,
    result   text    NOT NULL CHECK (result IN ('DONE', 'RETRY', 'DEFER', 'UNCERTAIN', 'FAILED', 'CANCELLED', 'ABANDONED')),
    recorded boolean NOT NULL,
    n        bigint  NOT NULL CHECK (n > 0)
);

CREATE TABLE agent_action_ended_tally (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind   text   NOT NULL,
    state  text   NOT NULL,
    reason text   NOT NULL,
    n      bigint NOT NULL CHECK (n > 0)
);

-- Histogram observations: n observations of `metric` fell in the bucket whose upper bound is `le`
-- (not cumulative; the exporter accumulates), with `total` their sum in seconds.
CREATE TABLE agent_action_latency_tally (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind   text             NOT NULL,
    metric text             NOT NULL CHECK (metric IN ('attempt_duration', 'pickup_delay')),
    le     double precision NOT NULL,
    n      bigint           NOT NULL CHECK (n > 0),
    total  double precision NOT NULL
);

-- One row per running executor, refreshed at every sweep (each second) and removed when it stops.
CREATE TABLE agent_executor (
    executor_id text PRIMARY KEY,
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);

-- The last success of each maintenance job (the retention purge). A new store has nothing to purge:
-- it counts as purged now, so "no purge for two days" means two days after the install at the earliest.
CREATE TABLE agent_maintenance (
    job             text PRIMARY KEY,
    last_success_at timestamptz NOT NULL,
    last_removed    bigint NOT NULL
);
INSERT INTO agent_maintenance VALUES ('purge', now(), 0);

CREATE FUNCTION tally_agent_action_ended() RETURNS trigger LANGUAGE plpgsql AS $tally$
BEGIN
    INSERT INTO agent_action_ended_tally (kind, state, reason, n)
    SELECT n.kind, n.state, n.stop_reason, count(*)
      FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
     WHERE n.ended_at IS NOT NULL AND o.ended_at IS NULL
     GROUP BY n.kind, n.state, n.stop_reason;
    RETURN NULL;
END
$tally$;

CREATE TRIGGER tally_agent_action_ended AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tally_agent_action_ended();

DO $role$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_reader') THEN
        CREATE ROLE outbox_reader NOLOGIN;
    END IF;
END
$role$;
GRANT SELECT ON agent_action, agent_lane, agent_action_attempt_tally, agent_action_ended_tally,
    agent_action_latency_tally, agent_executor, agent_maintenance TO outbox_reader;
"""

DOWNGRADE = r"""
REVOKE ALL ON agent_action, agent_lane, agent_action_attempt_tally, agent_action_ended_tally,
    agent_action_latency_tally, agent_executor, agent_maintenance FROM outbox_reader;
DROP TABLE agent_maintenance;
DROP TABLE agent_executor;
DROP TRIGGER tally_agent_action_ended ON agent_action;
DROP FUNCTION tally_agent_action_ended();
DROP TABLE agent_action_latency_tally;
DROP TABLE agent_action_ended_tally;
DROP TABLE agent_action_attempt_tally;
-- the role is shared by every database of the server: it goes only when nothing else uses it
DO $role$
BEGIN
    DROP ROLE IF EXISTS outbox_reader;
EXCEPTION WHEN dependent_objects_still_exist THEN
    RAISE NOTICE 'outbox_reader is still used by another database; kept';
END
$role$;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
