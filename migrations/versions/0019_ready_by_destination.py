"""Lane heads ready to claim, by destination: a held destination's backlog costs the others' claims nothing.

    claim, nothing held     ──▶ ix_agent_action_ready (due_at)                                     (unchanged)
    claim, something held   ──▶ the (destination, kind) pairs that have ready heads, one index descent each
                                (ix_agent_action_ready_destination), the held destinations left out; the due
                                heads of each pair in due order from the same index
    a held destination's claim ──▶ its own range of ix_agent_action_ready_destination

- `ix_agent_action_ready_destination (destination, kind, due_at) WHERE lane_head AND state = 'ADMITTED'`:
  the same rows as `ix_agent_action_ready`, led by where they go. Without it, the claim that leaves out a
  paused destination reads its due heads one by one (each a row to fetch) at every claim, before it reaches
  a head it may take.

`CREATE INDEX` blocks writes to `agent_action` while it reads the table; on a large table a DBA builds the
index first with `CREATE INDEX CONCURRENTLY` (docs/operations.md, "Migrations") and the revision keeps it,
unless the build failed and left it invalid, when it builds it again.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UPGRADE = r"""
DO $$
BEGIN
    -- a concurrent build that failed leaves an invalid index behind: build it again
    IF EXISTS (SELECT 1 FROM pg_index
                WHERE indexrelid = to_regclass('ix_agent_action_ready_destination') AND NOT indisvalid) THEN
        DROP INDEX ix_agent_action_ready_destination;
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS ix_agent_action_ready_destination ON agent_action (destination, kind, due_at)
    WHERE lane_head AND state = 'ADMITTED';
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP INDEX ix_agent_action_ready_destination")
