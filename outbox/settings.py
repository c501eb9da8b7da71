"""Configuration: every setting comes from an `OUTBOX_` environment variable, read in one place.

    OUTBOX_* variables ─ Settings (pydantic; defaults and names from `outbox._internal.config.defaults`)
        ─▶ the flows, the demo

The `outbox` commands read the same variables, with the same defaults, as their options (`--database-url`,
`--connect-timeout`, `--statement-timeout`) without loading this module. The email kind's SMTP settings
are the email adapter's (`outbox.email.settings`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox._internal.config.defaults import ENV_PREFIX, SETTINGS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # what each setting means: `outbox._internal.config.defaults.SettingDefaults`
    database_url: str | None = SETTINGS.database_url
    listen_database_url: str | None = SETTINGS.listen_database_url
    # code that builds its engines from these settings passes both timeouts to `outbox.db.sync_engine` /
    # `async_engine` through `engine_timeouts`
    connect_timeout_seconds: float = SETTINGS.connect_timeout_seconds
    statement_timeout_seconds: float = SETTINGS.statement_timeout_seconds
    data_dir: Path = SETTINGS.data_dir
    lease_seconds: float = SETTINGS.lease_seconds
    environment: str = SETTINGS.environment

    def engine_timeouts(self) -> dict[str, float | None]:
        """The two timeouts as `outbox.db.sync_engine` and `async_engine` take them (0: no limit)."""
        return {
            "connect_timeout": self.connect_timeout_seconds or None,
            "statement_timeout": self.statement_timeout_seconds or None,
        }


def load_settings() -> Settings:
    return Settings()
