"""What a registered provider URL may be: the checks the webhook endpoints, GitHub accounts and GitLab hosts share
(and the SMTP relay's TLS default: none only to a loopback address).

    register_endpoint / register_account / register_host ──url──▶ is_host (a domain name or an IP address)
                                          GitHub, GitLab only ──▶ check_api_url (https, or http to a loopback
                                                                  address; no user, query or fragment)

A URL is checked when the application registers it, so a bad one fails at start-up with the owner and the rule
it broke named, never at the first attempt.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_host(host: str) -> bool:
    """`host` is an IP address, or a domain name of at most 253 characters in labels of letters, digits and -."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_api_url(owner: str, url: object) -> None:
    """ValueError naming `owner` ("GitHub account main") unless `url` is an API's base URL a token may be sent
    to: absolute, https (http only to a loopback address: a token never crosses a network in clear), without
    a user or password, a query or a fragment, at most MAX_URL_LENGTH ASCII characters."""

    def refuse(why: str) -> ValueError:
        return ValueError(f"url: {owner}'s url {why}")

    if not isinstance(url, str):
        raise refuse(f"must be text, not a {type(url).__name__}")
    if len(url) > MAX_URL_LENGTH or not url.isascii() or any(c.isspace() for c in url):
        raise refuse(f"must be at most {MAX_URL_LENGTH} ASCII characters without spaces")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise refuse("cannot be read as a URL (its host or port)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not is_host(parts.hostname):
        raise refuse("must be absolute, https://<host>[:port][/path]")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise refuse("must hold no user or password (the token authenticates outbox)")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise refuse("must have no query or fragment")
    if port == 0:
        raise refuse("must have a port from 1 to 65535")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise refuse("must be https: the token would cross the network in clear (http only to a loopback address)")
