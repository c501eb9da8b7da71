"""When a destination's provider last paused it: the moment its bucket was empty.

    a provider's slow-down that pauses the destination ──▶ agent_destination.slowed_at = now()
    the next slow-down, while the destination has no pace ──▶ its first pace: the attempts sent since
        slowed_at that the provider accepted, over the seconds since slowed_at (when at least 5)
    an attempt that waited for its turn ──▶ slowed_at changed meanwhile: its turn is void, it takes another

A provider refuses when its bucket is empty, so what it accepted of the attempts sent after a refusal is what
it refilled since: its rate, not counting the burst it had saved up before (which a count of everything it
accepted over the last seconds includes, and which set the first pace after a cold start at twice and more
the provider's limit).

- `slowed_at`: null until a provider's slow-down pauses the destination; an operator's resume clears it.

One nullable column without a default on a table of a few rows: no lock worth measuring.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE agent_destination ADD COLUMN slowed_at timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE agent_destination DROP COLUMN slowed_at")
