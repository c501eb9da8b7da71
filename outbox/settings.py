"""Configuration: every setting comes from an `OUTBOX_` environment variable, read in one place."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore")

    # SQLAlchemy URL of the outbox database; unset: local commands start an embedded PostgreSQL
    database_url: str | None = None
    # where the embedded PostgreSQL keeps its data when OUTBOX_DATABASE_URL is unset
    data_dir: Path = Path(".outbox")


def load_settings() -> Settings:
    return Settings()
