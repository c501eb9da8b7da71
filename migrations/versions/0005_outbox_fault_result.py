"""The attempt tallies count OUTBOX_FAULT: an attempt that outbox's own database or pool failed before its
fence, given back to its lane without counting against max_attempts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

RESULTS = ("DONE", "RETRY", "DEFER", "OUTBOX_FAULT", "UNCERTAIN", "FAILED", "CANCELLED", "ABANDONED")
EARLIER_RESULTS = tuple(result for result in RESULTS if result != "OUTBOX_FAULT")


def _check(results: tuple[str, ...]) -> str:
    listed = ", ".join(f"'{result}'" for result in results)
    return f"""
ALTER TABLE agent_action_attempt_tally
    DROP CONSTRAINT agent_action_attempt_tally_result_check,
    ADD CONSTRAINT agent_action_attempt_tally_result_check CHECK (result IN ({listed}));
"""


def upgrade() -> None:
    op.execute(_check(RESULTS))


def downgrade() -> None:
    # the earlier schema has no such label: its attempts went back to their lanes uncounted, as a DEFER's do
    op.execute("UPDATE agent_action_attempt_tally SET result = 'DEFER' WHERE result = 'OUTBOX_FAULT'")
    op.execute(_check(EARLIER_RESULTS))
