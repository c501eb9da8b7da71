"""The three GitHub posts: a comment on a pull request or an issue, a review with inline comments, a new issue;
their payloads, the check at enqueue, and the marker each carries.

    comment_request(account, repo, number, body, key)                 ─┐
    review_request(account, repo, number, commit_id, body, comments)  ─┼─check_payload─▶ ActionRequest (GITHUB_POST)
    issue_request(account, repo, title, body, labels, key)            ─┘   a field wrong ─▶ InvalidRequest naming it
    enqueue_comment / enqueue_review / enqueue_issue ──outbox.enqueue──▶ the caller's transaction

The payload holds the post as it goes (its text, its lines), the account by its registered name and the
repository as `owner/name`; check_payload refuses anything else and returns the destination, `github:<account>`.
Every body (a review's own body, not its inline comments: the review is made whole or not at all) ends with the
action's marker, `<!-- outbox:<32 hex digits> -->`, an HTML comment GitHub's page does not show, by which
read-back finds the post. The digits are the SHA-256 of the idempotency key, so the marker shows nothing of it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.action import Action
from outbox.errors import InvalidRequest
from outbox.github.accounts import UnknownAccount, account_named, destination_name
from outbox.github.kind import GITHUB_POST
from outbox.intake import enqueue
from outbox.requests import ActionRequest
from outbox.store.caller import SyncConnection

# GitHub's longest body of a comment, a review, a review's comment or an issue (characters, the marker included)
BODY_LIMIT = 65_536
TITLE_LIMIT = 256
LABEL_LIMIT = 50
MAX_LABELS = 50
# a review's inline comments, made by one request
MAX_COMMENTS = 100
MAX_ATTEMPTS = 8
_OWNER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})")
_REPO = re.compile(r"[A-Za-z0-9._-]{1,100}")
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_MARKER = re.compile(r"<!-- outbox:([0-9a-f]{32}) -->")
_FIELDS = {
    "comment": {"post", "account", "repo", "number", "body"},
    "review": {"post", "account", "repo", "number", "commit_id", "body", "comments"},
    "issue": {"post", "account", "repo", "title", "body", "labels"},
}
_COMMENT_FIELDS = {"path", "line", "side", "start_line", "start_side", "body"}
_SIDES = ("LEFT", "RIGHT")


def marker(idempotency_key: str) -> str:
    """The hidden marker a post's body ends with."""
    return f"<!-- outbox:{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]} -->"


def marked(text: str, mark: str) -> str:
    """`text` with the marker on a line of its own at the end (a blank line between, so Markdown hides it)."""
    return f"{text}\n\n{mark}"


def holds_marker(text: object, mark: str) -> bool:
    """True when a body read back carries `mark` as a marker (a post quoting another carries that one's too: only
    the exact marker counts)."""
    return isinstance(text, str) and any(found.group(0) == mark for found in _MARKER.finditer(text))


def check_payload(payload: Any) -> str:
    """GITHUB_POST's payload check at enqueue: one of the three posts, each field as documented and nothing else,
    its account registered in this process; InvalidRequest naming the field otherwise. Returns the destination,
    `github:<account>`."""
    if not isinstance(payload, Mapping):
        raise InvalidRequest("payload", f"a GITHUB_POST payload is a JSON object, not a {type(payload).__name__}")
    post = payload.get("post")
    if post not in _FIELDS:
        raise InvalidRequest("payload.post", f"must be one of comment, review, issue, not {_shown(post)}")
    fields = _FIELDS[post]
    extra, missing = set(payload) - fields, fields - set(payload)
    if extra or missing:
        said = [f"unknown {sorted(extra)}" if extra else "", f"missing {sorted(missing)}" if missing else ""]
        raise InvalidRequest("payload", f"a {post} holds exactly {sorted(fields)}: " + "; ".join(s for s in said if s))
    account = payload["account"]
    try:
        account_named(account)
    except UnknownAccount as unknown:
        raise InvalidRequest("payload.account", str(unknown)) from None
    check_repo(payload["repo"])
    _CHECKS[post](payload)
    return destination_name(account)


