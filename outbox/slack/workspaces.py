"""Slack workspaces: the connections messages go through, each with its bot token, registered in code.

    register_workspace(name, token=None, rate=None, channel_rate="1/s") ──checks──▶ SlackWorkspace (the registry)
    SlackAdapter(...) ──workspace_token(workspace)──▶ the given token
                                                   ─ else env OUTBOX_SLACK_TOKEN_<NAME>
                                                   ─ else each token source, in the order added
                                                   ─ none, or not a Slack token ─▶ SlackTokenError naming where

A message's workspace is a registered name: no payload names a token or a URL. A token is looked up when
the adapter is built, so `outbox run` refuses to start without one (one line naming every place asked,
never the token). `base_url` is Slack's Web API unless told otherwise (a local server in tests and the demo).
The destination is the workspace (`slack:<name>`): its `rate`, when given, holds for all executors together;
`channel_rate` spaces the messages of one channel, which Slack limits to about one a second.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn

from outbox._internal.config.credentials import Source, SourceLabel, Sources
from outbox._internal.config.rates import Rate, parse_rate
from outbox.errors import OutboxError

SLACK_API = "https://slack.com/api/"
# Slack's documented pace for chat.postMessage in one channel: about one message a second
CHANNEL_RATE = "1/s"
# a bot token (xoxb-), a user token (xoxp-), or a rotating one (xoxe.xoxb-, xoxe.xoxp-)
_TOKEN = re.compile(r"(xoxe\.)?xox[bp]-[A-Za-z0-9-]{8,250}")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")

_WORKSPACES: dict[str, SlackWorkspace] = {}
_SOURCES = Sources("token")


class UnknownWorkspace(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_WORKSPACES)) or "none"
        super().__init__(f"no Slack workspace is registered as {_shown(name)} (registered: {known})")


class SlackTokenError(OutboxError, ValueError):
    """A workspace has no token, or one that is not a Slack token: one line naming the workspace and where
    it was looked for, never the token. Raised when the adapter is built (`outbox run` prints it and ends)."""


@dataclass(frozen=True)
class SlackWorkspace:
    name: str
    # None: looked up when the adapter is built (`workspace_token`)
    token: str | None = field(default=None, repr=False)
    # all executors together; None: no configured rate, the pace is learned from Slack's 429s
    rate: Rate | None = None
    # the messages a second of one channel (each adapter spaces its own)
    channel_rate: Rate = field(default_factory=lambda: parse_rate(CHANNEL_RATE, "channel_rate"))
    base_url: str = SLACK_API

    @property
    def destination(self) -> str:
        return destination_name(self.name)

    @property
    def token_variable(self) -> str:
        return token_variable(self.name)


def destination_name(workspace: str) -> str:
    """The destination of the messages of the workspace named `workspace`."""
    return f"slack:{workspace}"


def token_variable(name: str) -> str:
    return "OUTBOX_SLACK_TOKEN_" + name.upper().replace("-", "_")


def register_workspace(
    name: str,
    *,
    token: str | None = None,
    rate: str | None = None,
    channel_rate: str = CHANNEL_RATE,
    base_url: str = SLACK_API,
) -> SlackWorkspace:
    """Add a workspace; registering the same declaration again is harmless. ValueError names the field.
    `rate`: the most messages a unit of time all executors together post there (`50/min`); `channel_rate`:
    the most to one channel (Slack's one a second by default)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "name: a Slack workspace's name is 1 to 63 lower case letters, digits, _ and -, starting with a"
            f" letter or digit, not {_shown(name)}"
        )
    if token is not None:
        check_token(name, token, "the token given to register_workspace")
    if not isinstance(base_url, str) or not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", base_url):
        raise ValueError(f"base_url: Slack workspace {name}'s base_url must be an http(s) URL without query")
    workspace = SlackWorkspace(
        name,
        token,
        parse_rate(rate, "rate") if rate is not None else None,
        parse_rate(channel_rate, "channel_rate"),
        base_url if base_url.endswith("/") else base_url + "/",
    )
    known = _WORKSPACES.get(name)
    if known is not None and known != workspace:
        raise ValueError(f"name: a Slack workspace named {name!r} is already registered otherwise")
    for other in _WORKSPACES.values():
        if other.name != name and other.token_variable == workspace.token_variable:
            raise ValueError(f"name: {name!r} and {other.name!r} would read the same {workspace.token_variable}")
    _WORKSPACES[name] = workspace
    return workspace


def workspace_named(name: object) -> SlackWorkspace:
    workspace = _WORKSPACES.get(name) if isinstance(name, str) else None
    if workspace is None:
        raise UnknownWorkspace(name)
    return workspace


def registered_workspaces() -> tuple[SlackWorkspace, ...]:
    return tuple(_WORKSPACES[name] for name in sorted(_WORKSPACES))


def add_token_source(source: Source, *, label: SourceLabel | None = None) -> None:
    """Ask `source(workspace name)` for a token when neither the code nor the environment gives one; sources
    are asked in the order added, and None passes to the next. `label(name)` says where the source looks."""
    _SOURCES.add(source, label)


def workspace_token(workspace: SlackWorkspace) -> str:
    """The workspace's token: given in code, else from its environment variable, else from a token source."""
    if workspace.token is not None:
        return check_token(workspace.name, workspace.token, "the token given to register_workspace")
    variable = workspace.token_variable
    found = _SOURCES.find(workspace.name, variable, owner=f"Slack workspace {workspace.name}", error=SlackTokenError)
    if found is not None:
        return check_token(workspace.name, *found)
    asked = ["the code (register_workspace's token=)", variable, *_SOURCES.asked(workspace.name)]
    return _no_token(workspace.name, asked)


def check_token(name: str, token: object, where: str) -> str:
    """`token` when it looks like a Slack bot or user token (xoxb-, xoxp-, xoxe.xoxb-...); else SlackTokenError
    naming `where`, never the value."""
    if not isinstance(token, str):
        raise SlackTokenError(f"Slack workspace {name}: {where} must be text, not a {type(token).__name__}")
    if not _TOKEN.fullmatch(token.strip()):
        raise SlackTokenError(
            f"Slack workspace {name}: {where} does not hold a Slack token (xoxb-..., or xoxp-... for a user token)"
        )
    return token.strip()


def _no_token(name: str, asked: list[str]) -> NoReturn:
    places = ", ".join(asked[:-1]) + " nor " + asked[-1]
    raise SlackTokenError(f"Slack workspace {name} has no token: neither {places} holds one")


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"
