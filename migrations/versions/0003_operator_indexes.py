"""Indexes for the operator commands, so each reads a few index pages however many ended rows are kept.

`outbox list` walks (created_at, id) backwards, or (state, created_at, id) with a state; `outbox status`
counts unended actions by state and kind from the second index alone, finds the oldest due action at the
head of ix_agent_action_admitted_due and counts UNCERTAIN actions of the last day from ix_agent_action_uncertain.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- outbox list: newest first (created_at, then id), paged by id; stops at --since.
CREATE INDEX ix_agent_action_created ON agent_action (created_at, id);
-- outbox list --state: the same order within one state; outbox status: unended actions by state and kind.
CREATE INDEX ix_agent_action_state_created ON agent_action (state, created_at, id) INCLUDE (kind);
-- outbox status: the oldest due action is the first entry.
CREATE INDEX ix_agent_action_admitted_due ON agent_action (due_at) WHERE state = 'ADMITTED';
-- outbox status: UNCERTAIN actions of the last 24 hours, by kind and reason, from the index alone.
CREATE INDEX ix_agent_action_uncertain ON agent_action (ended_at) INCLUDE (kind, stop_reason)
    WHERE state = 'UNCERTAIN';
"""

DOWNGRADE = r"""
DROP INDEX ix_agent_action_uncertain;
DROP INDEX ix_agent_action_admitted_due;
DROP INDEX ix_agent_action_state_created;
DROP INDEX ix_agent_action_created;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
