"""A destination's run of failures, and when a deferred action first became due, kept in the database.

    an attempt that failed, or a slow-down ──▶ agent_destination.failing_since (kept), failures + 1
    the run has lasted the breaker's window, with enough failures and no attempt accepted since it began
        ──▶ broken (one probe at a time); an accepted attempt since ──▶ the run starts again from it
    a deferral (a pause, a turn far off) moves an action's due_at ──▶ agent_action.due_since keeps the
        first due time; any other result clears it

The breaker is judged from the destination's own record, so whether a dead receiver is seen no longer
depends on which executor saw its attempts, or when. The age gauges count a deferred head from `due_since`.
Neither column is written on the path of an attempt that is accepted.

- `failing_since`, `failures`: null and 0 until an attempt fails; mending and an operator's resume reset them.
- `due_since`: null but while deferrals move a waiting action's due time.

Nullable columns without a default (and one default on a table of a few rows): no rewrite, no lock worth
measuring.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE agent_destination ADD COLUMN failing_since timestamptz,"
        " ADD COLUMN failures integer NOT NULL DEFAULT 0"
    )
    op.execute("ALTER TABLE agent_action ADD COLUMN due_since timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE agent_action DROP COLUMN due_since")
    op.execute("ALTER TABLE agent_destination DROP COLUMN failing_since, DROP COLUMN failures")
