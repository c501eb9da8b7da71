"""GitlabAdapter: the only adapter of GITLAB_POST; it makes each note, review or issue once on GitLab.

    payload ─▶ check (host registered here? the post well formed?) ─▶ its pieces: (marker, body), one per
        discussion of a review, else one ─▶ note trace: post, project, marker
        ─▶ claimed before, and an earlier attempt fenced (trace `first_write`)? read back (outbox.gitlab.readback)
           in a pool thread: every marker found ─▶ Done `<url> read back`; some ─▶ only the others are made
        ─▶ first attempt: note `first_write` (now) ─▶ fence ─▶ each piece not found: ONE python-gitlab call in a
           pool thread, bounded by min(request_seconds, the window) ─▶ the answer ─▶ classify

| what GitLab answered                                   | result                                              |
| 201                                                    | Done: the note's, review's or issue's URL           |
| 400 (the text, a label, a review line outside the diff)| Failed PROVIDER_REFUSED                             |
| 401; 403 insufficient_scope (the token lacks `api`)    | CredentialsRefused: the host is held, probed        |
| 403 (no permission on the project, a locked discussion)| Failed                                              |
| 404 (project, merge request or issue gone or hidden),  | Failed                                              |
| 405, 410, 413, 422, any other 4xx                      |                                                     |
| 409                                                    | Retry                                               |
| 429 with Retry-After (seconds) or RateLimit-Reset      | SlowDown: the host pauses for that wait, clamped    |
| (a Unix time)                                          | to 1 s .. 1 h                                       |
| 429 without either                                     | SlowDown: the host pauses, a backoff                |
| 5xx                                                    | Retry: the next attempt reads back first            |
| refused, DNS failure, connect timeout                  | Retry: nothing was sent                             |
| read timeout, reset, closed connection after sending   | Retry: the next attempt reads back first            |
| a read-back that cannot finish (no answer, a 5xx, more | Retry, as above                                     |
| than 5,000 posts since the first write)                |                                                     |

At the action's last attempt a Retry becomes Uncertain PROVIDER_UNCERTAIN when the post may exist: this attempt
sent it without an answer, made part of a review, or read back nothing conclusive after an earlier attempt
fenced. A review is made by one attempt, its discussions one after another: a refusal part way leaves the
discussions made before it (the reason says how many), and the next attempt makes only those read-back does not
find. Results carry statuses, GitLab's short message and counts, never the token or a body.

With OpenTelemetry (`outbox.tracing`) each create call is a span of its own under the attempt's (named `POST`,
with the HTTP method, server address and port, the status, or `error.type` for a call without an answer).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import tracing
from outbox._internal.config.rates import Rate
from outbox.errors import InvalidRequest
from outbox.executor import (
    ActionAdapter,
    ActionAttempt,
    CredentialsRefused,
    Done,
    Failed,
    Result,
    Retry,
    Uncertain,
)
from outbox.executor.backoff import slow_down
from outbox.gitlab import client as calls
from outbox.gitlab import readback
from outbox.gitlab.client import Answer, TooLate, Unanswered
from outbox.gitlab.hosts import GitlabHost, host_token, registered_hosts
from outbox.gitlab.kind import GITLAB_POST
from outbox.gitlab.posts import check_payload, marked, marker, marker_digits
from outbox.kinds import ActionKind

T = TypeVar("T")
# the longest one request may take, unless the write window ends sooner
REQUEST_SECONDS = 15.0
# the threads python-gitlab's calls run in, for all hosts together
THREADS = 16
# a Retry-After or RateLimit-Reset wait is clamped to this range of seconds
DEFER_BOUNDS = (1.0, 3600.0)
_CALL_ERRORS = (Answer, Unanswered, TooLate, readback.TooMany)


@dataclass(frozen=True)
class Piece:
    """One create call of a post: the marker its body carries, the body, and for a review its position."""

    mark: str
    body: str
    position: dict[str, Any] | None = None


class GitlabAdapter:
    """Looks up every registered host's token when built: a missing or malformed one raises GitlabTokenError
    here, before anything runs."""

    def __init__(self, engine: AsyncEngine, *, request_seconds: float = REQUEST_SECONDS, threads: int = THREADS):
        if not (isinstance(request_seconds, int | float) and 0 < request_seconds <= 60):
            raise ValueError(f"request_seconds must be more than 0 and at most 60, not {request_seconds!r}")
        if not (isinstance(threads, int) and 1 <= threads <= 64):
            raise ValueError(f"threads must be 1 to 64, not {threads!r}")
        self._engine = engine
        self.request_seconds = float(request_seconds)
        self._hosts = {h.name: (h, calls.client(h, host_token(h), threads)) for h in registered_hosts()}
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="outbox-gitlab")
        self._span_attributes = {name: span_attributes(host.url) for name, (host, _) in self._hosts.items()}

    @property
    def kind(self) -> ActionKind:
        return GITLAB_POST

    @property
    def rates(self) -> dict[str, Rate | None]:
        """Each host's destination and its rate (GitLab's documented default unless registered with another)."""
        return {host.destination: host.rate for host, _ in self._hosts.values()}

    async def aclose(self) -> None:
        """Close the hosts' connections and the pool (a call still running ends within its timeout)."""
        self._pool.shutdown(wait=False)
        for _, gl in self._hosts.values():
            gl.session.close()

    async def execute(self, attempt: ActionAttempt) -> Result:
        action = attempt.action
        payload = action.payload
        try:
            check_payload(payload)
        except InvalidRequest as invalid:
            if invalid.field == "payload.host":  # a deploy may register the host again
                return Retry(f"payload: {invalid}")
            return Failed(f"payload: {invalid}")
        found = self._hosts.get(payload["host"])
        if found is None:
            return Retry(f"host: {payload['host']} was registered after the adapter was built; it has no token")
        host, gl = found
        pieces = _pieces(action.idempotency_key, payload)
        project = payload["project"]
        attempt.note(post=payload["post"], project=str(project)[:200], marker=marker_digits(action.idempotency_key))
        last = action.attempt >= action.max_attempts
        first_write = attempt.trace.get("first_write")
        made: dict[str, dict[str, Any]] = {}
        if attempt.claimed_before() and isinstance(first_write, str):
            since = datetime.fromisoformat(first_write)
            deadline = time.monotonic() + self.request_seconds
            try:
                made = await self._run(lambda: _read_back(gl, payload, pieces, since, self.request_seconds), deadline)
            except _CALL_ERRORS as error:
                result = classify_error(error, attempt.uncounted_claims(), "read-back")
                return _at_last(result, last, "an earlier attempt's post may exist and read-back could not tell")
            if all(piece.mark in made for piece in pieces):
                return Done(f"{_reference(host, payload, pieces, made)} read back")
        else:
            attempt.note(first_write=(action.claimed_at or datetime.now(UTC)).isoformat())
        window = await attempt.fence().begin_write()
        for number, piece in enumerate(pieces, 1):
            if piece.mark in made:
                continue
            timeout = min(self.request_seconds, window.check())
            with tracing.provider_call("POST", attributes=self._span_attributes[host.name]) as call:
                try:
                    made[piece.mark] = await self._run(_creator(gl, payload, piece, timeout), window.deadline)
                except _CALL_ERRORS as error:
                    if isinstance(error, Answer):
                        call.answered(error.status)
                    else:
                        call.failed(type(error).__name__)
                    return self._unmade(error, attempt, last, number, len(pieces), len(made))
                call.answered(201)
        return Done(_reference(host, payload, pieces, made))

    def _unmade(
        self, error: Exception, attempt: ActionAttempt, last: bool, number: int, total: int, made: int
    ) -> Result:
        result = classify_error(error, attempt.uncounted_claims(), "post")
        if total > 1:
            result = _with_count(result, f"discussion {number} of {total}, {made} made")
        may_exist = made > 0 or _may_have_written(error)
        if may_exist:
            attempt.note(answer_lost=True)
            return _at_last(result, last, "the post may exist")
        return result

    async def _run(self, call: Callable[[], T], deadline: float) -> T:
        """`call` in a pool thread, started only before `deadline` (the event loop's clock, time.monotonic)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, calls.called, call, deadline)


def _pieces(key: str, payload: dict[str, Any]) -> list[Piece]:
    if payload["post"] == "note":
        return [Piece(marker(key), marked(payload["body"], marker(key)))]
    if payload["post"] == "issue":
        return [Piece(marker(key), marked(payload["description"], marker(key)))]
    pieces = []
    for number, comment in enumerate(payload["comments"], 1):
        mark = marker(key, number)
        position = {
            "position_type": "text",
            "base_sha": payload["base_sha"],
            "start_sha": payload["start_sha"],
            "head_sha": payload["head_sha"],
            "new_path": comment["path"],
            "old_path": comment.get("old_path", comment["path"]),
        }
        position.update({name: comment[name] for name in ("new_line", "old_line") if name in comment})
        pieces.append(Piece(mark, marked(comment["body"], mark), position))
    return pieces


def _creator(gl: Any, payload: dict[str, Any], piece: Piece, timeout: float) -> Callable[[], dict[str, Any]]:
    project = payload["project"]
    if payload["post"] == "note":
        return lambda: calls.create_note(gl, project, payload["target"], payload["iid"], piece.body, timeout)
    if payload["post"] == "issue":
        labels = payload["labels"]
        return lambda: calls.create_issue(gl, project, payload["title"], piece.body, labels, timeout)
    assert piece.position is not None
    position = piece.position
    return lambda: calls.create_discussion(gl, project, payload["iid"], piece.body, position, timeout)


def _read_back(
    gl: Any, payload: dict[str, Any], pieces: list[Piece], since: datetime, timeout: float
) -> dict[str, dict[str, Any]]:
    wanted = {piece.mark for piece in pieces}
    project = payload["project"]
    if payload["post"] == "note":
        return readback.notes_holding(gl, project, payload["target"], payload["iid"], wanted, since, timeout)
    if payload["post"] == "issue":
        return readback.issues_holding(gl, project, wanted, since, timeout)
    return readback.discussions_holding(gl, project, payload["iid"], wanted, timeout)


def _reference(host: GitlabHost, payload: dict[str, Any], pieces: list[Piece], made: dict[str, dict[str, Any]]) -> str:
    """The post's URL: an issue's web_url, a note's or a review's first discussion's anchor on its page."""
    first = made[pieces[0].mark]
    if payload["post"] == "issue":
        return str(first.get("web_url") or f"issue {first.get('iid')}")
    note = (first.get("notes") or [first])[0] if payload["post"] == "review" else first
    path = "merge_requests" if payload["post"] == "review" or payload["target"] == "merge_request" else "issues"
    project = payload["project"]
    if isinstance(project, int):
        ref = f"{host.url}/api/v4/projects/{project}/{path}/{payload['iid']}/notes/{note.get('id')}"
    else:
        ref = f"{host.url}/{project}/-/{path}/{payload['iid']}#note_{note.get('id')}"
    return ref if payload["post"] != "review" else f"{ref} ({len(pieces)} discussions)"


