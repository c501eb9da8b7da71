"""The migrations' own statements: the lock that serialises two upgrades, the move of an earlier release's
revision to outbox's version table, the checks a downgrade makes, and the kinds' rows a migration declares
or forgets. The schema itself lives in the revisions (`migrations/versions/`)."""

from __future__ import annotations

from sqlalchemy import text

VERSION_TABLE = "outbox_alembic_version"
# pg_advisory_xact_lock key of outbox's migrations (the bytes of "outbox")
MIGRATION_LOCK = 0x6F7574626F78

LOCK = text("SELECT pg_advisory_xact_lock(:key)")
EARLIER_REVISION = text("""
SELECT v.version_num FROM alembic_version AS v
 WHERE to_regclass('agent_action') IS NOT NULL AND to_regclass(:version_table) IS NULL
   AND v.version_num = ANY (:earlier)
   AND (SELECT count(*) FROM alembic_version) = 1
""")
ADOPT_EARLIER_REVISION = (
    text(f"""
CREATE TABLE {VERSION_TABLE} (
    version_num varchar(32) NOT NULL,
    CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num)
)"""),
    text(f"INSERT INTO {VERSION_TABLE} SELECT version_num FROM alembic_version"),
    text("DROP TABLE alembic_version"),
)
UNENDED_ACTIONS = text("SELECT count(*) FROM agent_action WHERE ended_at IS NULL")
KIND_TABLE_EXISTS = text("SELECT to_regclass('agent_action_kind') IS NOT NULL")
# the kinds' rows locked first: an enqueue of one of them (its foreign key check) waits, or is waited for
LOCK_KIND_ROWS = text("SELECT name FROM agent_action_kind WHERE name = ANY (:names) FOR UPDATE")
ACTIONS_OF_KINDS = text("""
SELECT kind, count(*) AS actions, count(*) FILTER (WHERE ended_at IS NULL) AS unended
  FROM agent_action WHERE kind = ANY (:names) GROUP BY kind ORDER BY kind
""")
DELETE_KIND_ROWS = text("DELETE FROM agent_action_kind WHERE name = ANY (:names)")
ALEMBIC_VERSION_EXISTS = text("SELECT to_regclass('alembic_version') IS NOT NULL")
DROP_VERSION_TABLE = text(f"DROP TABLE IF EXISTS {VERSION_TABLE}")
