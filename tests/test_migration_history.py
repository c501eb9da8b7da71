"""One migration history: outbox's revisions inside an application's own migrations, run by the real tools.

Each test writes a project of its own into tmp_path and runs its command line in a subprocess against an
empty database, the way an application runs it:

- Alembic (`alembic upgrade head`, `alembic downgrade base`): alembic.ini, env.py and versions/ holding the
  application's first revision (creates `account`), docs/adoption.md's revision that runs outbox's
  (`alembic-revision`, as written), docs/concepts.md's revision that declares a kind (`kind-revision`, with
  `kind-declaration` as the application's module), then a revision that uses `op.execute` and
  `op.add_column` on the application's table.
- Django (`manage.py migrate`, `manage.py migrate accounts zero`): an app whose migrations are a model,
  docs/adoption.md's `RunPython` migration (`django-migration`, as written), then a field added and the
  kind declared on Django's psycopg connection.

After the upgrade the schema holds outbox's tables, `outbox_alembic_version` at the pinned revision (which
`outbox db current` and `outbox db check` read) and the application's tables and version rows; an action
of the declared kind enqueues. A downgrade is refused while an action of the kind is left, then, without
it, leaves nothing of outbox's.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from examples.django_app.settings import database as django_database
from outbox import migrate
from outbox.kinds import ActionKind
from outbox.store.caller import NoTransaction
from tests.test_docs import example

BIN = Path(sys.executable).parent
TIMEOUT = 120  # seconds for one command line

ALEMBIC_REVISION, _ = example("alembic-revision")
DJANGO_MIGRATION, _ = example("django-migration")
KIND_DECLARATION, _ = example("kind-declaration")
KIND_REVISION, _ = example("kind-revision")
PINNED = re.search(r'outbox\.migrate\.upgrade\([^,]+, "(\w+)"\)', ALEMBIC_REVISION)


def assigned(code: str, name: str) -> str:
    """The string a module's code assigns to `name` at its top level."""
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            value = ast.literal_eval(node.value)
            assert isinstance(value, str), f"{name} = {value!r}"
            return value
    raise AssertionError(f"the code assigns no {name}")


def pinned_revision() -> str:
    assert PINNED is not None, "the alembic-revision example calls no outbox.migrate.upgrade(..., REVISION)"
    return PINNED.group(1)


OUTBOX_REVISION = assigned(ALEMBIC_REVISION, "revision")
ACCOUNT_REVISION = assigned(ALEMBIC_REVISION, "down_revision")
KIND_REVISION_ID = assigned(KIND_REVISION, "revision")
CONTACT_REVISION = "9c4d2e7f1a58"

ALEMBIC_INI = """\
[alembic]
script_location = %(here)s
prepend_sys_path = %(here)s
"""

ALEMBIC_ENV = '''\
"""The application's Alembic environment: one transaction for the whole run, as Alembic's template does."""

import os

from alembic import context
from sqlalchemy import create_engine

engine = create_engine(os.environ["APP_DATABASE_URL"])
with engine.connect() as connection:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
'''

ACCOUNT_ALEMBIC = f'''\
"""The application's accounts."""

from alembic import op

revision = "{ACCOUNT_REVISION}"
down_revision = None


def upgrade() -> None:
    op.execute("CREATE TABLE account (id bigint PRIMARY KEY, email text NOT NULL)")


def downgrade() -> None:
    op.drop_table("account")
'''

CONTACT_ALEMBIC = f'''\
"""An account's phone number, after outbox's revisions and kinds: the application's `op` still works."""

import sqlalchemy as sa
from alembic import op

revision = "{CONTACT_REVISION}"
down_revision = "{KIND_REVISION_ID}"


def upgrade() -> None:
    op.add_column("account", sa.Column("phone", sa.Text()))
    op.execute("INSERT INTO account VALUES (1, 'alice@example.com', '+15550100')")


def downgrade() -> None:
    op.execute("DELETE FROM account")
    op.drop_column("account", "phone")
'''

ENQUEUE_SMS = """\
import os

from sqlalchemy import create_engine

import outbox
from myapp.outbox_kinds import SMS

engine = create_engine(os.environ["APP_DATABASE_URL"])
with engine.begin() as conn:
    request = outbox.ActionRequest(
        kind=SMS, lane_key="account:1", idempotency_key="sms:1", payload={"text": "hi"}, subject_account_id=1
    )
    print(outbox.enqueue(conn, request).id)
engine.dispose()
"""

DJANGO_SETTINGS = """\
import json
import os

SECRET_KEY = "a test project, not a secret"
INSTALLED_APPS = ["accounts"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": json.loads(os.environ["APP_DATABASE"])}
"""

