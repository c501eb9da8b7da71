"""GitHub accounts: where posts go, and how outbox signs in there (a token, or a GitHub App's installation).

    register_account(name, token=None | app_id=..., installation_id=..., url=..., rate="80/min") ──▶ GithubAccount
    GithubAdapter(...) ──account_secret(account)──▶ the secret given in code
                                                 ─ else env OUTBOX_GITHUB_TOKEN_<NAME>
                                                   (an App: OUTBOX_GITHUB_PRIVATE_KEY_<NAME>)
                                                 ─ else each secret source, in the order added (a Prefect Secret block)
                                                 ─ none, or not a token / not a PEM key ─▶ GithubSecretError naming
                                                   every place asked, never the secret

An account is one destination, `github:<name>`: GitHub's limits hold per token (a user's, or an App
installation's), so every post through it shares one pace. The default rate, 80 a minute, is GitHub's
documented ceiling on content-creating requests before its secondary rate limit refuses them. A payload names
an account by its registered name, never a URL or a token, so an action reaches only a GitHub the application
registered. The URL is https, or http only to a loopback address (a token never crosses a network in clear).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn

from outbox._internal.checks.provider_urls import check_api_url
from outbox._internal.config.credentials import Source, SourceLabel, Sources
from outbox._internal.config.rates import Rate, parse_rate
from outbox.errors import OutboxError

GITHUB_API = "https://api.github.com"
# GitHub's secondary rate limit: no more than 80 content-creating requests a minute
DEFAULT_RATE = "80/min"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# a personal access token (ghp_, github_pat_), an App's or OAuth token (ghs_, gho_, ghu_), or a classic 40 hex
_TOKEN = re.compile(r"[A-Za-z0-9_]{20,255}")
_PEM = re.compile(r"-----BEGIN (RSA )?PRIVATE KEY-----\s+[A-Za-z0-9+/=\s]+-----END (RSA )?PRIVATE KEY-----\s*")

_ACCOUNTS: dict[str, GithubAccount] = {}
_SOURCES = Sources("secret")


class UnknownAccount(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_ACCOUNTS)) or "none"
        super().__init__(f"no GitHub account is registered as {_shown(name)} (registered: {known})")


class GithubSecretError(OutboxError, ValueError):
    """An account has no secret, or one that is not a token (or not a PEM private key, for an App): one line
    naming the account and where it was looked for, never the secret. Raised when the adapter is built, so
    `outbox run` prints it as its one line and ends before claiming anything."""


@dataclass(frozen=True)
class GithubAccount:
    name: str
    # the REST API's root: https://api.github.com, or https://<host>/api/v3 for GitHub Enterprise Server
    url: str = GITHUB_API
    # None: a token; else the App's id, and the installation whose tokens outbox asks for
    app_id: int | None = None
    installation_id: int | None = None
    # the token, or the App's private key; None: looked up when the adapter is built (`account_secret`)
    secret: str | None = field(default=None, repr=False)
    # the pace of all executors together; None: none, the pace is learned from GitHub's refusals
    rate: Rate | None = field(default_factory=lambda: parse_rate(DEFAULT_RATE, "rate"))

    @property
    def destination(self) -> str:
        """The destination of every post through this account (outbox.executor.destinations)."""
        return destination_name(self.name)

    @property
    def is_app(self) -> bool:
        return self.app_id is not None

    @property
    def secret_variable(self) -> str:
        """The environment variable that holds the account's secret when none is given in code."""
        what = "PRIVATE_KEY" if self.is_app else "TOKEN"
        return f"OUTBOX_GITHUB_{what}_" + self.name.upper().replace("-", "_")

    @property
    def secret_kind(self) -> str:
        return "App private key" if self.is_app else "token"


def destination_name(account: str) -> str:
    return f"github:{account}"


