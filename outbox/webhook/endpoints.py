"""Webhook endpoints: where each event goes and the secret that signs it, registered in code.

    register_endpoint(name, url, secret=None) ──checks name, url, secret──▶ WebhookEndpoint (the registry)
    WebhookAdapter(...) ──endpoint_secrets(endpoint)──▶ the given secret
                                                      ─ else env OUTBOX_WEBHOOK_SECRET_<NAME>
                                                      ─ else each secret source, in the order added
                                                      ─ none ─▶ WebhookSecretError naming every place asked
                                                      ─ not whsec_ + base64 ─▶ WebhookSecretError naming where
                        ─▶ one secret, or two while it is rotated ("whsec_new whsec_old"): each signs

An endpoint's URL is the registry's alone: no payload names a URL, so an action can only reach an endpoint
the application registered. A secret is looked up when the adapter is built, so `outbox run` refuses to
start without one rather than failing at the first attempt. Errors name the endpoint and the places
asked (the variable, a Prefect Secret block), never the secret.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import NoReturn
from urllib.parse import urlsplit

from outbox._internal.checks.provider_urls import MAX_URL_LENGTH, is_host
from outbox._internal.config.credentials import Source, SourceLabel, Sources
from outbox._internal.config.rates import Rate, parse_rate
from outbox.errors import OutboxError

SECRET_PREFIX = "whsec_"
# the secrets one value may hold: the endpoint's, and while it is rotated the previous one too
MAX_SECRETS = 2
# the key a secret holds, decoded: 24 to 64 bytes, as Standard Webhooks asks
SECRET_BYTES = range(24, 65)
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# the characters RFC 3986 lets a URL hold
_URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
# a URL's authority: a host name or an address, or an IPv6 address in brackets; then a port, or nothing
_AUTHORITY = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\[\]:@]+)(?::[0-9]{0,5})?")

_ENDPOINTS: dict[str, WebhookEndpoint] = {}
_SOURCES = Sources("secret")


class UnknownEndpoint(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_ENDPOINTS)) or "none"
        super().__init__(f"no webhook endpoint is registered as {name!r} (registered: {known})")


class WebhookSecretError(OutboxError, ValueError):
    """An endpoint has no secret, or one that is not `whsec_` + base64: one line naming the endpoint and where
    it was looked for (the code, the variable, each secret source), never the secret. Raised once, when the
    adapter is built; `outbox run` and the drain flow print it as their one line and end."""


@dataclass(frozen=True)
class WebhookEndpoint:
    name: str
    url: str
    # None: looked up when the adapter is built (`endpoint_secrets`); two separated by a space while rotating
    secret: str | None = field(default=None, repr=False)
    # the endpoint's rate for all executors together; None: none, the pace is learned from its 429s
    rate: Rate | None = None

    @property
    def destination(self) -> str:
        """The destination of this endpoint's webhooks (outbox.executor.destinations)."""
        return destination_name(self.name)

    @property
    def secret_variable(self) -> str:
        """The environment variable that holds the endpoint's secret when none is given in code."""
        return secret_variable(self.name)


def destination_name(endpoint: str) -> str:
    """The destination of the webhooks to the endpoint named `endpoint`."""
    return f"webhook:{endpoint}"


def secret_variable(name: str) -> str:
    return "OUTBOX_WEBHOOK_SECRET_" + name.upper().replace("-", "_")


def register_endpoint(name: str, url: str, *, secret: str | None = None, rate: str | None = None) -> WebhookEndpoint:
    """Add an endpoint; registering the same declaration again is harmless. ValueError names the field.
    `rate`: the most webhooks a unit of time all executors together send it (`10/s`, `600/min`)."""
    check_name(name)
    check_url(name, url)
    if secret is not None:
        check_secrets(name, secret, "the secret given to register_endpoint")
    endpoint = WebhookEndpoint(name, url, secret, parse_rate(rate, "rate") if rate is not None else None)
    known = _ENDPOINTS.get(name)
    if known is not None and known != endpoint:
        raise ValueError(f"name: a webhook endpoint named {name!r} is already registered with another url or secret")
    for other in _ENDPOINTS.values():
        if other.name != name and other.secret_variable == endpoint.secret_variable:
            raise ValueError(f"name: {name!r} and {other.name!r} would read the same {endpoint.secret_variable}")
    _ENDPOINTS[name] = endpoint
    return endpoint


def endpoint_named(name: object) -> WebhookEndpoint:
    endpoint = _ENDPOINTS.get(name) if isinstance(name, str) else None
    if endpoint is None:
        raise UnknownEndpoint(name)
    return endpoint


