"""A destination whose provider refused its credentials, kept on its row for every executor.

    an attempt answered "credentials refused" (a revoked or invalid token, a deactivated account, a 401)
        ──▶ agent_destination.credentials_refused_at (kept), credentials_reason; held as broken: one probe
            every few minutes instead of every action spending its attempts
    an attempt accepted (the probe, after the secret was mended) or an operator's resume ──▶ both null

- `credentials_refused_at`: null but while the provider refuses the destination's credentials.
- `credentials_reason`: what the provider answered (at most 500 characters), never the credentials.

Nullable columns without a default on a table of a few rows: no rewrite, no lock worth measuring.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE agent_destination ADD COLUMN credentials_refused_at timestamptz,"
        " ADD COLUMN credentials_reason text"
        " CONSTRAINT ck_agent_destination_credentials_reason CHECK (char_length(credentials_reason) <= 500)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE agent_destination DROP COLUMN credentials_refused_at, DROP COLUMN credentials_reason")
