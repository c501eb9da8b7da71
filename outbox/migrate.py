"""Schema migrations: Alembic on outbox's own revisions, with outbox's own version table.

    upgrade(conn) ──▶ env.py: advisory lock ─ adopt an earlier release's `alembic_version` row ─ revisions
    upgrade_sql("base:head") ──▶ the same revisions rendered as SQL, no database touched
    current(conn), head() ──▶ `outbox db current` and `outbox db check`
    downgrade(conn) ──▶ refused while actions have not ended, unless forced
    declare_kinds(op, kinds) ──▶ each kind's row in `agent_action_kind` upserted (step 2 of "Add a kind")
    forget_kinds(op, kinds) ──▶ the rows deleted; refused while actions of the kinds exist

`conn` is a SQLAlchemy Connection, or a psycopg 3 connection (Django's, in a `RunPython` migration): for
the latter SQLAlchemy runs on it through a stand-in that leaves its transaction to the caller (its commit,
rollback and close do nothing). Called from a revision of an application's own Alembic run, outbox's
inner Alembic run installs its own `alembic.context` and `alembic.op` and removes them when it ends;
the caller's are put back, so the application's run carries on with its own.

outbox records its revision in `outbox_alembic_version`, never in Alembic's default `alembic_version`, so
it shares a database with an application's own Alembic history and never reads or changes it. The
revisions ship inside the package (`outbox/migrations` in a wheel; `migrations/` in the repository).
Every upgrade and downgrade takes a transaction-level advisory lock first, so two started at once both
succeed: the second waits, then finds the schema current.

The role that upgrades owns what the revisions create, and creates the role `outbox_reader` (the
dashboards' and the exporter's) unless it exists: that takes the CREATEROLE attribute. A role without it
gets MissingPrivilege, one line naming the attribute and what to do, and the upgrade's transaction leaves
nothing behind.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import alembic.context
import alembic.op
import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, StaticPool, create_engine
from sqlalchemy.exc import DBAPIError

from outbox.errors import OutboxError
from outbox.kinds import ActionKind
from outbox.store.application import UPSERT_KIND
from outbox.store.caller import require_transaction
from outbox.store.migrations import (
    ACTIONS_OF_KINDS,
    ADOPT_EARLIER_REVISION,
    ALEMBIC_VERSION_EXISTS,
    DELETE_KIND_ROWS,
    DROP_VERSION_TABLE,
    EARLIER_REVISION,
    KIND_TABLE_EXISTS,
    LOCK,
    LOCK_KIND_ROWS,
    MIGRATION_LOCK,
    UNENDED_ACTIONS,
    VERSION_TABLE,
)
from outbox.store.operator import STORE_EXISTS

_PACKAGED = Path(__file__).resolve().parent / "migrations"
MIGRATIONS_DIR = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parent.parent / "migrations"

# An earlier release kept its revision in `alembic_version`; these were its revision ids.
_EARLIER_REVISIONS = ("0001", "0002", "0003")
# The kinds outbox's own revisions declare (their rows of agent_action_kind, written by 0007, 0011 and 0023): only a
# revision removes them, so forget_kinds refuses them. A test kind or an application's is never among them.
PRODUCTION_KINDS = frozenset({"EMAIL", "NATS_EVENT", "WEBHOOK", "SLACK_MESSAGE", "GITHUB_POST", "GITLAB_POST"})


DatabaseConnection = Connection | psycopg.Connection[Any]


class MigrationRefused(OutboxError):
    """A revision that does not exist, or a downgrade that would lose actions that have not ended."""


class MissingPrivilege(OutboxError):
    """The role that migrates lacks what a revision needs (CREATEROLE, to create outbox_reader)."""

    exit_code = 1  # the database refuses the role, as `outbox` reports it

    def __init__(self) -> None:
        super().__init__(
            "the upgrade creates the role outbox_reader (what dashboards and the metrics exporter read with),"
            " which needs the CREATEROLE attribute, and the role that runs it lacks it: have an administrator"
            " run `CREATE ROLE outbox_reader NOLOGIN` once on this server, or `ALTER ROLE <this role>"
            " CREATEROLE`, then upgrade again (nothing was changed)"
        )


# the statement of revision 0002 that creates the reader role when it does not exist
_CREATES_READER = "CREATE ROLE outbox_reader"
# PostgreSQL's insufficient_privilege
_INSUFFICIENT_PRIVILEGE = "42501"


def _config(connection: Connection | None = None) -> Config:
    config = Config(output_buffer=io.StringIO())
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@contextmanager
def _callers_alembic_kept() -> Iterator[None]:
    """`alembic.context` and `alembic.op` as they were before: the proxies of the Alembic run that called
    outbox (an application's revision), or none. Alembic installs its own for outbox's run and removes
    them when that run ends, which would leave the application's run without its own."""
    modules = (alembic.context, alembic.op)
    callers = [getattr(module, "_proxy", None) for module in modules]
    try:
        yield
    finally:
        for module, callers_proxy in zip(modules, callers, strict=True):
            left = getattr(module, "_proxy", None)
            if left is callers_proxy:
                continue
            if left is not None:  # outbox's, left behind by a revision that raised
                left._remove_proxy()
            if callers_proxy is not None:
                callers_proxy._install_proxy()


def _run(action: str, run: Callable[[], None]) -> None:
    try:
        with _callers_alembic_kept():
            run()
    except CommandError as error:
        raise MigrationRefused(f"{action}: {error}") from None
    except DBAPIError as error:
        # the server's message may be in any language: its code and outbox's own statement tell what failed
        if getattr(error.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE and _CREATES_READER in str(error.statement):
            raise MissingPrivilege() from None
        raise


class _CallersTransaction:
    """The DBAPI connection SQLAlchemy sees over a caller's psycopg connection: every statement goes to
    the caller's connection; its transaction, and the connection itself, stay the caller's."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def commit(self) -> None:
        """The caller commits."""

    def rollback(self) -> None:
        """The caller rolls back (an error reaches the caller, whose transaction then fails)."""

    def close(self) -> None:
        """The caller closes its connection."""

    def add_notice_handler(self, handler: Callable[[psycopg.errors.Diagnostic], None]) -> None:
        """SQLAlchemy's logging of server notices is left off the caller's connection: it would stay there."""


@contextmanager
def _sqlalchemy(connection: DatabaseConnection) -> Iterator[Connection]:
    """`connection` as a SQLAlchemy Connection, inside the caller's transaction."""
    if isinstance(connection, Connection):
        yield connection
        return
    if not isinstance(connection, psycopg.Connection):
        raise TypeError(
            f"outbox migrates on a SQLAlchemy Connection or a psycopg Connection, not a {type(connection).__name__}"
        )
    require_transaction(connection)
    callers = _CallersTransaction(connection)
    engine = create_engine(
        "postgresql+psycopg://",
        creator=lambda: callers,
        poolclass=StaticPool,
        pool_reset_on_return=None,
        use_native_hstore=False,  # nothing registered on the caller's connection
    )
    try:
        with engine.begin() as bound:
            yield bound
    finally:
        engine.dispose()


def _earlier_revision(connection: Connection) -> str | None:
    """The revision an earlier release left in `alembic_version`, while it has not been moved over."""
    if not connection.execute(ALEMBIC_VERSION_EXISTS).scalar_one():
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


def upgrade(connection: DatabaseConnection, revision: str = "head") -> None:
    """Migrate the database on `connection` up to `revision`, inside the connection's transaction."""
    with _sqlalchemy(connection) as bound:
        _run(f"cannot upgrade to {revision!r}", lambda: command.upgrade(_config(bound), revision))


def upgrade_sql(revisions: str = "base:head") -> str:
    """The SQL of the revisions `FROM:TO` (or `TO`, from the start), as a DBA would apply it; touches nothing."""
    config = _config()
    target = revisions if ":" in revisions else f"base:{revisions}"
    _run(f"cannot render {revisions!r}", lambda: command.upgrade(config, target, sql=True))
    buffer = config.output_buffer
    assert isinstance(buffer, io.StringIO)
    return buffer.getvalue()


def downgrade(connection: DatabaseConnection, revision: str = "base", *, force: bool = False) -> None:
    """Migrate down to `revision`; `base` removes every object outbox created. Refused while actions
    have not ended (they would be lost, or their revision's objects with them), unless `force`."""
    with _sqlalchemy(connection) as bound:
        _downgrade(bound, revision, force=force)


def _downgrade(connection: Connection, revision: str, *, force: bool) -> None:
    store = connection.execute(STORE_EXISTS).scalar_one()
    unended = int(connection.execute(UNENDED_ACTIONS).scalar_one()) if store else 0
    if unended and not force:
        raise MigrationRefused(
            f"{unended:,} actions have not ended; a downgrade could lose them or what they need."
            " Let them end (or cancel them), or downgrade with --force"
        )
    _run(f"cannot downgrade to {revision!r}", lambda: command.downgrade(_config(connection), revision))
    if current(connection) is None:  # nothing of outbox's is left: its version table goes too
        connection.execute(DROP_VERSION_TABLE)


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


class AlembicOperations(Protocol):
    """What outbox uses of Alembic's `op` (the module, or an `Operations` object) inside a revision."""

    def get_bind(self) -> Connection: ...


def _bound(target: AlembicOperations | DatabaseConnection) -> DatabaseConnection:
    return target if isinstance(target, Connection | psycopg.Connection) else target.get_bind()


def _chosen(kinds: Iterable[ActionKind]) -> tuple[ActionKind, ...]:
    chosen = tuple(kinds)
    for kind in chosen:
        if not isinstance(kind, ActionKind):
            raise TypeError(f"kinds are ActionKind values (from ActionKind.register), not {kind!r}")
    return chosen


def _require_kind_table(connection: Connection, action: str) -> None:
    if not connection.execute(KIND_TABLE_EXISTS).scalar_one():
        raise MigrationRefused(
            f"{action}: agent_action_kind does not exist; run outbox's revisions (0007 or later) first,"
            " in an earlier revision"
        )


def declare_kinds(target: AlembicOperations | DatabaseConnection, kinds: Iterable[ActionKind]) -> None:
    """Step 2 of "Add a kind": each kind's row in `agent_action_kind` is inserted, or updated to the
    kind's declaration (a row that already says so is left alone). `target` is Alembic's `op` inside a
    revision that runs after outbox's own, or a connection (SQLAlchemy or psycopg) inside its transaction.
    Kinds not given keep their rows."""
    chosen = _chosen(kinds)
    if not chosen:
        return
    with _sqlalchemy(_bound(target)) as connection:
        _require_kind_table(connection, "cannot declare kinds")
        connection.execute(
            UPSERT_KIND,
            [
                {
                    "name": kind.name,
                    "at_most_once": kind.at_most_once,
                    "instance_level": kind.instance_level,
                    "workspace_level": kind.workspace_level,
                }
                for kind in chosen
            ],
        )


def forget_kinds(target: AlembicOperations | DatabaseConnection, kinds: Iterable[ActionKind]) -> None:
    """The downgrade of `declare_kinds`: the kinds' rows are deleted. Refused while any action of one of
    them is left, ended or not (the retention purge deletes ended ones), and for outbox's own kinds."""
    names = sorted({kind.name for kind in _chosen(kinds)})
    own = [name for name in names if name in PRODUCTION_KINDS]
    if own:
        raise MigrationRefused(f"cannot forget {', '.join(own)}: outbox's revisions declare it, and remove it")
    if not names:
        return
    with _sqlalchemy(_bound(target)) as connection:
        _require_kind_table(connection, "cannot forget kinds")
        connection.execute(LOCK_KIND_ROWS, {"names": names})
        left = connection.execute(ACTIONS_OF_KINDS, {"names": names}).all()
        if left:
            counts = "; ".join(f"{row.kind}: {row.actions:,} left, {row.unended:,} not ended" for row in left)
            raise MigrationRefused(
                f"cannot forget kinds while actions of them are left ({counts}). Let them end and the retention"
                " purge delete them (or delete them), then downgrade again"
            )
        connection.execute(DELETE_KIND_ROWS, {"names": names})