def registered_endpoints() -> tuple[WebhookEndpoint, ...]:
    return tuple(_ENDPOINTS[name] for name in sorted(_ENDPOINTS))


def add_secret_source(source: Source, *, label: SourceLabel | None = None) -> None:
    """Ask `source(endpoint name)` for a secret when neither the code nor the environment gives one; sources
    are asked in the order added, and None passes to the next. `label(endpoint name)` says where the source
    looks, for the error that names every place asked (default: `the secret source <its name>`)."""
    _SOURCES.add(source, label)


def endpoint_secrets(endpoint: WebhookEndpoint) -> tuple[str, ...]:
    """The endpoint's secrets: given in code, else from its environment variable, else from a secret source.
    One, or two while the secret is rotated (the new one, then the previous one); each signs every request."""
    if endpoint.secret is not None:
        return check_secrets(endpoint.name, endpoint.secret, "the secret given to register_endpoint")
    variable = endpoint.secret_variable
    found = _SOURCES.find(endpoint.name, variable, owner=f"webhook endpoint {endpoint.name}", error=WebhookSecretError)
    if found is not None:
        return check_secrets(endpoint.name, *found)
    asked = ["the code (register_endpoint's secret=)", variable, *_SOURCES.asked(endpoint.name)]
    return _no_secret(endpoint.name, asked)


def _no_secret(name: str, asked: list[str]) -> NoReturn:
    places = ", ".join(asked[:-1]) + " nor " + asked[-1]
    raise WebhookSecretError(
        f"webhook endpoint {name} has no secret: neither {places} holds one; put {SECRET_PREFIX} and the"
        " base64 of 24 to 64 random bytes in one of them"
    )


def check_secrets(name: str, value: object, where: str) -> tuple[str, ...]:
    """The secrets `value` holds, separated by spaces: one, or two while rotating (the new one, then the
    previous one); each `whsec_` and base64. WebhookSecretError naming `where` otherwise."""
    if not isinstance(value, str):
        raise WebhookSecretError(f"webhook endpoint {name}: {where} must be text, not a {type(value).__name__}")
    secrets = tuple(value.split())
    if not 1 <= len(secrets) <= MAX_SECRETS:
        raise WebhookSecretError(
            f"webhook endpoint {name}: {where} holds {len(secrets)} secrets; one, or two separated by a space"
            " while rotating (the new one, then the previous one)"
        )
    for number, secret in enumerate(secrets, 1):
        check_secret(name, secret, where if len(secrets) == 1 else f"{where} (secret {number} of {len(secrets)})")
    return secrets


def check_name(name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "name: a webhook endpoint's name is 1 to 63 lower case letters, digits, _ and -, starting with a"
            f" letter or digit, not {_shown(name)}"
        )


def check_url(name: str, url: object) -> None:
    def refuse(why: str) -> ValueError:
        return ValueError(f"url: webhook endpoint {name}'s url {why}")

    if not isinstance(url, str):
        raise refuse(f"must be text, not a {type(url).__name__}")
    if len(url) > MAX_URL_LENGTH or not _URL_CHARACTERS.fullmatch(url):
        raise refuse(f"must be at most {MAX_URL_LENGTH} of the characters a URL holds (RFC 3986)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise refuse("cannot be read as a URL (its host or port)") from None
    if parts.scheme not in ("http", "https"):
        raise refuse("must be absolute, with the scheme http or https")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise refuse("must hold no user or password (the signature authenticates outbox)")
    if not parts.hostname or not _AUTHORITY.fullmatch(parts.netloc) or not is_host(parts.hostname):
        raise refuse("must name a host: a domain name or an IP address")
    if parts.fragment or "#" in url:
        raise refuse("must have no fragment")
    if port == 0:
        raise refuse("must have a port from 1 to 65535")


def check_secret(name: str, secret: object, where: str) -> str:
    """`secret` when it is `whsec_` and the base64 of 24 to 64 bytes; else WebhookSecretError naming `where`."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise WebhookSecretError(f"webhook endpoint {name}: {where} must start with {SECRET_PREFIX}")
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSecretError(f"webhook endpoint {name}: {where} is not {SECRET_PREFIX} and base64") from None
    if len(key) not in SECRET_BYTES:
        raise WebhookSecretError(
            f"webhook endpoint {name}: {where} holds {len(key)} bytes; a key of {SECRET_BYTES.start} to"
            f" {SECRET_BYTES.stop - 1} is needed"
        )
    return secret


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"
