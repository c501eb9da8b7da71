"""GithubAdapter: the only adapter of GITHUB_POST, and the only code that posts to GitHub.

    payload ─▶ its account's client (built with its secret when the adapter was) ─▶ note trace: post, repo, number
        ─ an earlier attempt may have posted (its write started and no result came, or its answer was lost) ─▶
              read-back (outbox.github.readback) ─ found ─▶ Done (the post's URL, "read back")
                                                 ─ cannot tell ─▶ Retry; at the last attempt Uncertain
        ─▶ note `since` (first write only) ─▶ fence ─▶ ONE request, bounded by min(request_seconds, the window)
              201 ─▶ Done (the post's html_url, parsed by githubkit's model)
              an error answer ─▶ outbox.github.replies.classify (limits pause the account, 401 holds it)
              a 5xx, or no answer once sent (reset, timeout) ─▶ Retry, `answer_lost` noted: the next attempt reads back

A first attempt never reads back. An attempt after one that passed its fence without an answer lists the
target's posts for the marker before it posts again, so a post whose answer was lost is made once. At the
last attempt, anything that would be a Retry after an earlier answer was lost ends Uncertain: the post may exist.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import tracing
from outbox._internal.config.extras import needs
from outbox._internal.config.rates import Rate
from outbox.errors import InvalidRequest
from outbox.executor import ActionAdapter, ActionAttempt, Done, Result, Retry, Uncertain
from outbox.github.accounts import GithubSecretError, account_secret, registered_accounts
from outbox.github.client import Credentials, SharedTransport, github_client
from outbox.github.kind import GITHUB_POST
from outbox.github.posts import check_payload, marked, marker
from outbox.github.readback import TooMany, find_post
from outbox.github.replies import Answer, classify
from outbox.kinds import ActionKind

with needs("github"):
    import httpx
    import jwt
    from githubkit import GitHub
    from githubkit.exception import RequestError, RequestFailed
    from pydantic import ValidationError

# the longest a request may take, unless the write window ends sooner
REQUEST_SECONDS = 15.0
# what a Retry's reason says when the request went out and its answer was lost: GitHub may hold the post
SENT_UNANSWERED = "after the request was sent"
# what a Retry's reason says when the request never reached GitHub; any other Retry after the fence may hide a post
NOTHING_SENT = "nothing was sent"
_NOTHING_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)


class GithubAdapter:
    """Looks up every registered account's secret when built: a missing or malformed one raises GithubSecretError
    here, before anything runs."""

    def __init__(self, engine: AsyncEngine, *, request_seconds: float = REQUEST_SECONDS) -> None:
        if not (isinstance(request_seconds, int | float) and 0 < request_seconds <= 60):
            raise ValueError(f"request_seconds must be more than 0 and at most 60, not {request_seconds!r}")
        self.request_seconds = float(request_seconds)
        self._credentials = {a.name: Credentials(a, account_secret(a)) for a in registered_accounts()}
        for credentials in self._credentials.values():
            _check_key(credentials)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: SharedTransport | None = None
        self._clients: dict[str, GitHub[Any]] = {}

    @property
    def kind(self) -> ActionKind:
        return GITHUB_POST

    @property
    def rates(self) -> dict[str, Rate | None]:
        """Each account's destination and its rate (GitHub's content-creation pace unless registered otherwise)."""
        return {c.account.destination: c.account.rate for c in self._credentials.values()}

    async def aclose(self) -> None:
        """Close the adapter's connections."""
        if self._transport is not None:
            await self._transport.close()
        self._transport, self._clients = None, {}

    async def execute(self, attempt: ActionAttempt) -> Result:
        action = attempt.action
        payload = action.payload
        try:
            check_payload(payload)
        except InvalidRequest as invalid:  # an account this process does not register: a deploy may bring it
            return Retry(f"payload: {invalid}")
        github = self._client(payload["account"])
        if github is None:
            return Retry(f"account: {payload['account']} was registered after the adapter was built; it has no secret")
        mark = marker(action.idempotency_key)
        attempt.note(post=payload["post"], repo=payload["repo"], number=payload.get("number"), marker=mark)
        last = action.attempt >= action.max_attempts
        since = attempt.trace.get("since")
        if isinstance(since, str) and (attempt.write_started() or attempt.trace.get("answer_lost")):
            found = await self._read_back(github, payload, mark, datetime.fromisoformat(since), attempt)
            if found is not None:
                return _at_last(found, last)
        if since is None:
            attempt.note(since=(action.claimed_at or datetime.now(UTC)).isoformat(timespec="seconds"))
        window = await attempt.fence().begin_write()
        bound = min(self.request_seconds, window.check())
        with tracing.provider_call(f"POST {payload['post']}") as call:
            result = await self._post(github, payload, mark, bound, attempt.uncounted_claims())
            if not isinstance(result, Done):
                call.failed(type(result).__name__)
        if isinstance(result, Retry) and NOTHING_SENT not in result.reason:
            attempt.note(answer_lost=True)  # a 5xx or no answer: GitHub may hold the post from now on
        return _at_last(result, last and bool(attempt.trace.get("answer_lost")))

    async def _read_back(
        self, github: GitHub[Any], payload: dict[str, Any], mark: str, since: datetime, attempt: ActionAttempt
    ) -> Result | None:
        """Done when the post is there, None when the listing proves it is not, else why it cannot tell."""
        try:
            async with asyncio.timeout(self.request_seconds):
                url = await find_post(github, payload, mark, since)
        except TooMany as too_many:
            return Retry(str(too_many))
        except (RequestError, TimeoutError, ValidationError) as error:
            found = _failure(error, attempt.uncounted_claims(), "read-back")
            return found if not isinstance(found, Retry) else Retry(f"read-back: {found.reason}")
        return None if url is None else Done(f"{url} read back")

    async def _post(
        self, github: GitHub[Any], payload: dict[str, Any], mark: str, bound: float, uncounted: int
    ) -> Result:
        owner, repo = payload["repo"].split("/")
        body = marked(payload["body"], mark)
        try:
            async with asyncio.timeout(bound):
                return Done(await _made(github, owner, repo, payload, body))
        except ValidationError as unparsed:  # GitHub answered 2xx: the post exists, its answer did not parse
            return Done(f"{payload['post']} made; its answer did not parse ({unparsed.error_count()} errors)")
        except (RequestError, TimeoutError) as error:
            return _failure(error, uncounted, "post")

    def _client(self, account: str) -> GitHub[Any] | None:
        credentials = self._credentials.get(account)
        if credentials is None:
            return None
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._transport is None:  # a new loop: the old pool belongs to the old one
            self._loop, self._transport, self._clients = loop, SharedTransport(), {}
        client = self._clients.get(account)
        if client is None:
            client = self._clients[account] = github_client(credentials, self._transport, self.request_seconds)
        return client