def register_account(
    name: str,
    *,
    url: str = GITHUB_API,
    token: str | None = None,
    app_id: int | None = None,
    installation_id: int | None = None,
    private_key: str | None = None,
    rate: str | None = DEFAULT_RATE,
) -> GithubAccount:
    """Add an account signed in by a token, or (with `app_id` and `installation_id`) as a GitHub App's
    installation; registering the same declaration again is harmless. ValueError names the field.
    `rate`: the most posts a unit of time all executors together make through it (`80/min`, `1/s`); None: no
    pace of outbox's own, only the pauses GitHub's rate limits ask for."""
    check_name(name)
    check_url(name, url)
    if app_id is None and (installation_id is not None or private_key is not None):
        raise ValueError("app_id: an installation_id or a private_key belongs to a GitHub App: give its app_id too")
    if app_id is not None:
        if token is not None:
            raise ValueError("token: an account signs in with a token or as an App installation, not both")
        _check_id(app_id, "app_id")
        _check_id(installation_id, "installation_id")
    secret = token if app_id is None else private_key
    paced = parse_rate(rate, "rate") if rate is not None else None
    account = GithubAccount(name, url.rstrip("/"), app_id, installation_id, secret, paced)
    if secret is not None:
        check_secret(account, secret, f"the {account.secret_kind} given to register_account")
    known = _ACCOUNTS.get(name)
    if known is not None and known != account:
        raise ValueError(f"name: a GitHub account named {name!r} is already registered otherwise")
    for other in _ACCOUNTS.values():
        if other.name != name and other.secret_variable == account.secret_variable:
            raise ValueError(f"name: {name!r} and {other.name!r} would read the same {account.secret_variable}")
    _ACCOUNTS[name] = account
    return account


def account_named(name: object) -> GithubAccount:
    account = _ACCOUNTS.get(name) if isinstance(name, str) else None
    if account is None:
        raise UnknownAccount(name)
    return account


def registered_accounts() -> tuple[GithubAccount, ...]:
    return tuple(_ACCOUNTS[name] for name in sorted(_ACCOUNTS))


def add_secret_source(source: Source, *, label: SourceLabel | None = None) -> None:
    """Ask `source(account name)` for the account's secret (its token, or its App's private key) when neither the
    code nor the environment gives one; sources are asked in the order added, and None passes to the next."""
    _SOURCES.add(source, label)


def account_secret(account: GithubAccount) -> str:
    """The account's token or App private key: given in code, else its environment variable, else a source."""
    if account.secret is not None:
        return check_secret(account, account.secret, f"the {account.secret_kind} given to register_account")
    variable = account.secret_variable
    found = _SOURCES.find(account.name, variable, owner=f"GitHub account {account.name}", error=GithubSecretError)
    if found is not None:
        return check_secret(account, *found)
    given = "private_key=" if account.is_app else "token="
    asked = [f"the code (register_account's {given})", variable, *_SOURCES.asked(account.name)]
    return _no_secret(account, asked)


def _no_secret(account: GithubAccount, asked: list[str]) -> NoReturn:
    places = ", ".join(asked[:-1]) + " nor " + asked[-1]
    wanted = "the App's private key (PEM)" if account.is_app else "a token with write access to issues and pulls"
    raise GithubSecretError(
        f"GitHub account {account.name} has no {account.secret_kind}: neither {places} holds one; put {wanted}"
        " in one of them"
    )


def check_secret(account: GithubAccount, value: object, where: str) -> str:
    """`value` when it looks like the account's secret (a token's characters; a PEM private key for an App);
    GithubSecretError naming `where`, and never the value, otherwise."""
    if not isinstance(value, str):
        raise GithubSecretError(f"GitHub account {account.name}: {where} must be text, not a {type(value).__name__}")
    if account.is_app and not _PEM.fullmatch(value.strip() + "\n"):
        raise GithubSecretError(
            f"GitHub account {account.name}: {where} is not a PEM private key (-----BEGIN RSA PRIVATE KEY----- ...,"
            " as GitHub gives it for an App)"
        )
    if not account.is_app and not _TOKEN.fullmatch(value):
        raise GithubSecretError(
            f"GitHub account {account.name}: {where} is not a GitHub token (20 to 255 letters, digits and '_';"
            f" it holds {len(value)} characters)"
        )
    return value


def check_name(name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "name: a GitHub account's name is 1 to 63 lower case letters, digits, _ and -, starting with a letter"
            f" or digit, not {_shown(name)}"
        )


def _check_id(value: object, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**63:
        raise ValueError(f"{where}: a GitHub App's {where} is a positive integer, not {_shown(value)}")


def check_url(name: str, url: object) -> None:
    check_api_url(f"GitHub account {name}", url)


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"a {type(value).__name__}" if not isinstance(value, int) else repr(value)
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"
