"""The holder index holds every lane's holder again, executing ones too: no lane gets a second holder beside
the action it is carrying out.

    ux_agent_action_lane_head       (lane_key) WHERE lane_head
                                    every holder, waiting or executing: one per lane (0026: waiting ones only)
    ux_agent_action_lane_executing  (lane_key) WHERE state = 'EXECUTING'               (unchanged)

Revision 0026 left executing holders to `ux_agent_action_lane_executing`, so that a claim wrote one index entry
fewer. That index cannot refuse a waiting holder beside an executing one, and an enqueue can mark one: it waits
for its lane's executing holder to end (the end takes the holder's row FOR UPDATE), the end passes the lane to
the next action, that action is claimed, and only then does the enqueue look again; its snapshot, taken before,
shows no holder, so it marks its own action. The lane then had two holders, and the next claim of the new one
failed on `ux_agent_action_lane_executing`, which stopped the executor that made it (under load, through a
connection pooler, both executors of a run). With every holder in one unique index, such an enqueue meets the
claimed holder's entry and inserts nothing; `outbox.intake` enqueues it again, behind that holder. A claim
writes the holder's entry again (revision 0026's lift on the claim is given back).

The guard's two probes stay as they are (the waiting holder, then the executing one): both now read this one
index. A database whose lanes already have a waiting holder beside an executing one (left by the fault above)
is mended first: the waiting action lets go, and its lane passes to it when the executing one ends, as the
rule says. Writes to `agent_action` wait while the index is built (it reads every row: 0.27 s on 1,000,000
ended and 100,000 pending rows for revision 0026's, which this one mirrors).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

UPGRADE = """
LOCK TABLE agent_action IN SHARE ROW EXCLUSIVE MODE;
UPDATE agent_action AS w SET lane_head = false
 WHERE w.lane_head AND w.state IN ('PROPOSED', 'ADMITTED')
   AND EXISTS (SELECT FROM agent_action AS e WHERE e.lane_key = w.lane_key AND e.state = 'EXECUTING');
CREATE UNIQUE INDEX ux_agent_action_lane_holder ON agent_action (lane_key) WHERE lane_head;
DROP INDEX ux_agent_action_lane_head;
ALTER INDEX ux_agent_action_lane_holder RENAME TO ux_agent_action_lane_head;
"""

DOWNGRADE = """
CREATE UNIQUE INDEX ux_agent_action_lane_waiting ON agent_action (lane_key)
    WHERE lane_head AND state IN ('PROPOSED', 'ADMITTED');
DROP INDEX ux_agent_action_lane_head;
ALTER INDEX ux_agent_action_lane_waiting RENAME TO ux_agent_action_lane_head;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
