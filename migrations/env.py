"""Alembic environment of outbox: its revisions, its own version table, one migration at a time.

Online, it runs on the connection `outbox.migrate` hands over, inside that connection's transaction, after
`outbox.migrate.prepare` (advisory lock, an earlier release's revision moved over). Offline (`--sql`), it
renders the revisions as PostgreSQL statements and touches no database.
"""

from alembic import context

from outbox.migrate import VERSION_TABLE, prepare

config = context.config

if context.is_offline_mode():
    context.configure(
        dialect_name="postgresql",
        dialect_opts={"paramstyle": "named"},  # `%` in the functions' RAISE formats stays as written
        literal_binds=True,
        version_table=VERSION_TABLE,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    connection = config.attributes["connection"]
    context.configure(connection=connection, version_table=VERSION_TABLE, transactional_ddl=True)
    with context.begin_transaction():
        prepare(connection)
        context.run_migrations()
