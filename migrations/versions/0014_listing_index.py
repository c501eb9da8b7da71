"""A claim and a result write two index entries fewer: the listings read one index, without EXECUTING rows.

    claim (ADMITTED -> EXECUTING): a new row version; no entry in ix_agent_action_created (dropped) nor in
                                   ix_agent_action_state_created (it no longer holds EXECUTING rows)
    result (EXECUTING -> ...):     a new row version; no entry in ix_agent_action_created
    outbox list:                   newest first within each state from ix_agent_action_state_created, the
                                   states merged; EXECUTING ones from ux_agent_action_lane_executing
    outbox status, metrics:        PROPOSED and ADMITTED counts from ix_agent_action_state_created,
                                   EXECUTING ones from ux_agent_action_lane_executing

- `ix_agent_action_created (created_at, id)` goes: it held every row, so every new row version (every claim,
  every result, every state change) wrote an entry into it, for one listing (`outbox list` without
  `--state`), which the index by state serves as well, one state at a time.
- `ix_agent_action_state_created` no longer holds EXECUTING rows: those are the rows of the unique index
  `ux_agent_action_lane_executing` (one per executing lane, as many as the executors' slots), which serves
  them; a claim then writes no entry into it.

The index by state is built anew under a name of its own, then takes the old one's name. `CREATE INDEX` blocks
writes to `agent_action` while it reads the table; on a large table a DBA builds that index first with
`CREATE INDEX CONCURRENTLY` (docs/operations.md, "Migrations") and the revision keeps it, unless the build
failed and left it invalid, when it builds it again.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = r"""
DO $$
BEGIN
    -- a concurrent build that failed leaves an invalid index behind: build it again
    IF EXISTS (SELECT 1 FROM pg_index
                WHERE indexrelid = to_regclass('ix_agent_action_state_created_0014') AND NOT indisvalid) THEN
        DROP INDEX ix_agent_action_state_created_0014;
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS ix_agent_action_state_created_0014 ON agent_action (state, created_at, id) INCLUDE (kind)
    WHERE state <> 'EXECUTING';
DROP INDEX ix_agent_action_state_created;
ALTER INDEX ix_agent_action_state_created_0014 RENAME TO ix_agent_action_state_created;
DROP INDEX ix_agent_action_created;
"""

DOWNGRADE = r"""
CREATE INDEX ix_agent_action_created ON agent_action (created_at, id);
CREATE INDEX ix_agent_action_state_created_0003 ON agent_action (state, created_at, id) INCLUDE (kind);
DROP INDEX ix_agent_action_state_created;
ALTER INDEX ix_agent_action_state_created_0003 RENAME TO ix_agent_action_state_created;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
