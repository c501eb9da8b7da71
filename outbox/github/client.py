"""One githubkit client per account, made as outbox needs it: no retries, no HTTP cache, a bound on each call.

    GithubAccount + its secret ──▶ TokenAuthStrategy(token)
                                 ─ an App ─▶ AppInstallationAuthStrategy(app_id, key, installation_id): githubkit
                                             asks /app/installations/<id>/access_tokens for a token and keeps it
                                             until a minute before its `expires_at`, then asks again
                               ──▶ GitHub(auto_retry=False, http_cache=False, timeout, one PoolsInTurn per loop)

githubkit makes an httpx client for each request (outside `async with github:`) and closes it after, which
closes its transport: the shared transport (`SharedTransport`) ignores that close, else one request's end
would cut the connections of every request in flight beside it (seen: a post's body cut after its headers,
its answer lost). The adapter closes it itself (`close`).

`auto_retry=False`: githubkit would send a post again after a 5xx that followed the write, and wait out a rate
limit inside the call; outbox decides every retry, after read-back. `http_cache=False`: a listing read back
must be GitHub's answer now, never a cached page. Each event loop gets its own transport (a connection pool
belongs to the loop that made it; a drain flow run has a loop of its own) and its own token cache, so a
token is asked for once per loop and refreshed there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outbox._internal.config.extras import needs
from outbox._internal.connections.network import PoolsInTurn
from outbox.github.accounts import GithubAccount

with needs("github"):
    from githubkit import AppInstallationAuthStrategy, GitHub, TokenAuthStrategy
    from githubkit.cache import MemCacheStrategy

USER_AGENT = "outbox-github/0.1.0"


class SharedTransport(PoolsInTurn):
    """The connection pools of every githubkit client of one event loop (PoolsInTurn): a client's own
    close leaves them open."""

    async def aclose(self) -> None:
        pass

    async def close(self) -> None:
        """Close the pools' connections (the adapter's, when it is closed)."""
        await super().aclose()


@dataclass(frozen=True)
class Credentials:
    """An account's secret, looked up when the adapter is built (its repr shows nothing of it)."""

    account: GithubAccount
    secret: str

    def __repr__(self) -> str:
        return f"Credentials({self.account.name})"


def strategy(credentials: Credentials) -> Any:
    account = credentials.account
    if account.app_id is None or account.installation_id is None:
        return TokenAuthStrategy(credentials.secret)
    return AppInstallationAuthStrategy(account.app_id, credentials.secret, account.installation_id)


def github_client(credentials: Credentials, transport: SharedTransport, request_seconds: float) -> GitHub[Any]:
    return GitHub(
        strategy(credentials),
        base_url=credentials.account.url + "/",
        user_agent=USER_AGENT,
        follow_redirects=False,
        timeout=request_seconds,
        async_transport=transport,
        cache_strategy=MemCacheStrategy(),
        http_cache=False,
        auto_retry=False,
    )
