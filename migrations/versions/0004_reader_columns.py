"""outbox_reader reads no personal data: of agent_action, only the columns dashboards and the exporter read.

outbox_reader is the role of dashboards (Grafana's PostgreSQL datasource) and of the metrics exporter. Of
agent_action it keeps the id, kind, lane key, state, stop reason, attempt counts, epoch and timestamps:
what the exporter's gauges, the dashboard's lane table and an operator's counts read. It loses `payload`
(the event, which may name the recipient), `idempotency_key` (may carry an event's or a request's key),
`subject_account_id` and `workspace_id` (who and whose the action is about) and `readback_ref` (the
provider's reply). `SELECT *` and any read of those columns are refused. The lane key stays readable:
the lane table shows which lanes are stuck by their key, and agent_lane holds it anyway; build lane keys
from ids (`account:42:email`), never from an address or a name. Columns a later revision adds
are not readable unless that revision grants them. Every other table outbox_reader reads (lanes, tallies,
heartbeats, maintenance) holds no personal data and stays readable in full.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

READABLE_COLUMNS = (
    "id",
    "kind",
    "lane_key",
    "state",
    "stop_reason",
    "attempt",
    "max_attempts",
    "epoch",
    "due_at",
    "expires_at",
    "lease_expires_at",
    "write_started_at",
    "created_at",
    "ended_at",
)

UPGRADE = f"""
REVOKE SELECT ON agent_action FROM outbox_reader;
GRANT SELECT ({", ".join(READABLE_COLUMNS)}) ON agent_action TO outbox_reader;
"""

# revoking on the table revokes on each of its columns too; then 0002's grant of the whole table
DOWNGRADE = """
REVOKE SELECT ON agent_action FROM outbox_reader;
GRANT SELECT ON agent_action TO outbox_reader;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
