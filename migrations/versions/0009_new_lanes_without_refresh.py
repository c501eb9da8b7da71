"""An enqueue into a lane that has no row makes the row from the new actions alone.

A lane has a row in `agent_lane` exactly while it has an action that has not ended. So when an INSERT
finds no row for a lane (its `INSERT ... ON CONFLICT DO NOTHING` inserts one), no committed transaction left
an action in that lane, and the row follows from the statement's own new actions: its head is the first of
them, nothing executes, and it is ready at the head's due time if the head is ADMITTED. That is most
enqueues: a lane per recipient, per account or per workspace is idle between its effects. Only a lane that
has a row (or whose row another transaction is inserting: the insert waits for it, then finds it) is
recomputed under its lock, as before, by `refresh_agent_lanes`.

Before, every enqueue locked and recomputed its lane: an insert of the lane row, a lock, a lookup of the
head and of an executing action, an update. Updates and deletes are unchanged.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE OR REPLACE FUNCTION track_agent_lane() RETURNS trigger LANGUAGE plpgsql AS $track$
DECLARE
    lanes text[];
    wake boolean := false;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- new actions are PROPOSED or ADMITTED (the guard says so): the first of a lane is its head if the
        -- lane has no row; the lanes whose row exists are recomputed below
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
        -- a new lane ready now wakes the idle executors when this transaction commits
        IF wake THEN
            PERFORM pg_notify('outbox_action', '');
        END IF;
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
"""

# the function as revision 0001 created it
DOWNGRADE = r"""
CREATE OR REPLACE FUNCTION track_agent_lane() RETURNS trigger LANGUAGE plpgsql AS $track$
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
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
