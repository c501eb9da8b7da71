"""A destination's second token bucket: the one its attempts take just before they reach the provider.

    claim ──heads of a paced destination, as many as its tokens──▶ agent_destination.tokens    (unchanged)
    an attempt of a held destination, before its fence ──▶ agent_destination.send_tokens: a token now, or
        the wait until its turn (the token reserved), or the pause's end

The claim's bucket bounds what is in flight; this one shapes when it is sent, so the provider sees the rate
(at most the rate and the burst in any second) however long each attempt takes to reach its fence.

- `send_tokens`, `send_tokens_at`: null until the first attempt takes one (a full bucket). The tokens may be
  below zero: the turns already given to attempts that wait for them.

Two columns, nullable and without a default, on a table of a few rows: no lock worth measuring.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE agent_destination ADD COLUMN send_tokens float8, ADD COLUMN send_tokens_at timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE agent_destination DROP COLUMN send_tokens, DROP COLUMN send_tokens_at")