DJANGO_MANAGE = """\
import os
import sys

from django.core.management import execute_from_command_line

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_settings")
execute_from_command_line(sys.argv)
"""

DJANGO_MODELS = """\
from django.db import models


class Account(models.Model):
    email = models.TextField()
    phone = models.TextField(null=True)
"""

DJANGO_INITIAL = """\
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.CreateModel(
            name="Account",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("email", models.TextField()),
            ],
        )
    ]
"""

DJANGO_PHONE = """\
from django.db import migrations, models

import outbox.migrate
from accounts.outbox_kinds import SMS


def declare(apps, schema_editor):
    outbox.migrate.declare_kinds(schema_editor.connection.connection, [SMS])


def forget(apps, schema_editor):
    outbox.migrate.forget_kinds(schema_editor.connection.connection, [SMS])


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_outbox")]
    operations = [
        migrations.AddField(model_name="account", name="phone", field=models.TextField(null=True)),
        migrations.RunPython(declare, forget),
    ]
"""

# what a downgrade to base may leave in the database: the application tools' own version tables
PUBLIC_OBJECTS = text("""
SELECT relname AS name FROM pg_class
 WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
UNION ALL SELECT typname FROM pg_type
 WHERE typnamespace = 'public'::regnamespace AND typrelid = 0 AND typcategory <> 'A'
ORDER BY 1
""")


