"""outbox's kinds WEBHOOK and NATS_EVENT: their rows of agent_action_kind.

Both are not at most once (a webhook receiver deduplicates by `webhook-id`; a JetStream stream drops a
repeated `Nats-Msg-Id` and can be asked for an event by its subject), and both may run at instance level
or in a workspace. A database that already declares one of these names as an application's own kind keeps
its actions: the row is updated to outbox's declaration, which allows every workspace its own row allowed,
unless that row declares the kind at most once while an action of it has not ended (such an action would
lose the rule that keeps it from being sent twice): then the upgrade stops, naming the kind.

The downgrade deletes both rows, and refuses while any action of either kind is left.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = r"""
DO $declare_kinds$
DECLARE
    taken text;
BEGIN
    SELECT k.name INTO taken
      FROM agent_action_kind AS k
     WHERE k.name IN ('WEBHOOK', 'NATS_EVENT') AND k.at_most_once
       AND EXISTS (SELECT 1 FROM agent_action AS a WHERE a.kind = k.name AND a.ended_at IS NULL)
     LIMIT 1;
    IF taken IS NOT NULL THEN
        RAISE EXCEPTION 'agent_action_kind: % is declared at most once here and has actions that have not ended; outbox declares its own % as read back. End or rename those actions, then upgrade', taken, taken
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END
$declare_kinds$;

INSERT INTO agent_action_kind (name, at_most_once, instance_level, workspace_level)
VALUES ('WEBHOOK', false, true, true), ('NATS_EVENT', false, true, true)
ON CONFLICT (name) DO UPDATE
   SET at_most_once = excluded.at_most_once, instance_level = excluded.instance_level,
       workspace_level = excluded.workspace_level;
"""

DOWNGRADE = r"""
DO $forget_kinds$
DECLARE
    held text;
BEGIN
    SELECT kind INTO held FROM agent_action WHERE kind IN ('WEBHOOK', 'NATS_EVENT') LIMIT 1;
    IF held IS NOT NULL THEN
        RAISE EXCEPTION 'agent_action_kind: actions of kind % are left; the downgrade would orphan them', held
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END
$forget_kinds$;

DELETE FROM agent_action_kind WHERE name IN ('WEBHOOK', 'NATS_EVENT');
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
