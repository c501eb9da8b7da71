"""The kinds of action are rows of agent_action_kind, no longer lists inside a constraint and the guard.

Until now a kind was named in three places: the CHECK `ck_agent_action_kind` (every kind), the CHECK
`ck_agent_action_workspace` (which kinds may run without a workspace, which inside one) and the constant
`at_most_once_kinds` in `guard_agent_action`. Adding a kind rewrote both constraints and the trigger's source.
Now a kind is one row, `(name, at_most_once, instance_level, workspace_level)`, the same declaration as
`ActionKind.register`, and adding one is an upsert of that row:
- the foreign key `fk_agent_action_kind` refuses an action whose kind has no row;
- `guard_agent_action` reads the row once on INSERT (one primary-key lookup) and refuses a missing workspace
  for a kind that is not instance level, and a workspace for a kind that is not workspace level, with a
  message naming the kind and the rule;
- on the reclaim of an action whose write started, and only then, it reads `at_most_once` from the row;
  every other update reads no row. Every other rule of the guard is 0001's, line for line.
A database that declared more kinds than EMAIL (test kinds, or an application's own) keeps every one: the
upgrade reads the two constraints and the guard's list and writes a row for each kind they declare, with the
flags they gave it, before it drops them. outbox_reader may read the table: it holds no personal data.

The downgrade rebuilds the two constraints and 0001's guard, with its at-most-once list, from the rows.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# guard_agent_action as 0001 created it, with its three kind parts left as slots: the declarations, the
# kind's rules on INSERT, and the at-most-once test of a reclaim after the write started.
GUARD = r"""
CREATE OR REPLACE FUNCTION guard_agent_action() RETURNS trigger LANGUAGE plpgsql AS $guard$
DECLARE
@KIND_DECLARATIONS@
    ended CONSTANT text[] := ARRAY['DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'];
    is_claim boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'agent_action: a new action is PROPOSED or ADMITTED, not %', NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.attempt <> 0 OR NEW.epoch <> 0 OR NEW.lease_expires_at IS NOT NULL
           OR NEW.write_started_at IS NOT NULL THEN
            RAISE EXCEPTION 'agent_action: a new action has no attempt, epoch, lease or write'
                USING ERRCODE = 'check_violation';
        END IF;