def write(root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def run(*command: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def succeeds(*command: str | Path, cwd: Path, env: dict[str, str]) -> str:
    result = run(*command, cwd=cwd, env=env)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def libpq(url: str) -> str:
    """A SQLAlchemy URL as libpq's, for a psycopg connection of the test's own."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def rows(conn: Connection, sql: str) -> list[tuple[object, ...]]:
    return [tuple(row) for row in conn.execute(text(sql))]


def assert_outbox_schema(conn: Connection) -> None:
    """outbox's tables, at the pinned revision, with the kind the application declared."""
    assert conn.execute(text("SELECT version_num FROM outbox_alembic_version")).scalars().all() == [pinned_revision()]
    for table in ("agent_action", "agent_action_kind"):
        assert conn.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar_one() is not None, table
    assert rows(
        conn, "SELECT at_most_once, instance_level, workspace_level FROM agent_action_kind WHERE name = 'SMS'"
    ) == [(True, True, False)]


def sms_action(conn: Connection) -> list[tuple[object, ...]]:
    return rows(conn, "SELECT kind, workspace_id, state FROM agent_action")


# -- Alembic


@pytest.fixture
def alembic_project(tmp_path: Path) -> Path:
    write(
        tmp_path,
        {
            "alembic.ini": ALEMBIC_INI,
            "env.py": ALEMBIC_ENV,
            "myapp/__init__.py": "",
            "myapp/outbox_kinds.py": KIND_DECLARATION,
            "versions/0001_account.py": ACCOUNT_ALEMBIC,
            "versions/0002_outbox.py": ALEMBIC_REVISION,
            "versions/0003_outbox_kinds.py": KIND_REVISION,
            "versions/0004_phone.py": CONTACT_ALEMBIC,
            "enqueue_sms.py": ENQUEUE_SMS,
        },
    )
    return tmp_path


def test_the_examples_chain_into_one_history() -> None:
    assert assigned(KIND_REVISION, "down_revision") == OUTBOX_REVISION
    assert pinned_revision() == migrate.head(), "the alembic-revision example pins the newest revision"


def test_alembic_runs_outbox_s_revisions_and_kinds_inside_the_application_s_history(
    alembic_project: Path, empty_database_url: str
) -> None:
    env = {"APP_DATABASE_URL": empty_database_url}
    alembic = BIN / "alembic"
    succeeds(alembic, "upgrade", "head", cwd=alembic_project, env=env)

    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            assert_outbox_schema(conn)
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [CONTACT_REVISION]
            assert rows(conn, "SELECT id, email, phone FROM account") == [(1, "alice@example.com", "+15550100")]

        current = succeeds(
            BIN / "outbox", "db", "current", "--database-url", empty_database_url, cwd=alembic_project, env={}
        )
        assert current.strip() == f"{pinned_revision()} (the newest)"
        succeeds(BIN / "outbox", "db", "check", "--database-url", empty_database_url, cwd=alembic_project, env={})

        succeeds(sys.executable, "enqueue_sms.py", cwd=alembic_project, env=env)
        with engine.connect() as conn:
            assert sms_action(conn) == [("SMS", None, "ADMITTED")]

        refused = run(alembic, "downgrade", "base", cwd=alembic_project, env=env)
        assert refused.returncode == 1
        assert "cannot forget kinds while actions of them are left (SMS: 1 left, 1 not ended)" in refused.stderr
        with engine.begin() as conn:  # the whole downgrade rolled back, the application's step included
            assert rows(conn, "SELECT id, phone FROM account") == [(1, "+15550100")]
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == CONTACT_REVISION
            conn.execute(text("DELETE FROM agent_action"))

        succeeds(alembic, "downgrade", "base", cwd=alembic_project, env=env)
        with engine.connect() as conn:
            assert conn.execute(PUBLIC_OBJECTS).scalars().all() == ["alembic_version"]
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 0
    finally:
        engine.dispose()


# -- Django


@pytest.fixture
def django_project(tmp_path: Path) -> Path:
    write(
        tmp_path,
        {
            "manage.py": DJANGO_MANAGE,
            "site_settings.py": DJANGO_SETTINGS,
            "accounts/__init__.py": "",
            "accounts/models.py": DJANGO_MODELS,
            "accounts/outbox_kinds.py": KIND_DECLARATION,
            "accounts/migrations/__init__.py": "",
            "accounts/migrations/0001_initial.py": DJANGO_INITIAL,
            "accounts/migrations/0002_outbox.py": DJANGO_MIGRATION,
            "accounts/migrations/0003_phone.py": DJANGO_PHONE,
        },
    )
    return tmp_path


def test_django_runs_outbox_s_revisions_inside_its_migrations(django_project: Path, empty_database_url: str) -> None:
    env = {"APP_DATABASE": json.dumps(django_database(empty_database_url))}
    succeeds(sys.executable, "manage.py", "migrate", "--no-input", cwd=django_project, env=env)

    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            assert_outbox_schema(conn)
            assert rows(conn, "SELECT name FROM django_migrations WHERE app = 'accounts' ORDER BY name") == [
                ("0001_initial",),
                ("0002_outbox",),
                ("0003_phone",),
            ]
            assert rows(
                conn,
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'accounts_account'"
                " ORDER BY column_name",
            ) == [("email",), ("id",), ("phone",)]
        succeeds(BIN / "outbox", "db", "check", "--database-url", empty_database_url, cwd=django_project, env={})

        succeeds(sys.executable, "manage.py", "migrate", "accounts", "zero", "--no-input", cwd=django_project, env=env)
        with engine.connect() as conn:
            assert conn.execute(PUBLIC_OBJECTS).scalars().all() == ["django_migrations", "django_migrations_id_seq"]
    finally:
        engine.dispose()


# -- what the helpers refuse


def test_a_psycopg_connection_without_a_transaction_is_refused_and_nothing_is_migrated(
    empty_database_url: str,
) -> None:
    with psycopg.connect(libpq(empty_database_url), autocommit=True) as conn:
        with pytest.raises(NoTransaction):
            migrate.upgrade(conn)
        assert conn.execute("SELECT to_regclass('outbox_alembic_version')").fetchone() == (None,)


def test_kinds_are_declared_only_after_outbox_s_revisions(empty_database_url: str) -> None:
    sms = ActionKind("SMS", at_most_once=True, instance_level=True, workspace_level=False)
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            with pytest.raises(migrate.MigrationRefused, match="agent_action_kind does not exist; run outbox's"):
                migrate.declare_kinds(conn, [sms])
            with pytest.raises(TypeError, match=r"kinds are ActionKind values .* not 'SMS'"):
                migrate.declare_kinds(conn, ["SMS"])  # type: ignore[list-item]
            with pytest.raises(migrate.MigrationRefused, match="cannot forget EMAIL: outbox's revisions declare it"):
                migrate.forget_kinds(conn, [ActionKind.EMAIL])
    finally:
        engine.dispose()


def test_a_caller_s_sql_is_kept_by_the_psycopg_path(empty_database_url: str) -> None:
    """outbox commits, rolls back and changes nothing on the caller's psycopg connection: the caller's
    rollback takes outbox's revisions with it, the caller's commit keeps them."""
    url = libpq(empty_database_url)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE mine (id int)")
        handlers = list(conn._notice_handlers)
        migrate.upgrade(conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn._notice_handlers == handlers, "the caller's connection is left as it was"
        conn.rollback()
        assert conn.execute("SELECT to_regclass('agent_action'), to_regclass('mine')").fetchone() == (None, None)
        conn.rollback()
        migrate.upgrade(conn)
        conn.commit()
    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            assert migrate.current(conn) == migrate.head()
    finally:
        engine.dispose()