def check_repo(repo: object) -> tuple[str, str]:
    """`owner/name` as its two parts; InvalidRequest otherwise."""
    if isinstance(repo, str) and repo.count("/") == 1:
        owner, name = repo.split("/")
        if _OWNER.fullmatch(owner) and "--" not in owner and _REPO.fullmatch(name) and name not in (".", ".."):
            return owner, name
    raise InvalidRequest(
        "payload.repo",
        "a repository is owner/name (the owner 1 to 39 letters, digits and single '-'; the name 1 to 100 letters,"
        f" digits, '.', '_' and '-'), not {_shown(repo)}",
    )


def _check_comment_post(payload: Mapping[str, Any]) -> None:
    _check_number(payload["number"], "payload.number")
    _check_text(payload["body"], "payload.body", len(marker("")) + 2)


def _check_review(payload: Mapping[str, Any]) -> None:
    _check_number(payload["number"], "payload.number")
    if not isinstance(payload["commit_id"], str) or not _SHA.fullmatch(payload["commit_id"]):
        raise InvalidRequest("payload.commit_id", "must be the pull request's head commit: 40 lower case hex digits")
    _check_text(payload["body"], "payload.body", len(marker("")) + 2)
    comments = payload["comments"]
    if not isinstance(comments, list) or len(comments) > MAX_COMMENTS:
        raise InvalidRequest("payload.comments", f"a review holds a list of at most {MAX_COMMENTS} inline comments")
    for number, comment in enumerate(comments):
        _check_inline(comment, f"payload.comments[{number}]")


def _check_inline(comment: object, where: str) -> None:
    if not isinstance(comment, Mapping):
        raise InvalidRequest(where, "an inline comment is an object with path, line and body")
    extra = set(comment) - _COMMENT_FIELDS
    if extra:
        raise InvalidRequest(where, f"unknown {sorted(extra)}; an inline comment holds {sorted(_COMMENT_FIELDS)}")
    path = comment.get("path")
    if not isinstance(path, str) or not 1 <= len(path) <= 4096 or "\x00" in path or path.startswith("/"):
        raise InvalidRequest(f"{where}.path", "an inline comment needs the file's path in the repository")
    if "line" not in comment:
        raise InvalidRequest(f"{where}.line", "an inline comment needs the line it is on (in the file, not the diff)")
    _check_number(comment["line"], f"{where}.line")
    for name in ("side", "start_side"):
        if name in comment and comment[name] not in _SIDES:
            raise InvalidRequest(f"{where}.{name}", f"must be LEFT or RIGHT, not {_shown(comment[name])}")
    if "start_line" in comment:
        _check_number(comment["start_line"], f"{where}.start_line")
        if comment["start_line"] >= comment["line"]:
            raise InvalidRequest(f"{where}.start_line", "a range's first line comes before its last (line)")
    elif "start_side" in comment:
        raise InvalidRequest(f"{where}.start_side", "start_side belongs to a range: give start_line too")
    _check_text(comment.get("body"), f"{where}.body", 0)


def _check_issue(payload: Mapping[str, Any]) -> None:
    title = payload["title"]
    if not isinstance(title, str) or not title.strip() or len(title) > TITLE_LIMIT or _has_control(title):
        raise InvalidRequest("payload.title", f"a title is 1 to {TITLE_LIMIT} characters on one line, not blank")
    _check_text(payload["body"], "payload.body", len(marker("")) + 2)
    labels = payload["labels"]
    if not isinstance(labels, list) or len(labels) > MAX_LABELS:
        raise InvalidRequest("payload.labels", f"labels are a list of at most {MAX_LABELS} names")
    for label in labels:
        if not isinstance(label, str) or not label.strip() or len(label) > LABEL_LIMIT or _has_control(label):
            raise InvalidRequest("payload.labels", f"a label is 1 to {LABEL_LIMIT} characters, not {_shown(label)}")


