"""An action keeps what traces it after it ends: `last_error`, what went wrong last, and `trace`, what finds
it at its provider.

`last_error` is the reason of the latest attempt that did not succeed: its stage, the provider's reply code
and a short reason (`data: TimeoutError during or after DATA`, `mail: 550; the relay refused it`). The
executor writes it in the same statement that records the result, so an action that ends keeps the reason
it ended with; DONE clears it. It never holds a recipient, an address or a message body: adapters name
stages and codes only, and the executor leaves out anything shaped like an address.

`trace` is a small JSON object an adapter sets before its fence: what an operator searches the provider's
logs for once the payload is gone (the guard clears the payload when an action ends, never these two
columns). For EMAIL: `{"notice": "workspace_alert", "message_id": "<outbox.…@example.com>"}`, the notice's
name and the message's Message-ID, a hash of the idempotency key.

Neither holds personal data, so outbox_reader may read both.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# the longest last_error and trace (its JSON text) the database keeps
LIMIT = 500

UPGRADE = f"""
ALTER TABLE agent_action
    ADD COLUMN last_error text,
    ADD COLUMN trace jsonb,
    ADD CONSTRAINT ck_agent_action_last_error CHECK (char_length(last_error) <= {LIMIT}),
    ADD CONSTRAINT ck_agent_action_trace CHECK (
        jsonb_typeof(trace) = 'object' AND char_length(trace::text) <= {LIMIT}
    );
GRANT SELECT (last_error, trace) ON agent_action TO outbox_reader;
"""

# dropping the columns drops their grants too
DOWNGRADE = """
ALTER TABLE agent_action DROP COLUMN last_error, DROP COLUMN trace;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
