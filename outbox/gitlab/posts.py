"""The three GitLab posts: a note, a review (diff discussions on a merge request), a new issue; their payloads,
the check at enqueue, and the marker each carries.

    note_request(host, project, body, merge_request=7 | issue=3, key) ─┐
    review_request(host, project, merge_request, shas, comments, key) ─┼─check_payload─▶ ActionRequest (GITLAB_POST)
    issue_request(host, project, title, description, labels, key)    ─┘   a field wrong ─▶ InvalidRequest naming it
    enqueue_note / enqueue_review / enqueue_issue ──outbox.enqueue──▶ the caller's transaction

The payload holds the post as it goes (the text, the lines), the host by its registered name and the project by
its path or id; check_payload refuses anything else and returns the destination, `gitlab:<host>`. Every body
carries the action's marker, `<!-- outbox:<32 hex digits> -->` (each discussion of a review its own,
`<!-- outbox:<digits>:<n> -->`): an HTML comment GitLab's page does not show, by which read-back finds the post.
The digits are the SHA-256 of the idempotency key, so the marker shows nothing of the key. A text that holds a
marker already is refused, and read-back counts a marker only as a body's last line: no text enqueued or quoted
by a person can pass for another action's post.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.action import Action
from outbox.errors import InvalidRequest
from outbox.gitlab.hosts import UnknownHost, destination_name, host_named
from outbox.gitlab.kind import GITLAB_POST
from outbox.intake import enqueue
from outbox.requests import ActionRequest
from outbox.store.caller import SyncConnection

# GitLab's longest note, and its longest issue description (characters, the marker included)
NOTE_LIMIT = 1_000_000
DESCRIPTION_LIMIT = 1_048_576
TITLE_LIMIT = 255
# a review's discussions are made by one attempt, inside its 60 s write window
MAX_COMMENTS = 20
MAX_LABELS = 50
LABEL_LIMIT = 255
MAX_ATTEMPTS = 8
# a project's full path (group/subgroup/project) or its numeric id
_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}(?:/[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}){1,20}")
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_MARKER = re.compile(r"<!-- outbox:([0-9a-f]{32})(?::([0-9]{1,3}))? -->")
_SHAS = ("base_sha", "start_sha", "head_sha")
_FIELDS = {
    "note": {"post", "host", "project", "target", "iid", "body"},
    "review": {"post", "host", "project", "iid", *_SHAS, "comments"},
    "issue": {"post", "host", "project", "title", "description", "labels"},
}
_COMMENT_FIELDS = {"path", "body", "new_line", "old_line", "old_path"}
_TARGETS = ("merge_request", "issue")


def marker_digits(idempotency_key: str) -> str:
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def marker(idempotency_key: str, discussion: int | None = None) -> str:
    """The hidden marker a post's body ends with: the action's, and for a review's discussion its number (1..)."""
    suffix = "" if discussion is None else f":{discussion}"
    return f"<!-- outbox:{marker_digits(idempotency_key)}{suffix} -->"


def marked(text: str, mark: str) -> str:
    """`text` with the marker on a line of its own at the end (a blank line between, so Markdown hides it)."""
    return f"{text}\n\n{mark}"


def markers_in(text: object) -> set[str]:
    """The marker a body read back ends with, as a line of its own (none, or one). A person who quotes a post
    in another, or pastes its marker mid-text, makes no post that counts as it."""
    if not isinstance(text, str):
        return set()
    last = text.rstrip().rpartition("\n")[2]
    return {last} if _MARKER.fullmatch(last) else set()


def check_payload(payload: Any) -> str:
    """GITLAB_POST's payload check at enqueue: one of the three posts, each field as documented and nothing
    else, its host registered in this process; InvalidRequest naming the field otherwise. Returns the
    destination, `gitlab:<host>`."""
    if not isinstance(payload, Mapping):
        raise InvalidRequest("payload", f"a GITLAB_POST payload is a JSON object, not a {type(payload).__name__}")
    post = payload.get("post")
    if not isinstance(post, str) or post not in _FIELDS:
        raise InvalidRequest("payload.post", f"must be one of note, review, issue, not {_shown(post)}")
    fields = _FIELDS[post]
    extra, missing = set(payload) - fields, fields - set(payload)
    if extra or missing:
        said = [f"unknown {sorted(extra)}" if extra else "", f"missing {sorted(missing)}" if missing else ""]
        raise InvalidRequest("payload", f"a {post} holds exactly {sorted(fields)}: " + "; ".join(s for s in said if s))
    host = payload["host"]
    try:
        host_named(host)
    except UnknownHost as unknown:
        raise InvalidRequest("payload.host", str(unknown)) from None
    check_project(payload["project"])
    _CHECKS[post](payload)
    return destination_name(host)


