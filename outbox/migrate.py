"""Schema migrations: Alembic on outbox's own revisions, with outbox's own version table.

    upgrade(conn) ──▶ env.py: advisory lock ─ adopt an earlier release's `alembic_version` row ─ revisions
    upgrade_sql("base:head") ──▶ the same revisions rendered as SQL, no database touched
    current(conn), head() ──▶ `outbox db current` and `outbox db check`
    downgrade(conn) ──▶ refused while actions have not ended, unless forced

outbox records its revision in `outbox_alembic_version`, never in Alembic's default `alembic_version`, so
it shares a database with an application's own Alembic history and never reads or changes it. The
revisions ship inside the package (`outbox/migrations` in a wheel; `migrations/` in the repository).
Every upgrade and downgrade takes a transaction-level advisory lock first, so two started at once both
succeed: the second waits, then finds the schema current.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, text

from outbox.errors import OutboxError
from outbox.store_ops import STORE_EXISTS

VERSION_TABLE = "outbox_alembic_version"
# pg_advisory_xact_lock key of outbox's migrations (the bytes of "outbox")
MIGRATION_LOCK = 0x6F7574626F78

_PACKAGED = Path(__file__).resolve().parent / "migrations"
MIGRATIONS_DIR = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parent.parent / "migrations"

# An earlier release kept its revision in `alembic_version`; these were its revision ids.
_EARLIER_REVISIONS = ("0001", "0002", "0003")

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


class MigrationRefused(OutboxError):
    """A revision that does not exist, or a downgrade that would lose actions that have not ended."""


def _config(connection: Connection | None = None) -> Config:
    config = Config(output_buffer=io.StringIO())
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def _run(action: str, run: Callable[[], None]) -> None:
    try:
        run()
    except CommandError as error:
        raise MigrationRefused(f"{action}: {error}") from None


def _earlier_revision(connection: Connection) -> str | None:
    """The revision an earlier release left in `alembic_version`, while it has not been moved over."""
    if connection.execute(text("SELECT to_regclass('alembic_version')")).scalar_one() is None:
        return None  # the query below names alembic_version: it must exist to be planned
    earlier = connection.execute(
        EARLIER_REVISION, {"version_table": VERSION_TABLE, "earlier": list(_EARLIER_REVISIONS)}
    ).scalar_one_or_none()
    return None if earlier is None else str(earlier)


def prepare(connection: Connection) -> None:
    """Inside the migration's transaction: wait for any other outbox migration, then move an earlier
    release's revision from `alembic_version` to `outbox_alembic_version` (`alembic_version` held only
    outbox's row then, and goes)."""
    connection.execute(LOCK, {"key": MIGRATION_LOCK})
    if _earlier_revision(connection) is not None:
        for statement in ADOPT_EARLIER_REVISION:
            connection.execute(statement)


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Migrate the database on `connection` up to `revision`, inside the connection's transaction."""
    _run(f"cannot upgrade to {revision!r}", lambda: command.upgrade(_config(connection), revision))


def upgrade_sql(revisions: str = "base:head") -> str:
    """The SQL of the revisions `FROM:TO` (or `TO`, from the start), as a DBA would apply it; touches nothing."""
    config = _config()
    target = revisions if ":" in revisions else f"base:{revisions}"
    _run(f"cannot render {revisions!r}", lambda: command.upgrade(config, target, sql=True))
    buffer = config.output_buffer
    assert isinstance(buffer, io.StringIO)
    return buffer.getvalue()


def downgrade(connection: Connection, revision: str = "base", *, force: bool = False) -> None:
    """Migrate down to `revision`; `base` removes every object outbox created. Refused while actions
    have not ended (they would be lost, or their revision's objects with them), unless `force`."""
    store = connection.execute(STORE_EXISTS).scalar_one()
    unended = int(connection.execute(UNENDED_ACTIONS).scalar_one()) if store else 0
    if unended and not force:
        raise MigrationRefused(
            f"{unended:,} actions have not ended; a downgrade could lose them or what they need."
            " Let them end (or cancel them), or downgrade with --force"
        )
    _run(f"cannot downgrade to {revision!r}", lambda: command.downgrade(_config(connection), revision))
    if current(connection) is None:  # nothing of outbox's is left: its version table goes too
        connection.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))


def current(connection: Connection) -> str | None:
    """The database's outbox revision, or None when outbox was never migrated there."""
    earlier = _earlier_revision(connection)
    if earlier is not None:
        return earlier
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def head() -> str:
    """The newest revision this release ships."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None
    return revision
