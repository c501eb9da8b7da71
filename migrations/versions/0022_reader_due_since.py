"""The read-only role reads `agent_action.due_since`, which the age gauges and `outbox destinations` count from.

    exporter, `outbox destinations`, `outbox status` (as outbox_reader) ──▶ agent_action.due_since

Revision 0021 added the column without granting it: outbox_reader reads agent_action column by column, so
every metrics snapshot read as that role was refused ("permission denied for table agent_action"). A grant
of one column: no lock worth measuring.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("GRANT SELECT (due_since) ON agent_action TO outbox_reader")


def downgrade() -> None:
    op.execute("REVOKE SELECT (due_since) ON agent_action FROM outbox_reader")