def check_project(project: object) -> None:
    if isinstance(project, int) and not isinstance(project, bool) and 0 < project < 2**63:
        return
    if isinstance(project, str) and _PATH.fullmatch(project) and ".." not in project:
        return
    raise InvalidRequest(
        "payload.project",
        "a project is its full path (group/project, group/subgroup/project: letters, digits, _, - and .) or its"
        f" numeric id, not {_shown(project)}",
    )


def _check_note(payload: Mapping[str, Any]) -> None:
    if payload["target"] not in _TARGETS:
        raise InvalidRequest("payload.target", f"must be merge_request or issue, not {_shown(payload['target'])}")
    _check_iid(payload["iid"], "payload.iid")
    _check_text(payload["body"], "payload.body", NOTE_LIMIT, len(marker("")) + 2)


def _check_review(payload: Mapping[str, Any]) -> None:
    _check_iid(payload["iid"], "payload.iid")
    for name in _SHAS:
        if not isinstance(payload[name], str) or not _SHA.fullmatch(payload[name]):
            raise InvalidRequest(f"payload.{name}", "must be a commit's 40 (or 64) lower case hex digits")
    comments = payload["comments"]
    if not isinstance(comments, list) or not 1 <= len(comments) <= MAX_COMMENTS:
        raise InvalidRequest("payload.comments", f"a review holds 1 to {MAX_COMMENTS} comments in a list")
    for number, comment in enumerate(comments, 1):
        _check_comment(comment, f"payload.comments[{number - 1}]")


def _check_comment(comment: object, where: str) -> None:
    if not isinstance(comment, Mapping):
        raise InvalidRequest(where, "a comment is an object with path, body and new_line or old_line")
    extra = set(comment) - _COMMENT_FIELDS
    if extra:
        raise InvalidRequest(where, f"unknown {sorted(extra)}; a comment holds {sorted(_COMMENT_FIELDS)}")
    for name in ("path", "old_path"):
        if name in comment or name == "path":
            value = comment.get(name)
            if not isinstance(value, str) or not 1 <= len(value) <= 4096 or "\x00" in value or value.startswith("/"):
                raise InvalidRequest(f"{where}.{name}", "a file's path in the repository, 1 to 4096 characters")
    lines = [comment[name] for name in ("new_line", "old_line") if name in comment]
    if not lines:
        raise InvalidRequest(where, "an inline comment needs a line: new_line (an added or kept line) or old_line")
    for name in ("new_line", "old_line"):
        if name in comment:
            _check_iid(comment[name], f"{where}.{name}")
    _check_text(comment.get("body"), f"{where}.body", NOTE_LIMIT, len(marker("", MAX_COMMENTS)) + 2)


def _check_issue(payload: Mapping[str, Any]) -> None:
    title = payload["title"]
    if not isinstance(title, str) or not title.strip() or len(title) > TITLE_LIMIT or _has_control(title):
        raise InvalidRequest("payload.title", f"a title is 1 to {TITLE_LIMIT} characters on one line, not blank")
    _check_text(payload["description"], "payload.description", DESCRIPTION_LIMIT, len(marker("")) + 2)
    labels = payload["labels"]
    if not isinstance(labels, list) or len(labels) > MAX_LABELS:
        raise InvalidRequest("payload.labels", f"labels are a list of at most {MAX_LABELS} names")
    for label in labels:
        if (
            not isinstance(label, str)
            or not label.strip()
            or label != label.strip()
            or len(label) > LABEL_LIMIT
            or "," in label
            or _has_control(label)
        ):
            raise InvalidRequest(
                "payload.labels", f"a label is 1 to {LABEL_LIMIT} characters, no comma, not {_shown(label)}"
            )


_CHECKS = {"note": _check_note, "review": _check_review, "issue": _check_issue}


