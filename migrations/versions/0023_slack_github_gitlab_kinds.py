"""outbox's kinds for Slack, GitHub and GitLab: their rows of agent_action_kind, and their destination when an
insert names none.

    SLACK_MESSAGE  a message in a channel, or a reply in a thread           destination slack
    GITHUB_POST    a comment or a review on a pull request, or an issue     destination github
    GITLAB_POST    a note or a review on a merge request, or an issue       destination gitlab

One kind per provider, since a destination (a Slack workspace, a GitHub account, a GitLab host) belongs to
one kind and the provider's limits hold for every post made there, whatever it is.

None is at most once: each reads back, by a marker the post carries, whether an earlier attempt's post was
made. Each may run at instance level or in a workspace. A database that already declares one of these names
as an application's own kind keeps its actions, under the same rule as revision 0011: the row is updated to
outbox's declaration unless that row declares the kind at most once while an action of it has not ended.

An action inserted without a destination gets its kind's (above); the enqueue names the connection's own
(`slack:<workspace>`, `github:<account>`, `gitlab:<host>`).

The downgrade restores the earlier default and deletes the rows, and refuses while any action of these kinds
is left.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

KINDS = ("SLACK_MESSAGE", "GITHUB_POST", "GITLAB_POST")
NAMES = ", ".join(f"'{name}'" for name in KINDS)

DEFAULT_DESTINATION = r"""
CREATE OR REPLACE FUNCTION default_agent_action_destination() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.destination := CASE
        WHEN NEW.kind = 'EMAIL' THEN 'smtp'
        WHEN NEW.kind = 'NATS_EVENT' THEN 'nats'
        WHEN NEW.kind = 'SLACK_MESSAGE' THEN 'slack'
        WHEN NEW.kind = 'GITHUB_POST' THEN 'github'
        WHEN NEW.kind = 'GITLAB_POST' THEN 'gitlab'
        ELSE lower(NEW.kind)
    END;
    RETURN NEW;
END $$;
"""

EARLIER_DEFAULT_DESTINATION = r"""
CREATE OR REPLACE FUNCTION default_agent_action_destination() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.destination := CASE NEW.kind WHEN 'EMAIL' THEN 'smtp' WHEN 'NATS_EVENT' THEN 'nats' ELSE lower(NEW.kind) END;
    RETURN NEW;
END $$;
"""

UPGRADE = rf"""
DO $declare_kinds$
DECLARE
    taken text;
BEGIN
    SELECT k.name INTO taken
      FROM agent_action_kind AS k
     WHERE k.name IN ({NAMES}) AND k.at_most_once
       AND EXISTS (SELECT 1 FROM agent_action AS a WHERE a.kind = k.name AND a.ended_at IS NULL)
     LIMIT 1;
    IF taken IS NOT NULL THEN
        RAISE EXCEPTION 'agent_action_kind: % is declared at most once here and has actions that have not ended; outbox declares its own % as read back. End or rename those actions, then upgrade', taken, taken
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END
$declare_kinds$;

INSERT INTO agent_action_kind (name, at_most_once, instance_level, workspace_level)
VALUES {", ".join(f"('{name}', false, true, true)" for name in KINDS)}
ON CONFLICT (name) DO UPDATE
   SET at_most_once = excluded.at_most_once, instance_level = excluded.instance_level,
       workspace_level = excluded.workspace_level;
"""

DOWNGRADE = rf"""
DO $forget_kinds$
DECLARE
    held text;
BEGIN
    SELECT kind INTO held FROM agent_action WHERE kind IN ({NAMES}) LIMIT 1;
    IF held IS NOT NULL THEN
        RAISE EXCEPTION 'agent_action_kind: actions of kind % are left; the downgrade would orphan them', held
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END
$forget_kinds$;

DELETE FROM agent_action_kind WHERE name IN ({NAMES});
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(DEFAULT_DESTINATION)


def downgrade() -> None:
    op.execute(DOWNGRADE)
    op.execute(EARLIER_DEFAULT_DESTINATION)
