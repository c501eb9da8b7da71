"""Configuration: every setting comes from an `OUTBOX_` environment variable, read in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.executor.config import DEFAULTS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore")

    # SQLAlchemy URL of the outbox database (the flows read it here; the commands take it as --database-url,
    # which reads the same variable); unset, every command but `outbox demo` refuses to start
    database_url: str | None = None
    # seconds to wait for a connection to the database, and for one statement (0: no limit); the commands
    # read OUTBOX_CONNECT_TIMEOUT_SECONDS and OUTBOX_STATEMENT_TIMEOUT_SECONDS themselves, as their options
    # --connect-timeout and --statement-timeout, without loading this object; code that builds its engines
    # from these settings passes both to `outbox.db.sync_engine` / `async_engine` (seconds, None for 0)
    connect_timeout_seconds: float = 10.0
    statement_timeout_seconds: float = 30.0
    # where `outbox demo` keeps its embedded PostgreSQL, data and logs when it is given no database
    data_dir: Path = Path(".outbox")

    # a claim's lease in the drain flow's executor (more than the 60 s write window)
    lease_seconds: float = DEFAULTS.lease_seconds
    # names this installation in the drain runs' Prefect tags (`env:<environment>`)
    environment: str = "default"

    # the SMTP relay of the email adapter (the password is never logged)
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 8025
    smtp_sender: str = "outbox@localhost"
    smtp_sender_name: str = "outbox"
    # the name EHLO gives the relay; unset: the sender's domain, else this machine's FQDN (when either is a
    # public host name), else the address literal of the connection's own end; never localhost unless set
    smtp_helo_name: str | None = None
    smtp_tls: Literal["auto", "starttls", "implicit", "none"] = "auto"
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_timeout_seconds: float = 30.0
    smtp_ca_file: Path | None = None

    def engine_timeouts(self) -> dict[str, float | None]:
        """The two timeouts as `outbox.db.sync_engine` and `async_engine` take them (0: no limit)."""
        return {
            "connect_timeout": self.connect_timeout_seconds or None,
            "statement_timeout": self.statement_timeout_seconds or None,
        }


def load_settings() -> Settings:
    return Settings()
