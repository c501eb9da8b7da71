"""The guard lets the executor's own moves through in its trigger's WHEN condition, without entering PL/pgSQL.

    UPDATE agent_action ─▶ trigger guard_agent_action, WHEN the move is not one of the four below
                              └─▶ guard_agent_action(): every check and every stamp, as before
    INSERT agent_action ─▶ trigger guard_agent_action_insert ─▶ guard_agent_action(), always

The function is unchanged and refuses exactly what it refused; the WHEN condition holds only for a row the
function would pass through untouched (no refusal, nothing stamped), so skipping it changes nothing:

- a claim: ADMITTED -> EXECUTING, or EXECUTING -> EXECUTING before any write started (the only reclaim the
  function lets through without reading the kind's row), epoch and attempt each up by one, a lease set;
- the same state, not ended, epoch and attempt unchanged (a fence, a new trace, a new due time), with no
  lease unless EXECUTING;
- a retry: EXECUTING -> ADMITTED under the same epoch, the attempt kept or given back by one, no lease;
- an end: EXECUTING -> DONE, FAILED, UNCERTAIN or CANCELLED under the same epoch and attempt, with its stop
  reason, and the row already carrying what the function would stamp: ended_at now(), no payload, no lease.

The executor's group commit (`outbox.store.executor.COMMIT_WRITES`) writes those stamps itself; any other
statement, and every move outside the four, runs the function. The condition is `(...) IS NOT TRUE`, so a
comparison with a null (a column set to null, which its NOT NULL refuses after the trigger) runs the
function too. A WHEN condition of an INSERT trigger cannot name OLD, hence the second trigger for inserts.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UPGRADE = r"""
DROP TRIGGER guard_agent_action ON agent_action;

CREATE TRIGGER guard_agent_action_insert BEFORE INSERT ON agent_action
    FOR EACH ROW EXECUTE FUNCTION guard_agent_action();

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
"""

# the one trigger of revision 0001
DOWNGRADE = r"""
DROP TRIGGER guard_agent_action ON agent_action;
DROP TRIGGER guard_agent_action_insert ON agent_action;
CREATE TRIGGER guard_agent_action BEFORE INSERT OR UPDATE ON agent_action
    FOR EACH ROW EXECUTE FUNCTION guard_agent_action();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
