"""The lane refresh probes each lane by its key, whatever the statistics say, in one statement.

`refresh_agent_lanes` recomputes the given lanes under their row locks. Its "is an action of this lane
executing?" was an EXISTS that the planner could turn into a hash of every EXECUTING action, read twice per
refresh: with a few hundred attempts in flight, every claim and every result of every executor paid for
all of them. Each lane's head and its executing action are now found by a LATERAL probe with LIMIT 1 on
the lane's own index entries, so a refresh costs what its lanes cost. The update, the removal of lanes with
nothing left, and the wake-up decision are one statement instead of three.

What the lane row holds, and when it changes, is exactly as before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE OR REPLACE FUNCTION refresh_agent_lanes(lanes text[]) RETURNS void LANGUAGE plpgsql AS $refresh$
DECLARE
    locked integer;
    wake boolean;
BEGIN
    LOOP
        INSERT INTO agent_lane (lane_key) SELECT k FROM unnest(lanes) AS k ORDER BY k
            ON CONFLICT (lane_key) DO NOTHING;
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM agent_lane WHERE lane_key = ANY (lanes) ORDER BY lane_key FOR UPDATE
        ) AS held;
        -- a lane row deleted by a transaction that committed meanwhile: insert it again
        EXIT WHEN locked = cardinality(lanes);
    END LOOP;

    -- a new statement, so a new snapshot: it sees every change committed before we got the locks
    WITH found AS MATERIALIZED (
        SELECT k.lane_key, h.id AS head_id, e.lane_key IS NOT NULL AS executing,
               CASE WHEN h.state = 'ADMITTED' AND e.lane_key IS NULL THEN h.due_at END AS ready_at
          FROM unnest(lanes) AS k (lane_key)
          LEFT JOIN LATERAL (
            SELECT p.id, p.state, p.due_at FROM agent_action AS p
             WHERE p.lane_key = k.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
             ORDER BY p.id LIMIT 1
          ) AS h ON true
          LEFT JOIN LATERAL (
            SELECT x.lane_key FROM agent_action AS x
             WHERE x.lane_key = k.lane_key AND x.state = 'EXECUTING'
             LIMIT 1
          ) AS e ON true
    ), emptied AS (
        DELETE FROM agent_lane AS l USING found AS f
         WHERE l.lane_key = f.lane_key AND f.head_id IS NULL AND NOT f.executing
    ), changed AS (
        UPDATE agent_lane AS l SET head_id = f.head_id, executing = f.executing, ready_at = f.ready_at
          FROM found AS f
         WHERE l.lane_key = f.lane_key AND (f.head_id IS NOT NULL OR f.executing)
           AND (l.head_id, l.executing, l.ready_at) IS DISTINCT FROM (f.head_id, f.executing, f.ready_at)
    )
    SELECT coalesce(bool_or(ready_at <= now()), false) INTO wake FROM found;

    -- a lane that may start now wakes the idle executors when this transaction commits, whoever made
    -- it ready: an enqueue, an admission, the end of its previous action, a refusal or an erasure
    IF wake THEN
        PERFORM pg_notify('outbox_action', '');
    END IF;
END
$refresh$;
"""

# the function as revision 0001 created it
DOWNGRADE = r"""
CREATE OR REPLACE FUNCTION refresh_agent_lanes(lanes text[]) RETURNS void LANGUAGE plpgsql AS $refresh$
DECLARE
    locked integer;
BEGIN
    LOOP
        INSERT INTO agent_lane (lane_key) SELECT k FROM unnest(lanes) AS k ORDER BY k
            ON CONFLICT (lane_key) DO NOTHING;
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM agent_lane WHERE lane_key = ANY (lanes) ORDER BY lane_key FOR UPDATE
        ) AS held;
        EXIT WHEN locked = cardinality(lanes);
    END LOOP;

    UPDATE agent_lane AS l
       SET head_id = f.head_id,
           executing = f.executing,
           ready_at = CASE WHEN f.head_state = 'ADMITTED' AND NOT f.executing THEN f.head_due_at END
      FROM (
        SELECT k.lane_key, h.id AS head_id, h.state AS head_state, h.due_at AS head_due_at,
               EXISTS (SELECT 1 FROM agent_action e
                        WHERE e.lane_key = k.lane_key AND e.state = 'EXECUTING') AS executing
          FROM unnest(lanes) AS k (lane_key)
          LEFT JOIN LATERAL (
            SELECT p.id, p.state, p.due_at FROM agent_action p
             WHERE p.lane_key = k.lane_key AND p.state IN ('PROPOSED', 'ADMITTED')
             ORDER BY p.id LIMIT 1
          ) AS h ON true
      ) AS f
     WHERE l.lane_key = f.lane_key
       AND (l.head_id, l.executing, l.ready_at) IS DISTINCT FROM
           (f.head_id, f.executing,
            CASE WHEN f.head_state = 'ADMITTED' AND NOT f.executing THEN f.head_due_at END);

    DELETE FROM agent_lane WHERE lane_key = ANY (lanes) AND head_id IS NULL AND NOT executing;

    IF EXISTS (SELECT 1 FROM agent_lane WHERE lane_key = ANY (lanes) AND ready_at <= now()) THEN
        PERFORM pg_notify('outbox_action', '');
    END IF;
END
$refresh$;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
