"""The executor's results tally their own ends and hand over their own lanes; a row trigger does it for every
other writer, and claims and fences fire no trigger at all.

    claim, fence (UPDATE)    ──▶ no trigger: no transition table is kept, no function entered
    executor's results       ──▶ COMMIT_WRITES itself: the ended tally (one insert per kind, state, reason) and
                                 hold_agent_lanes(the lanes whose holder ended or went back to wait), in the
                                 same statement, after its rows are written
    any other writer's move  ──▶ after_agent_action_move, for each row that ended, let go of its lane, or went
    (a cancel, a sweep, SQL)     back to wait: the row's ended tally and its lane's next holder

- `after_agent_action_update` (a statement trigger over the transition tables of every UPDATE) goes. Every
  claim and fence paid for its transition tables and a pass over them that found nothing to do.
- `after_agent_action_move` (AFTER UPDATE, FOR EACH ROW) fires only when the row's state changed and it ended,
  let go of its lane or went back from EXECUTING to ADMITTED: its WHEN condition is evaluated without
  entering PL/pgSQL, so claims and fences never reach it.
- The executor's result statement sets `outbox.own_ends` to `written` for its own transaction
  (`set_config(..., true)`) before it writes a row; the WHEN condition leaves the rows of such a transaction,
  whose tally and hand-over that statement writes itself. A transaction that sets it and does not is one that
  chose to lose its tallies; no role of outbox's does.

Every promise stays: the tallies are exact and crash-safe (written in the transaction of the end), a holder's
end waits for the enqueues behind it (the result's row FOR UPDATE, as before), the next holder is chosen in a
snapshot taken after the end. The revision changes no table or index: it holds writes to `agent_action` for
the moment of replacing a trigger.

The downgrade restores revision 0015's statement trigger.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

UPGRADE = r"""
DROP TRIGGER after_agent_action_update ON agent_action;
DROP FUNCTION after_agent_action_update();

-- For each row another writer moved (the trigger's WHEN condition): the ended tally, and the lane's next holder
-- when the row let go of it or went back to wait (an earlier action that had not started may take it). Fired
-- after the statement, so the next holder is chosen in a snapshot that sees every row the statement moved.
CREATE FUNCTION after_agent_action_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') THEN
        INSERT INTO agent_action_ended_tally (kind, state, reason, n) VALUES (NEW.kind, NEW.state, NEW.stop_reason, 1);
    END IF;
    IF (OLD.lane_head AND NOT NEW.lane_head) OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED') THEN
        PERFORM hold_agent_lanes(ARRAY[NEW.lane_key]);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER after_agent_action_move AFTER UPDATE ON agent_action
    FOR EACH ROW WHEN (
        OLD.state <> NEW.state
        AND (NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') OR (OLD.lane_head AND NOT NEW.lane_head)
             OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED'))
        AND current_setting('outbox.own_ends', true) IS DISTINCT FROM 'written'
    )
    EXECUTE FUNCTION after_agent_action_move();
"""

# Revision 0015's statement trigger, as it wrote it.
DOWNGRADE = r"""
DROP TRIGGER after_agent_action_move ON agent_action;
DROP FUNCTION after_agent_action_move();

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

CREATE TRIGGER after_agent_action_update AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION after_agent_action_update();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
