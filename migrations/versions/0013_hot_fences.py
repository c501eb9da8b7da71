"""A fence stays a HOT update more often, and a claim writes one index entry fewer.

    claim (ADMITTED -> EXECUTING): a new row version, an entry in every index whose condition it meets;
                                   no longer in ix_agent_action_lease (dropped)
    fence (write_started_at):      a HOT update when the row's page has room: no index entry at all
    sweep, status, metrics:        expired leases from the EXECUTING rows of ux_agent_action_lane_executing

- `fillfactor` 60 on agent_action (was 80): a claim writes a whole new row version, mostly on the row's own
  page; the fence right after it is HOT only if that page still has room. With 30,000 actions claimed and
  fenced 50 at a time, 89 % of the fences were HOT instead of 78 %. It applies to the pages written from now
  on; a table rewritten by the operator (VACUUM FULL, pg_repack) gets it everywhere.
- `ix_agent_action_lease` goes: every claim and every fence that is not HOT wrote an entry into it, and the
  rows it holds (state EXECUTING) are exactly those of the unique index `ux_agent_action_lane_executing`,
  which is small (one executing action per lane, as many as the executors' slots). The lease sweep, the
  status count of expired leases and the metrics read those rows from it and compare their lease.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE agent_action SET (fillfactor = 60);
DROP INDEX ix_agent_action_lease;
"""

DOWNGRADE = r"""
CREATE INDEX ix_agent_action_lease ON agent_action (lease_expires_at) WHERE state = 'EXECUTING';
ALTER TABLE agent_action SET (fillfactor = 80);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
