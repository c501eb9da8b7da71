"""GitLab hosts: the GitLab instances posts go to and the access token each is reached with, registered in code.

    register_host(name, url, token=None, rate="300/min") ──checks name, url, token──▶ GitlabHost (the registry)
    GitlabAdapter(...) ──host_token(host)──▶ the given token
                                           ─ else env OUTBOX_GITLAB_TOKEN_<NAME>
                                           ─ else each token source, in the order added (a Prefect Secret block)
                                           ─ none, or not a token's characters ─▶ GitlabTokenError naming every
                                             place asked, never the token

A host's URL is the registry's alone: a payload names a host by its registered name, never a URL, so an action
can only reach a GitLab the application registered, with the token registered for it. The URL is https, or
http only to a loopback address (a token is never sent in clear over a network). A token is looked up when the
adapter is built, so `outbox run` refuses to start without one rather than failing at the first attempt.

Each host is one destination, `gitlab:<name>`: GitLab's limits hold per user, and one token is one user, so
every post through it shares one pace. The default rate, 300 a minute, is what GitLab documents as its default
limit on creating notes and on creating issues per user; a host whose administrators set other limits is
registered with its own (`rate="60/min"`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn

from outbox._internal.checks.provider_urls import check_api_url
from outbox._internal.config.credentials import Source, SourceLabel, Sources
from outbox._internal.config.rates import Rate, parse_rate
from outbox.errors import OutboxError

# GitLab's default limits on notes and on issues created by one user: 300 a minute each
DEFAULT_RATE = "300/min"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# what a personal, project or group access token (glpat-...) or an OAuth token is made of
_TOKEN = re.compile(r"[A-Za-z0-9_.\-]{20,1024}")

_HOSTS: dict[str, GitlabHost] = {}
_SOURCES = Sources("token")


class UnknownHost(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_HOSTS)) or "none"
        super().__init__(f"no GitLab host is registered as {_shown(name)} (registered: {known})")


class GitlabTokenError(OutboxError, ValueError):
    """A host has no token, or one that is not a token's characters: one line naming the host and where it
    was looked for (the code, the variable, each token source), never the token. Raised once, when the
    adapter is built; `outbox run` prints it as its one line and ends."""


@dataclass(frozen=True)
class GitlabHost:
    name: str
    # the instance's base URL, such as https://gitlab.com (the API is under /api/v4)
    url: str
    # None: looked up when the adapter is built (`host_token`)
    token: str | None = field(default=None, repr=False)
    # the host's rate for all executors together; None: none, the pace is learned from its 429s
    rate: Rate | None = field(default_factory=lambda: parse_rate(DEFAULT_RATE, "rate"))

    @property
    def destination(self) -> str:
        """The destination of every post to this host (outbox.executor.destinations)."""
        return destination_name(self.name)

    @property
    def token_variable(self) -> str:
        """The environment variable that holds the host's token when none is given in code."""
        return token_variable(self.name)


def destination_name(host: str) -> str:
    return f"gitlab:{host}"


def token_variable(name: str) -> str:
    return "OUTBOX_GITLAB_TOKEN_" + name.upper().replace("-", "_")


def register_host(name: str, url: str, *, token: str | None = None, rate: str | None = DEFAULT_RATE) -> GitlabHost:
    """Add a GitLab host; registering the same declaration again is harmless. ValueError names the field.
    `rate`: the most posts a unit of time all executors together make there (`300/min`, `5/s`); None: no
    configured rate, the pace is learned from GitLab's 429s alone."""
    check_name(name)
    check_url(name, url)
    if token is not None:
        check_token(name, token, "the token given to register_host")
    host = GitlabHost(name, url.rstrip("/"), token, None if rate is None else parse_rate(rate, "rate"))
    known = _HOSTS.get(name)
    if known is not None and known != host:
        raise ValueError(f"name: a GitLab host named {name!r} is already registered with another url, token or rate")
    for other in _HOSTS.values():
        if other.name != name and other.token_variable == host.token_variable:
            raise ValueError(f"name: {name!r} and {other.name!r} would read the same {host.token_variable}")
    _HOSTS[name] = host
    return host


def host_named(name: object) -> GitlabHost:
    host = _HOSTS.get(name) if isinstance(name, str) else None
    if host is None:
        raise UnknownHost(name)
    return host


def registered_hosts() -> tuple[GitlabHost, ...]:
    return tuple(_HOSTS[name] for name in sorted(_HOSTS))


def add_token_source(source: Source, *, label: SourceLabel | None = None) -> None:
    """Ask `source(host name)` for a token when neither the code nor the environment gives one; sources are
    asked in the order added, and None passes to the next. `label(host name)` says where the source looks."""
    _SOURCES.add(source, label)


def host_token(host: GitlabHost) -> str:
    """The host's token: given in code, else from its environment variable, else from a token source."""
    if host.token is not None:
        return check_token(host.name, host.token, "the token given to register_host")
    variable = host.token_variable
    found = _SOURCES.find(host.name, variable, owner=f"GitLab host {host.name}", error=GitlabTokenError)
    if found is not None:
        return check_token(host.name, *found)
    asked = ["the code (register_host's token=)", variable, *_SOURCES.asked(host.name)]
    return _no_token(host.name, asked)


def _no_token(name: str, asked: list[str]) -> NoReturn:
    places = ", ".join(asked[:-1]) + " nor " + asked[-1]
    raise GitlabTokenError(
        f"GitLab host {name} has no token: neither {places} holds one; put a personal, project or group access"
        " token with the api scope in one of them"
    )


def check_token(name: str, value: object, where: str) -> str:
    """`value` when it has a token's characters (20 to 1024 letters, digits, `_`, `-` and `.`, as GitLab's
    `glpat-...` access tokens and OAuth tokens do); GitlabTokenError naming `where` otherwise."""
    if not isinstance(value, str):
        raise GitlabTokenError(f"GitLab host {name}: {where} must be text, not a {type(value).__name__}")
    if not _TOKEN.fullmatch(value):
        raise GitlabTokenError(
            f"GitLab host {name}: {where} is not a GitLab token (20 to 1024 letters, digits, '_', '-' and '.';"
            f" it holds {len(value)} characters)"
        )
    return value


def check_name(name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "name: a GitLab host's name is 1 to 63 lower case letters, digits, _ and -, starting with a letter or"
            f" digit, not {_shown(name)}"
        )


def check_url(name: str, url: object) -> None:
    check_api_url(f"GitLab host {name}", url)


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"