_CHECKS = {"comment": _check_comment_post, "review": _check_review, "issue": _check_issue}


def _check_number(value: object, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**31:
        raise InvalidRequest(where, f"must be a positive integer, not {_shown(value)}")


def _check_text(text: object, where: str, mark: int) -> None:
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest(where, "must be text, not blank")
    if "\x00" in text:
        raise InvalidRequest(where, "must hold no NUL character")
    if len(text) + mark > BODY_LIMIT:
        taken = f"{BODY_LIMIT - mark} (with the marker, {BODY_LIMIT})" if mark else str(BODY_LIMIT)
        raise InvalidRequest(where, f"is {len(text)} characters; GitHub takes {taken}")


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return repr(value) if isinstance(value, int) else f"a {type(value).__name__}"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"


# -- the requests


def comment_request(
    account: str,
    repo: str,
    number: int,
    body: str,
    *,
    idempotency_key: str,
    lane_key: str | None = None,
    workspace_id: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> ActionRequest:
    """A comment on pull request or issue `number` (a pull request is an issue to this endpoint). The lane is the
    target's unless given: the posts on one pull request are made in the order enqueued."""
    payload = {"post": "comment", "account": account, "repo": repo, "number": number, "body": body}
    return _request(payload, idempotency_key, lane_key or f"github:{repo}#{number}", workspace_id, max_attempts)


def review_request(
    account: str,
    repo: str,
    number: int,
    *,
    commit_id: str,
    body: str,
    comments: Sequence[Mapping[str, Any]] = (),
    idempotency_key: str,
    lane_key: str | None = None,
    workspace_id: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> ActionRequest:
    """A review (event COMMENT) of pull request `number` at `commit_id`, its body and its inline comments, each
    `path`, `line`, `body` and optionally `side` (RIGHT: the new file, the default; LEFT: the old one),
    `start_line` and `start_side` for a range."""
    payload = {
        "post": "review",
        "account": account,
        "repo": repo,
        "number": number,
        "commit_id": commit_id,
        "body": body,
        "comments": [dict(comment) for comment in comments],
    }
    return _request(payload, idempotency_key, lane_key or f"github:{repo}#{number}", workspace_id, max_attempts)


def issue_request(
    account: str,
    repo: str,
    title: str,
    body: str,
    *,
    idempotency_key: str,
    labels: Sequence[str] = (),
    lane_key: str | None = None,
    workspace_id: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> ActionRequest:
    """A new issue in `repo` with its title, body and labels (GitHub creates a label it does not know)."""
    payload = {"post": "issue", "account": account, "repo": repo, "title": title, "body": body, "labels": list(labels)}
    return _request(payload, idempotency_key, lane_key or f"github:{repo}:issues", workspace_id, max_attempts)


def _request(
    payload: dict[str, Any], key: str, lane: str, workspace_id: int | None, max_attempts: int
) -> ActionRequest:
    check_payload(payload)
    return ActionRequest(
        kind=GITHUB_POST,
        lane_key=lane,
        idempotency_key=key,
        payload=payload,
        workspace_id=workspace_id,
        max_attempts=max_attempts,
    )


def enqueue_comment(conn: SyncConnection, account: str, repo: str, number: int, body: str, **options: Any) -> Action:
    """`comment_request` enqueued in the caller's transaction (see `outbox.enqueue`)."""
    return enqueue(conn, comment_request(account, repo, number, body, **options))


def enqueue_review(conn: SyncConnection, account: str, repo: str, number: int, **options: Any) -> Action:
    """`review_request` enqueued in the caller's transaction."""
    return enqueue(conn, review_request(account, repo, number, **options))


def enqueue_issue(conn: SyncConnection, account: str, repo: str, title: str, body: str, **options: Any) -> Action:
    """`issue_request` enqueued in the caller's transaction."""
    return enqueue(conn, issue_request(account, repo, title, body, **options))
