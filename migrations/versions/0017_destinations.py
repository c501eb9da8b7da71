"""Destinations: where each action's effect goes, and the pace, pause and breaker that all executors share.

    enqueue ──the kind's destination (EMAIL: smtp, NATS_EVENT: nats, WEBHOOK: webhook:<endpoint>)──▶
        agent_action.destination
    claim ──heads whose destination is open──▶ (one statement, as before)
          ──heads of a paced destination, as many as its tokens──▶ agent_destination.tokens (FOR UPDATE)
          ──one probe of a broken destination, at its probe time──▶ agent_destination.probe_at
    a provider's slow-down ──▶ agent_destination: paused_until, pace (lowered), slow_downs
    every attempt failing for a window ──▶ agent_destination.broken_since; a probe that succeeds clears it
    an operator ──outbox destinations pause / resume──▶ paused_until, paused_by 'operator'

- `agent_action.destination`: the name of the action's destination, set by every enqueue; a row inserted
  without one (by SQL of one's own) gets its kind's (`default_agent_action_destination`, a trigger whose
  WHEN condition keeps an enqueue out of it). Actions that ended
  before this revision keep null (nothing claims them again); the live ones get their kind's destination
  here (WEBHOOK's actions the destination `webhook`, since their endpoint is the code's and not the row's).
  The check that a live action has one is added `NOT VALID`: the live rows get theirs here, every row written
  from now on is checked, and no scan of the ended rows holds the table's lock. It asks no pattern of the name
  (enqueue checks it; agent_destination's check does too): PostgreSQL evaluates a row's checks on every
  update, the claim's and the fence's included, and a pattern costs several microseconds each time.
- `agent_destination`: a row for each destination that is, or was, paced, paused or broken; a destination
  without a row is open. The claim reads the few rows that hold a destination back once per statement.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# the kind's own destination, as the kinds' registry names it (EMAIL's `smtp`, NATS_EVENT's `nats`, any
# other kind's name in lower case): what an action inserted without one goes to
KIND_DESTINATION = "CASE {kind} WHEN 'EMAIL' THEN 'smtp' WHEN 'NATS_EVENT' THEN 'nats' ELSE lower({kind}) END"

# a destination's name: 1 to 80 lower case letters, digits, `_`, `-`, `.` and `:`, starting with a letter, a
# digit or `_` (a kind's name in lower case may start with `_`)
NAME_PATTERN = "^[a-z0-9_][a-z0-9_.:-]{0,79}$"

UPGRADE = f"""
ALTER TABLE agent_action
    ADD COLUMN destination text,
    ADD CONSTRAINT ck_agent_action_destination CHECK (
        (destination IS NOT NULL OR ended_at IS NOT NULL) AND char_length(destination) <= 80
    ) NOT VALID;
GRANT SELECT (destination) ON agent_action TO outbox_reader;

UPDATE agent_action SET destination = {KIND_DESTINATION.format(kind="kind")} WHERE ended_at IS NULL;

CREATE FUNCTION default_agent_action_destination() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.destination := {KIND_DESTINATION.format(kind="NEW.kind")};
    RETURN NEW;
END $$;
CREATE TRIGGER default_agent_action_destination BEFORE INSERT ON agent_action
    FOR EACH ROW WHEN (NEW.destination IS NULL) EXECUTE FUNCTION default_agent_action_destination();

CREATE TABLE agent_destination (
    name text PRIMARY KEY CONSTRAINT ck_agent_destination_name CHECK (name ~ '{NAME_PATTERN}'),
    kind text NOT NULL REFERENCES agent_action_kind (name),
    -- the configured rate (attempts a second) that all executors hold together; null: none
    rate float8 CONSTRAINT ck_agent_destination_rate CHECK (rate > 0 AND rate <= 1000000),
    -- the most attempts started at once above the rate
    burst float8 NOT NULL DEFAULT 1 CONSTRAINT ck_agent_destination_burst CHECK (burst >= 1 AND burst <= 1000000),
    -- the pace learned from the provider's slow-downs (attempts a second when lowered), and when it was lowered:
    -- it rises from there while the provider accepts
    pace float8 CONSTRAINT ck_agent_destination_pace CHECK (pace > 0),
    pace_at timestamptz,
    -- the token bucket of the rate or the pace
    tokens float8 NOT NULL DEFAULT 1,
    tokens_at timestamptz NOT NULL DEFAULT now(),
    paused_until timestamptz,
    paused_by text CONSTRAINT ck_agent_destination_paused_by CHECK (paused_by IN ('provider', 'operator')),
    pause_reason text CONSTRAINT ck_agent_destination_pause_reason CHECK (char_length(pause_reason) <= 500),
    -- slow-downs in a row, each within twice the pause before it: the pause doubles with them
    slow_downs int NOT NULL DEFAULT 0,
    broken_since timestamptz,
    probe_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT ON agent_destination TO outbox_reader;
"""

DOWNGRADE = """
DROP TABLE agent_destination;
DROP TRIGGER default_agent_action_destination ON agent_action;
DROP FUNCTION default_agent_action_destination();
ALTER TABLE agent_action DROP COLUMN destination;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
