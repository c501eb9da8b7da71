"""The NATS_EVENT kind's settings: the NATS servers the adapter and `outbox nats ensure-stream` reach, from
OUTBOX_NATS_* variables, read when the adapters are made or the command runs:

    OUTBOX_NATS_URL ─ NatsSettings (pydantic) ─ NatsConfig.from_settings (each URL checked) ─▶ NatsAdapter

OUTBOX_NATS_URL is one or more `nats://[user:password@]host[:port]` or `nats://token@host[:port]` URLs, comma
separated (the servers of one cluster); OUTBOX_NATS_CREDENTIALS a creds file (a user JWT and its NKey seed).
A URL's password or token is never logged nor shown: `NatsConfig.shown` renders the URLs with it as ***.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox._internal.config.defaults import ENV_PREFIX
from outbox._internal.redaction.masking import MASK

DEFAULT_PORT = 4222


class NatsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # the servers, comma separated (a password in one is never logged)
    nats_url: SecretStr | None = None
    # a creds file for servers that authenticate with JWTs
    nats_credentials: Path | None = None
    # the longest one publish waits for its acknowledgement (the write window bounds it too)
    nats_publish_timeout_seconds: float = 10.0


class NatsSettingsError(ValueError):
    """A NATS setting that cannot be used; names the setting, never a password."""


@dataclass(frozen=True)
class NatsConfig:
    servers: tuple[str, ...] = field(repr=False)
    credentials: Path | None = None
    publish_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not self.servers:
            raise NatsSettingsError("OUTBOX_NATS_URL: give one or more nats:// URLs, comma separated")
        for server in self.servers:
            check_url(server)
        if self.credentials is not None and not self.credentials.is_file():
            raise NatsSettingsError(f"OUTBOX_NATS_CREDENTIALS: {self.credentials} is not a readable file")
        if not 0 < self.publish_timeout_seconds <= 60:
            raise NatsSettingsError("OUTBOX_NATS_PUBLISH_TIMEOUT_SECONDS: more than 0 and at most 60 seconds")

    @classmethod
    def from_settings(cls, settings: NatsSettings) -> NatsConfig:
        if settings.nats_url is None:
            raise NatsSettingsError("OUTBOX_NATS_URL is not set: give one or more nats:// URLs, comma separated")
        return cls(
            servers=parse_servers(settings.nats_url.get_secret_value()),
            credentials=settings.nats_credentials,
            publish_timeout_seconds=settings.nats_publish_timeout_seconds,
        )

    @property
    def shown(self) -> str:
        """The servers as a log line may show them: each password as ***."""
        return ",".join(shown_url(server) for server in self.servers)

    def __repr__(self) -> str:
        return f"NatsConfig(servers={self.shown!r}, credentials={self.credentials!r})"


def parse_servers(value: str) -> tuple[str, ...]:
    """The URLs of a comma-separated list, each stripped; empty items are refused."""
    servers = tuple(part.strip() for part in value.split(","))
    if any(not server for server in servers):
        raise NatsSettingsError("OUTBOX_NATS_URL: an empty URL in the comma-separated list")
    return servers


def check_url(url: str) -> None:
    """A `nats://[user[:password]@]host[:port]` URL and nothing more, or NatsSettingsError (the URL shown
    with its password as ***)."""
    if any(ord(char) < 33 or ord(char) == 127 for char in url):
        raise NatsSettingsError("OUTBOX_NATS_URL: a URL holds a space or a control character")
    shown = shown_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise NatsSettingsError(f"OUTBOX_NATS_URL: {shown!r} is not a URL with a valid port") from None
    if parts.scheme != "nats":
        raise NatsSettingsError(f"OUTBOX_NATS_URL: {shown!r} must start with nats://")
    if not parts.hostname:
        raise NatsSettingsError(f"OUTBOX_NATS_URL: {shown!r} names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise NatsSettingsError(f"OUTBOX_NATS_URL: {shown!r} must hold no path, query or fragment")
    if port == 0:
        raise NatsSettingsError(f"OUTBOX_NATS_URL: {shown!r} has port 0")


def shown_url(url: str) -> str:
    """`url` with the password of its user information (everything after the user's name up to the last
    `@`) as ***, and a user information without a password (a token: `nats://TOKEN@host`) as *** whole."""
    scheme, separator, rest = url.partition("://") if "://" in url else ("", "", url)
    user_info, at, host = rest.rpartition("@")
    if not at:
        return url
    user, _, password = user_info.partition(":")
    return f"{scheme}{separator}{user + ':' + MASK if password else MASK}@{host}"


def load_config() -> NatsConfig:
    return NatsConfig.from_settings(NatsSettings())
