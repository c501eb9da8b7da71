"""The email kind's settings: the SMTP relay the email adapter sends through, from OUTBOX_SMTP_* variables,
read when the adapters are made:

    OUTBOX_SMTP_* ─ EmailSettings (pydantic) ─ SmtpSettings.from_settings ─▶ EmailAdapter
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox._internal.config.defaults import ENV_PREFIX


class EmailSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

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
    # the relay's rate, held by all executors together (`14/s`, `600/min`); unset: none, and the pace is
    # learned from the relay's slow-downs
    smtp_rate: str | None = None


def load_settings() -> EmailSettings:
    return EmailSettings()
