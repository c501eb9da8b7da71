"""GitHub's answers and what each makes of an attempt: the classification table, in code and in docs/github.md.

    an answer (status, headers, message) ──classify──▶ the first rule whose test takes it ──▶ a Result
    markdown_rows() ──▶ the table docs/github.md shows (tests keep the two equal, and send every rule's example
                        through githubkit against the local GitHub server)

A post GitHub refused (4xx) holds nothing, so it ends the action, but for the limits (a Defer that pauses the
account for every executor) and broken credentials (held until a person mends them). A 5xx may come after the
post was stored (GitHub's 502 after a slow write is common), so it is retried and the next attempt reads back
first. Reasons carry the status and GitHub's short message, never a token or a body.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from outbox.executor import CredentialsRefused, Failed, Result, Retry
from outbox.executor.backoff import slow_down

# a rate limit's wait is clamped to this range of seconds
DEFER_BOUNDS = (1.0, 3600.0)
# GitHub: after a secondary rate limit without retry-after, wait at least a minute
SECONDARY_WAIT_SECONDS = 60.0
_SECONDARY = re.compile(r"secondary rate limit|abuse", re.IGNORECASE)
_SHOWN = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True)
class Answer:
    """What GitHub answered: the status, the headers (lower case names) and its JSON's `message`."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    message: str = ""
    # the answer came to the App's request for an installation token, not to the post
    token_request: bool = False


@dataclass(frozen=True)
class Rule:
    answer: str
    result: str
    why: str
    takes: Callable[[Answer], bool]
    make: Callable[[Answer, str, int], Result]
    # an answer this rule takes, for the tests
    example: Answer


def _limited(answer: Answer) -> bool:
    return answer.status in (403, 429)


def _primary(answer: Answer) -> bool:
    return (
        _limited(answer) and answer.headers.get("x-ratelimit-remaining") == "0" and "retry-after" not in answer.headers
    )


def _until_reset(answer: Answer, reason: str, uncounted: int) -> Result:
    reset = answer.headers.get("x-ratelimit-reset", "")
    now = datetime.now(UTC).timestamp()
    wait = float(reset) - now if reset.isdigit() and len(reset) <= 12 else SECONDARY_WAIT_SECONDS
    return slow_down(uncounted, reason, _clamped(wait))


def _retry_after(answer: Answer, reason: str, uncounted: int) -> Result:
    value = answer.headers.get("retry-after", "").strip()
    wait = float(value) if value.isdigit() and len(value) <= 12 else SECONDARY_WAIT_SECONDS
    return slow_down(uncounted, reason, _clamped(wait))


def _a_minute(answer: Answer, reason: str, uncounted: int) -> Result:
    return slow_down(uncounted, reason, SECONDARY_WAIT_SECONDS)


def _clamped(seconds: float) -> float:
    low, high = DEFER_BOUNDS
    return min(max(seconds, low), high)


def _refused_credentials(answer: Answer, reason: str, uncounted: int) -> Result:
    return CredentialsRefused(reason=reason)


def _failed(answer: Answer, reason: str, uncounted: int) -> Result:
    return Failed(reason)


def _retry(answer: Answer, reason: str, uncounted: int) -> Result:
    return Retry(reason)


RULES: tuple[Rule, ...] = (
    Rule(
        "401, or 401, 403 or 404 to the App's request for an installation token",
        "Credentials refused",
        "the token is revoked, expired or wrong, or the App's key or installation is gone: the account is held",
        lambda a: a.status == 401 or (a.token_request and a.status in (403, 404)),
        _refused_credentials,
        Answer(401, message="Bad credentials"),
    ),
    Rule(
        "403 or 429 with `retry-after`",
        "Slow down",
        "a secondary rate limit: the account pauses for the `retry-after` seconds",
        lambda a: _limited(a) and "retry-after" in a.headers,
        _retry_after,
        Answer(403, {"retry-after": "30"}, "You have exceeded a secondary rate limit."),
    ),
    Rule(
        "403 or 429 with `x-ratelimit-remaining: 0`",
        "Slow down",
        "the primary rate limit: the account pauses until `x-ratelimit-reset`",
        _primary,
        _until_reset,
        Answer(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "9999999999"}, "API rate limit exceeded"),
    ),
    Rule(
        "429, or 403 whose message names a secondary rate limit, without `retry-after`",
        "Slow down",
        "a secondary rate limit that names no wait: the account pauses a minute, as GitHub asks",
        lambda a: a.status == 429 or (a.status == 403 and bool(_SECONDARY.search(a.message))),
        _a_minute,
        Answer(403, message="You have exceeded a secondary rate limit. Please wait a few minutes."),
    ),
    Rule(
        "any other 403",
        "Failed",
        "the token may not post there, the issue is locked, or the repository is archived",
        lambda a: a.status == 403,
        _failed,
        Answer(403, message="Unable to create comment because issue is locked."),
    ),
    Rule(
        "404 or 410",
        "Failed",
        "the repository, pull request or issue is gone (or hidden from the token); 410: issues are turned off",
        lambda a: a.status in (404, 410),
        _failed,
        Answer(404, message="Not Found"),
    ),
    Rule(
        "422",
        "Failed",
        "GitHub refused the post: a review's line outside the diff, a commit not in the pull request",
        lambda a: a.status == 422,
        _failed,
        Answer(422, message="Unprocessable Entity"),
    ),
    Rule(
        "any other 4xx",
        "Failed",
        "GitHub refused the request; nothing was stored",
        lambda a: 400 <= a.status < 500,
        _failed,
        Answer(400, message="Problems parsing JSON"),
    ),
    Rule(
        "5xx",
        "Retry, read back first",
        "the post may have been stored before the error: the next attempt lists the target's posts first",
        lambda a: a.status >= 500,
        _retry,
        Answer(502, message="Server Error"),
    ),
)


def classify(answer: Answer, uncounted: int) -> Result:
    """The result of an error answer by the first rule that takes it; `uncounted`: the action's earlier claims
    that did not count (a slow-down becomes a Retry past outbox.executor.backoff.SLOW_DOWN_DEFERRALS)."""
    for rule in RULES:
        if rule.takes(answer):
            return rule.make(answer, reason(answer), uncounted)
    return Retry(reason(answer))  # a status GitHub does not send (1xx, 3xx): nothing known to be stored


def reason(answer: Answer) -> str:
    said = _SHOWN.sub("?", answer.message)[:120]
    to = " to the installation token request" if answer.token_request else ""
    return f"{answer.status}{to}: GitHub said {said!r}" if said else f"{answer.status}{to}"


def markdown_rows() -> list[str]:
    return [f"| {rule.answer} | {rule.result} | {rule.why} |" for rule in RULES]