def _check_iid(value: object, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**31:
        raise InvalidRequest(where, f"must be a positive integer, not {_shown(value)}")


def _check_text(text: object, where: str, limit: int, mark: int) -> None:
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest(where, "must be text, not blank")
    if "\x00" in text:
        raise InvalidRequest(where, "must hold no NUL character")
    if _MARKER.search(text):
        raise InvalidRequest(where, "must hold no outbox marker (<!-- outbox:... -->): outbox adds its own")
    if len(text) + mark > limit:
        raise InvalidRequest(
            where, f"is {len(text)} characters; GitLab takes {limit - mark} (with the marker, {limit})"
        )


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"a {type(value).__name__}" if not isinstance(value, int) else repr(value)
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:76] + "...'"


# -- the requests


def note_request(
    host: str,
    project: str | int,
    body: str,
    *,
    idempotency_key: str,
    merge_request: int | None = None,
    issue: int | None = None,
    lane_key: str | None = None,
    workspace_id: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> ActionRequest:
    """A note on merge request `merge_request` or on issue `issue` (one of the two). The lane is the target's
    unless given: the notes on one merge request are posted in the order enqueued."""
    if (merge_request is None) == (issue is None):
        raise InvalidRequest("merge_request", "a note goes on a merge request or on an issue: give exactly one")
    target, iid = ("merge_request", merge_request) if merge_request is not None else ("issue", issue)
    payload = {"post": "note", "host": host, "project": project, "target": target, "iid": iid, "body": body}
    sign = "!" if target == "merge_request" else "#"
    return _request(
        payload, idempotency_key, lane_key or f"gitlab:{host}:{project}{sign}{iid}", workspace_id, max_attempts
    )


def review_request(
    host: str,
    project: str | int,
    merge_request: int,
    *,
    base_sha: str,
    start_sha: str,
    head_sha: str,
    comments: Sequence[Mapping[str, Any]],
    idempotency_key: str,
    lane_key: str | None = None,
    workspace_id: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> ActionRequest:
    """A review: one diff discussion per comment (`path`, `body`, `new_line` and/or `old_line`, `old_path` when
    the file was renamed), on the merge request's diff version named by its three SHAs."""
    payload = {
        "post": "review",
        "host": host,
        "project": project,
        "iid": merge_request,
        "base_sha": base_sha,
        "start_sha": start_sha,
        "head_sha": head_sha,
        "comments": [dict(comment) for comment in comments],
    }
    lane = lane_key or f"gitlab:{host}:{project}!{merge_request}"
    return _request(payload, idempotency_key, lane, workspace_id, max_attempts)


def issue_request(
    host: str,
    project: str | int,
    title: str,
    description: str,
    *,
    idempotency_key: str,
    labels: Sequence[str] = (),
    lane_key: str | None = None,
    workspace_id: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> ActionRequest:
    """A new issue in the project, with its title, description and labels."""
    payload = {
        "post": "issue",
        "host": host,
        "project": project,
        "title": title,
        "description": description,
        "labels": list(labels),
    }
    return _request(payload, idempotency_key, lane_key or f"gitlab:{host}:{project}:issues", workspace_id, max_attempts)


def _request(
    payload: dict[str, Any], key: str, lane: str, workspace_id: int | None, max_attempts: int
) -> ActionRequest:
    check_payload(payload)
    return ActionRequest(
        kind=GITLAB_POST,
        lane_key=lane,
        idempotency_key=key,
        payload=payload,
        workspace_id=workspace_id,
        max_attempts=max_attempts,
    )


def enqueue_note(conn: SyncConnection, host: str, project: str | int, body: str, **options: Any) -> Action:
    """`note_request` enqueued in the caller's transaction (see `outbox.enqueue`)."""
    return enqueue(conn, note_request(host, project, body, **options))


def enqueue_review(conn: SyncConnection, host: str, project: str | int, merge_request: int, **options: Any) -> Action:
    """`review_request` enqueued in the caller's transaction."""
    return enqueue(conn, review_request(host, project, merge_request, **options))


def enqueue_issue(
    conn: SyncConnection, host: str, project: str | int, title: str, description: str, **options: Any
) -> Action:
    """`issue_request` enqueued in the caller's transaction."""
    return enqueue(conn, issue_request(host, project, title, description, **options))
