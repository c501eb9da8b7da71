"""Webhook endpoints: where each event goes and the secret that signs it, registered in code.

    register_endpoint(name, url, secret=None) ──checks name, url, secret──▶ WebhookEndpoint (the registry)
    WebhookAdapter(...) ──endpoint_secret(endpoint)──▶ the given secret
                                                    ─ else env OUTBOX_WEBHOOK_SECRET_<NAME>
                                                    ─ else each secret source, in the order added
                                                    ─ none, or not whsec_ + base64 ─▶ WebhookSecretError

An endpoint's URL is the registry's alone: no payload names a URL, so an action can only reach an endpoint
the application registered. A secret is looked up when the adapter is built, so `outbox run` refuses to
start without one rather than failing at the first attempt. Errors name the endpoint and the variable,
never the secret.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from outbox.errors import OutboxError

SecretSource = Callable[[str], str | None]

SECRET_PREFIX = "whsec_"
# the key a secret holds, decoded: 24 to 64 bytes, as Standard Webhooks asks
SECRET_BYTES = range(24, 65)
MAX_URL_LENGTH = 2048
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# the characters RFC 3986 lets a URL hold
_URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
# a URL's authority: a host name or an address, or an IPv6 address in brackets; then a port, or nothing
_AUTHORITY = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\[\]:@]+)(?::[0-9]{0,5})?")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

_ENDPOINTS: dict[str, WebhookEndpoint] = {}
_SOURCES: list[SecretSource] = []


class UnknownEndpoint(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_ENDPOINTS)) or "none"
        super().__init__(f"no webhook endpoint is registered as {name!r} (registered: {known})")


class WebhookSecretError(OutboxError, ValueError):
    """An endpoint has no secret, or one that is not `whsec_` + base64. Names the endpoint, never the secret."""


@dataclass(frozen=True)
class WebhookEndpoint:
    name: str
    url: str
    # None: looked up when the adapter is built (`endpoint_secret`)
    secret: str | None = field(default=None, repr=False)

    @property
    def secret_variable(self) -> str:
        """The environment variable that holds the endpoint's secret when none is given in code."""
        return secret_variable(self.name)


def secret_variable(name: str) -> str:
    return "OUTBOX_WEBHOOK_SECRET_" + name.upper().replace("-", "_")


def register_endpoint(name: str, url: str, *, secret: str | None = None) -> WebhookEndpoint:
    """Add an endpoint; registering the same declaration again is harmless. ValueError names the field."""
    check_name(name)
    check_url(name, url)
    if secret is not None:
        check_secret(name, secret, "the secret given to register_endpoint")
    endpoint = WebhookEndpoint(name, url, secret)
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


def add_secret_source(source: SecretSource) -> None:
    """Ask `source(endpoint name)` for a secret when neither the code nor the environment gives one; sources
    are asked in the order added, and None passes to the next."""
    if source not in _SOURCES:
        _SOURCES.append(source)


def endpoint_secret(endpoint: WebhookEndpoint) -> str:
    """The endpoint's secret: given in code, else from its environment variable, else from a secret source."""
    if endpoint.secret is not None:
        return endpoint.secret
    variable = endpoint.secret_variable
    found = os.environ.get(variable)
    if found is not None:
        return check_secret(endpoint.name, found, variable)
    for source in _SOURCES:
        where = f"the secret source {getattr(source, '__qualname__', type(source).__name__)}"
        try:
            found = source(endpoint.name)
        except Exception as error:
            raise WebhookSecretError(
                f"webhook endpoint {endpoint.name}: {where} failed ({type(error).__name__})"
            ) from None
        if found is not None:
            return check_secret(endpoint.name, found, where)
    raise WebhookSecretError(
        f"webhook endpoint {endpoint.name} has no secret: set {variable} (whsec_ and base64), "
        "give secret= to register_endpoint, or add a secret source"
    )


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
    if not parts.hostname or not _AUTHORITY.fullmatch(parts.netloc) or not _is_host(parts.hostname):
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


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"