@KIND_ON_INSERT@        RETURN NEW;
    END IF;

    IF OLD.state = ANY (ended) THEN
        RAISE EXCEPTION 'agent_action %: an ended action (%) never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.id <> OLD.id OR NEW.kind <> OLD.kind OR NEW.lane_key <> OLD.lane_key
       OR NEW.idempotency_key <> OLD.idempotency_key THEN
        RAISE EXCEPTION 'agent_action %: id, kind, lane_key and idempotency_key never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- A claim moves an action to EXECUTING, or takes an EXECUTING one again: the epoch rises.
    is_claim := NEW.state = 'EXECUTING' AND (OLD.state <> 'EXECUTING' OR NEW.epoch <> OLD.epoch);

    IF NEW.state <> OLD.state OR NEW.epoch <> OLD.epoch THEN
        IF NOT (
            (OLD.state = 'PROPOSED' AND NEW.state IN ('ADMITTED', 'CANCELLED'))
            OR (OLD.state = 'ADMITTED' AND NEW.state IN ('EXECUTING', 'CANCELLED'))
            OR (OLD.state = 'EXECUTING' AND NEW.state IN
                ('EXECUTING', 'ADMITTED', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
        ) OR (NEW.epoch <> OLD.epoch AND NOT is_claim) THEN
            RAISE EXCEPTION 'agent_action %: % -> % is not an allowed transition', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF is_claim THEN
        IF NEW.epoch <> OLD.epoch + 1 OR NEW.attempt <> OLD.attempt + 1 THEN
            RAISE EXCEPTION 'agent_action %: a claim raises epoch and attempt by exactly one', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
@AT_MOST_ONCE_RECLAIM@
        IF NEW.lease_expires_at IS NULL THEN
            RAISE EXCEPTION 'agent_action %: a claim sets the lease', OLD.id USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF NOT is_claim AND NEW.attempt <> OLD.attempt
       AND NOT (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED' AND NEW.attempt = OLD.attempt - 1) THEN
        RAISE EXCEPTION 'agent_action %: attempt rises by exactly one with a claim, and falls by one only when an attempt that does not count goes back',
            OLD.id USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.state = ANY (ended) THEN
        IF NEW.stop_reason IS NULL THEN
            RAISE EXCEPTION 'agent_action %: ending as % needs a stop_reason', OLD.id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.ended_at := now();
        NEW.payload := NULL;
        NEW.lease_expires_at := NULL;
    ELSIF NEW.state <> 'EXECUTING' THEN
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END
$guard$;
"""

ROW_GUARD = (
    GUARD.replace(
        "@KIND_DECLARATIONS@\n",
        """\
    -- the kind's row (agent_action_kind), read once on INSERT
    may_run_alone boolean;
    may_run_in_workspace boolean;
""",
    )
    .replace(
        "@KIND_ON_INSERT@",
        """\
        -- where the kind may run; a kind without a row finds none here, and fk_agent_action_kind refuses it
        SELECT k.instance_level, k.workspace_level INTO may_run_alone, may_run_in_workspace
          FROM agent_action_kind AS k WHERE k.name = NEW.kind;
        IF NEW.workspace_id IS NULL AND NOT may_run_alone THEN
            RAISE EXCEPTION 'agent_action: % is not instance level (agent_action_kind.instance_level): it needs a workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.workspace_id IS NOT NULL AND NOT may_run_in_workspace THEN
            RAISE EXCEPTION 'agent_action: % is not workspace level (agent_action_kind.workspace_level): it takes no workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;
""",
    )
    .replace(
        "@AT_MOST_ONCE_RECLAIM@",
        """\
        -- an at-most-once kind is never reclaimed after its write started: nothing can tell whether the
        -- earlier attempt reached the provider. The kind's row is read here only, after a write started.
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL THEN
            IF (SELECT k.at_most_once FROM agent_action_kind AS k WHERE k.name = OLD.kind) THEN
                RAISE EXCEPTION 'agent_action %: % is at most once and its write started; it is never claimed again',
                    OLD.id, OLD.kind USING ERRCODE = 'check_violation';
            END IF;
        END IF;""",
    )
)

# 0001's guard, its at-most-once list left as a slot the downgrade fills from the rows
LIST_GUARD = (
    GUARD.replace(
        "@KIND_DECLARATIONS@\n",
        """\
    -- "Add a kind", step 2: the at-most-once kinds; the database refuses to reclaim them after the
    -- write started, because nothing can tell whether the earlier attempt reached the provider.
    at_most_once_kinds CONSTANT text[] := @AT_MOST_ONCE_KINDS@;
""",
    )
    .replace("@KIND_ON_INSERT@", "")
    .replace(
        "@AT_MOST_ONCE_RECLAIM@",
        """\
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL
           AND OLD.kind = ANY (at_most_once_kinds) THEN
            RAISE EXCEPTION 'agent_action %: % is at most once and its write started; it is never claimed again',
                OLD.id, OLD.kind USING ERRCODE = 'check_violation';
        END IF;""",
    )
)

UPGRADE = (
    r"""
CREATE TABLE agent_action_kind (
    name            text    PRIMARY KEY,
    at_most_once    boolean NOT NULL, -- never reclaimed after its write started
    instance_level  boolean NOT NULL, -- may run without a workspace
    workspace_level boolean NOT NULL, -- may run inside a workspace
    CONSTRAINT ck_agent_action_kind_level CHECK (instance_level OR workspace_level),
    -- ActionKind.register's rule: upper case letters, digits and underscores, at least one letter
    CONSTRAINT ck_agent_action_kind_name CHECK (name ~ '^[A-Z0-9_]*[A-Z][A-Z0-9_]*$')
);

-- the production kind: an email cannot be read back, and each notice decides whether it runs in a workspace
INSERT INTO agent_action_kind (name, at_most_once, instance_level, workspace_level)
VALUES ('EMAIL', true, true, true);

-- Every kind the database declares keeps its row and its flags (a database may declare test kinds, or an
-- application's own). The constraints are evaluated for each name they mention, so how they are written
-- does not matter; the at-most-once kinds are the guard's list.
DO $carry_over$
DECLARE
    kind_check text;
    workspace_check text;
    guard_list text;
    candidate text;
    declared boolean;
    alone boolean;
    in_workspace boolean;
BEGIN
    SELECT pg_get_expr(c.conbin, c.conrelid) INTO kind_check FROM pg_constraint AS c
     WHERE c.conrelid = 'agent_action'::regclass AND c.conname = 'ck_agent_action_kind';
    SELECT pg_get_expr(c.conbin, c.conrelid) INTO workspace_check FROM pg_constraint AS c
     WHERE c.conrelid = 'agent_action'::regclass AND c.conname = 'ck_agent_action_workspace';
    guard_list := substring(pg_get_functiondef('guard_agent_action()'::regprocedure)
                            FROM 'at_most_once_kinds CONSTANT text\[\] := ARRAY\[([^]]*)\]');
    IF kind_check IS NULL OR workspace_check IS NULL OR guard_list IS NULL THEN
        RAISE EXCEPTION 'agent_action: ck_agent_action_kind, ck_agent_action_workspace or the at_most_once_kinds list of guard_agent_action is missing; restore them as revision 0006 has them, then upgrade'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    FOR candidate IN SELECT DISTINCT m[1] FROM regexp_matches(kind_check, '''([^'']*)''', 'g') AS m LOOP
        EXECUTE 'SELECT (' || kind_check || ') IS NOT FALSE FROM (SELECT $1) AS agent_action (kind)'
           INTO declared USING candidate;
        EXECUTE 'SELECT bool_or(workspace_id IS NULL AND allowed), bool_or(workspace_id IS NOT NULL AND allowed)'
             || ' FROM (SELECT workspace_id, (' || workspace_check || ') IS NOT FALSE AS allowed'
             || ' FROM (VALUES ($1, NULL::bigint), ($1, 1)) AS agent_action (kind, workspace_id)) AS t'
           INTO alone, in_workspace USING candidate;
        IF NOT declared OR NOT (alone OR in_workspace) THEN
            -- no action of it could pass both constraints, so none exists
            RAISE NOTICE 'agent_action_kind: the constraints name % but allow no action of it; not carried over',
                candidate;
            CONTINUE;
        END IF;
        INSERT INTO agent_action_kind (name, at_most_once, instance_level, workspace_level)
        VALUES (candidate, candidate IN (SELECT n[1] FROM regexp_matches(guard_list, '''([^'']*)''', 'g') AS n),
                alone, in_workspace)
        ON CONFLICT (name) DO UPDATE
           SET at_most_once = excluded.at_most_once, instance_level = excluded.instance_level,
               workspace_level = excluded.workspace_level;
    END LOOP;
END
$carry_over$;

ALTER TABLE agent_action
    DROP CONSTRAINT ck_agent_action_kind,
    DROP CONSTRAINT ck_agent_action_workspace,
    -- deleting a kind's row is refused while an action of it remains
    ADD CONSTRAINT fk_agent_action_kind FOREIGN KEY (kind) REFERENCES agent_action_kind (name);
"""
    + ROW_GUARD
    + r"""
GRANT SELECT ON agent_action_kind TO outbox_reader;
"""
)

# The lists as SQL arrays in name order, from the rows; an empty list needs its type.
DOWNGRADE = (
    r"""
DO $restore$
DECLARE
    kind_list text := (SELECT 'ARRAY[' || string_agg(quote_literal(k.name), ', ' ORDER BY k.name) || ']'
                         FROM agent_action_kind AS k);
    alone_list text := (SELECT 'ARRAY[' || string_agg(quote_literal(k.name), ', ' ORDER BY k.name) || ']'
                          FROM agent_action_kind AS k WHERE k.instance_level);
    workspace_list text := (SELECT 'ARRAY[' || string_agg(quote_literal(k.name), ', ' ORDER BY k.name) || ']'
                              FROM agent_action_kind AS k WHERE k.workspace_level);
    once_list text := (SELECT 'ARRAY[' || string_agg(quote_literal(k.name), ', ' ORDER BY k.name) || ']'
                         FROM agent_action_kind AS k WHERE k.at_most_once);
BEGIN
    EXECUTE 'ALTER TABLE agent_action DROP CONSTRAINT fk_agent_action_kind,'
         || ' ADD CONSTRAINT ck_agent_action_kind CHECK (kind = ANY (' || coalesce(kind_list, 'ARRAY[]::text[]') || ')),'
         || ' ADD CONSTRAINT ck_agent_action_workspace CHECK ('
         || '(workspace_id IS NOT NULL OR kind = ANY (' || coalesce(alone_list, 'ARRAY[]::text[]') || '))'
         || ' AND (workspace_id IS NULL OR kind = ANY (' || coalesce(workspace_list, 'ARRAY[]::text[]') || ')))';
    EXECUTE replace($list_guard$"""
    + LIST_GUARD
    + r"""$list_guard$, '@AT_MOST_ONCE_KINDS@', coalesce(once_list, 'ARRAY[]::text[]'));
END
$restore$;

DROP TABLE agent_action_kind;
"""
)


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
