"""Schema migrations: Alembic on the revisions in `migrations/`, for `outbox db upgrade|downgrade`."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def _config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Migrate the database on `connection` up to `revision`, in one transaction."""
    command.upgrade(_config(connection), revision)


def downgrade(connection: Connection, revision: str = "base") -> None:
    """Migrate down to `revision`; `base` removes every object outbox created."""
    command.downgrade(_config(connection), revision)
