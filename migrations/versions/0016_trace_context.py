"""An action keeps the W3C trace context of the code that enqueued it: `trace_context`.

    enqueue (a span active) ──{"traceparent": ..., "tracestate": ...}──▶ agent_action.trace_context
    executor's attempt span ◀── a child of that context ──▶ the provider (a webhook header, NATS headers)

`trace_context` is a JSON object of W3C Trace Context headers (docs/tracing.md): `traceparent`, and
`tracestate` when the enqueuing span carries one. It is null when nothing was active at enqueue, or when the
application does not use OpenTelemetry. It holds ids and a vendor's state, no personal data, so outbox_reader
may read it (a trace backend finds the action by its trace id).

The column is nullable without a default, so adding it rewrites nothing. The bound is checked `NOT VALID`:
every row there before holds null, which passes it, so there is nothing to validate, and a validating scan
would hold the table's lock for about 0.45 s per million rows; PostgreSQL checks it on every row written
from here on all the same.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# the longest trace_context (its JSON text) the database keeps; outbox.tracing stores at most
# traceparent (55 characters) and a tracestate of up to 512
LIMIT = 1024

UPGRADE = f"""
ALTER TABLE agent_action
    ADD COLUMN trace_context jsonb,
    ADD CONSTRAINT ck_agent_action_trace_context CHECK (
        jsonb_typeof(trace_context) = 'object' AND char_length(trace_context::text) <= {LIMIT}
    ) NOT VALID;
GRANT SELECT (trace_context) ON agent_action TO outbox_reader;
"""

# dropping the column drops its constraint and grant too
DOWNGRADE = """
ALTER TABLE agent_action DROP COLUMN trace_context;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