def span_attributes(url: str) -> dict[str, tracing.AttributeValue]:
    """A create call's span attributes, by the HTTP semantic conventions of a client span: never the URL's path
    (the project) or a query."""
    parts = urlsplit(url)
    return {
        "http.request.method": "POST",
        "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if parts.scheme == "https" else 80),
        "url.scheme": parts.scheme,
    }


def classify_error(error: Exception, uncounted: int, stage: str) -> Result:
    """A call that did not make its post, by the table in this module's docstring."""
    if isinstance(error, Answer):
        return classify(error.status, error.message, error.retry_after, error.ratelimit_reset, uncounted, stage)
    if isinstance(error, Unanswered):
        if not error.sent:
            return Retry(f"{stage}: {error.what}; nothing was sent")
        return Retry(f"{stage}: {error.what} after the request was sent; the next attempt reads back first")
    if isinstance(error, TooLate):
        return Retry(f"{stage}: the write window closed while the call waited for a thread; nothing was sent")
    return Retry(f"{stage}: {error}")


def classify(
    status: int,
    message: str,
    retry_after: str | None,
    ratelimit_reset: str | None,
    uncounted: int,
    stage: str = "post",
) -> Result:
    """GitLab's error answer (`message`: its short `message` or `error`), by the table in this module's docstring."""
    said = f"{stage}: {status} {_short(message)}".rstrip()
    if status == 401 or (status == 403 and "insufficient_scope" in message):
        return CredentialsRefused(reason=f"{said}: GitLab refused the host's token")
    if status == 429:
        wait = rate_limit_wait(retry_after, ratelimit_reset, time.time())
        return slow_down(uncounted, f"{said}: GitLab's rate limit", wait)
    if status >= 500:
        return Retry(f"{said}: the next attempt reads back first")
    if status == 409:
        return Retry(said)
    return Failed(said)