async def _made(github: GitHub[Any], owner: str, repo: str, payload: dict[str, Any], body: str) -> str:
    """Make the post; its html_url, read from githubkit's model of GitHub's answer."""
    if payload["post"] == "comment":
        comment = await github.rest.issues.async_create_comment(owner, repo, payload["number"], body=body)
        return comment.parsed_data.html_url
    if payload["post"] == "review":
        review = await github.rest.pulls.async_create_review(
            owner,
            repo,
            payload["number"],
            commit_id=payload["commit_id"],
            body=body,
            event="COMMENT",
            comments=payload["comments"],
        )
        return review.parsed_data.html_url
    issue = await github.rest.issues.async_create(
        owner, repo, title=payload["title"], body=body, labels=payload["labels"]
    )
    return issue.parsed_data.html_url


def _failure(error: BaseException, uncounted: int, stage: str) -> Result:
    """A githubkit error as a result: an error answer by the table, else a request that failed on the way."""
    if isinstance(error, RequestFailed):
        return classify(answer_of(error), uncounted)
    if isinstance(error, TimeoutError):
        return Retry(f"{stage}: no answer in time {SENT_UNANSWERED}")
    if isinstance(error, ValidationError):
        return Retry(f"{stage}: GitHub's answer did not parse ({error.error_count()} errors)")
    cause = error.exc if isinstance(error, RequestError) else error
    if isinstance(cause, _NOTHING_SENT):
        return Retry(f"{stage}: {type(cause).__name__}; {NOTHING_SENT}")
    return Retry(f"{stage}: {type(cause).__name__} {SENT_UNANSWERED}")


def answer_of(error: RequestFailed) -> Answer:
    response = error.response.raw_response
    try:
        message = response.json().get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return Answer(
        response.status_code,
        {name.lower(): value for name, value in response.headers.items()},
        message if isinstance(message, str) else "",
        token_request=error.request.url.path.endswith("/access_tokens"),
    )


def _at_last(result: Result, may_hold: bool) -> Result:
    """At the last attempt, after an earlier answer was lost, a Retry is Uncertain: GitHub may hold the post."""
    if may_hold and isinstance(result, Retry):
        return Uncertain(f"{result.reason}; an earlier attempt's answer was lost, so GitHub may hold the post")
    return result


def _check_key(credentials: Credentials) -> None:
    """An App's private key must sign: one line naming where it came from otherwise, never the key."""
    account = credentials.account
    if not account.is_app:
        return
    try:
        jwt.encode({"iss": str(account.app_id)}, credentials.secret, algorithm="RS256")
    except (ValueError, TypeError, jwt.PyJWTError):
        raise GithubSecretError(
            f"GitHub account {account.name}: its App private key ({account.secret_variable} or where it was given)"
            " cannot sign: it is not an RSA private key in PEM"
        ) from None


def github_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The GITHUB_POST adapter; the application registers its accounts first."""
    return [GithubAdapter(engine)]
