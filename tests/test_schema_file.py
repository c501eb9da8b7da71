"""`schema.sql` is what the migrations build today: dumped again here and compared, line for line."""

from __future__ import annotations

import difflib
import re

import pytest

from tests.schema_dump import SCHEMA_FILE, dump_of_a_migrated_database, server_major


def test_schema_sql_is_what_the_migrations_build(server_url: str) -> None:
    committed = SCHEMA_FILE.read_text()
    found = re.search(r"as PostgreSQL (\d+) dumps it", committed)
    assert found, "schema.sql lost its header: regenerate it with python -m tests.schema_dump"
    if server_major(server_url) != int(found.group(1)):
        pytest.skip(f"schema.sql is PostgreSQL {found.group(1)}'s dump; the test server is another major version")
    built = dump_of_a_migrated_database(server_url)
    stale = "".join(difflib.unified_diff(committed.splitlines(True), built.splitlines(True), "schema.sql", "built"))
    assert not stale, f"schema.sql is stale: regenerate it with python -m tests.schema_dump\n{stale[:4000]}"