def rate_limit_wait(retry_after: str | None, ratelimit_reset: str | None, now: float) -> float | None:
    """The wait a 429 names: Retry-After's seconds, else RateLimit-Reset's Unix time less now, clamped to
    DEFER_BOUNDS; None when neither is readable."""
    seconds: float | None = None
    if retry_after is not None and retry_after.strip().isdigit() and len(retry_after.strip()) <= 12:
        seconds = float(retry_after.strip())
    elif ratelimit_reset is not None and ratelimit_reset.strip().isdigit() and len(ratelimit_reset.strip()) <= 12:
        seconds = float(ratelimit_reset.strip()) - now
    if seconds is None or not math.isfinite(seconds):
        return None
    low, high = DEFER_BOUNDS
    return min(max(seconds, low), high)


def _may_have_written(error: Exception) -> bool:
    if isinstance(error, Unanswered):
        return error.sent
    return isinstance(error, Answer) and error.status >= 500


def _at_last(result: Result, last: bool, why: str) -> Result:
    if last and isinstance(result, Retry):
        return Uncertain(f"{result.reason}; at the last attempt {why}")
    return result


def _with_count(result: Result, count: str) -> Result:
    if isinstance(result, Failed):
        return Failed(f"{result.reason} ({count})")
    if isinstance(result, Retry):
        return Retry(f"{result.reason} ({count})", result.after)
    return result


def _short(message: str) -> str:
    """GitLab's message on one line, at most 160 characters."""
    line = " ".join(message.split())
    return line if len(line) <= 160 else line[:157] + "..."


def gitlab_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The GITLAB_POST adapter; the application registers its hosts first."""
    return [GitlabAdapter(engine)]
