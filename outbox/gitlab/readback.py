"""Read-back: which of an action's markers GitLab already holds, from the target's own listing.

    note   ──GET …/(merge_requests|issues)/:iid/notes?order_by=created_at&sort=desc&per_page=100, page by page──▶
              stop at the first note created before `since`
    review ──GET …/merge_requests/:iid/discussions?per_page=100, every page (GitLab lists them in creation order
              and takes no sort or date filter)──▶ each discussion's first note
    issue  ──GET …/projects/:id/issues?created_after=<since>&order_by=created_at&sort=asc&per_page=100, every page
        ──▶ {marker: the post's attributes} for each wanted marker a body or description ends with; the read
            stops as soon as every wanted marker is found

`since` is the instant the claim of the action's first write took it, by the database's clock (never the
executor's, which may be hours off), less SINCE_MARGIN for a GitLab clock that runs behind. Every listing reads
GitLab's database, not a search index: a post is listed once its create committed. GitLab's database load
balancing sends a user's reads to the primary after that user wrote, until the replicas have caught up, so the
token that made a post sees it. More than MAX_PAGES pages cannot be read inside
one attempt: `TooMany`, and the caller cannot tell.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from outbox._internal.config.extras import needs
from outbox.errors import OutboxError
from outbox.gitlab.client import NO_RETRY, noteable, project_of
from outbox.gitlab.posts import markers_in

with needs("gitlab"):
    import gitlab

PER_PAGE = 100
MAX_PAGES = 50
# how far behind the database's clock GitLab's may run, at most
SINCE_MARGIN = timedelta(minutes=10)


class TooMany(OutboxError):
    """The listing is longer than read-back reads in one attempt."""


def notes_holding(
    gl: gitlab.Gitlab, project: str | int, target: str, iid: int, wanted: set[str], since: datetime, timeout: float
) -> dict[str, dict[str, Any]]:
    listing = noteable(gl, project, target, iid).notes.list(
        iterator=True, order_by="created_at", sort="desc", per_page=PER_PAGE, timeout=timeout, **NO_RETRY
    )
    found: dict[str, dict[str, Any]] = {}
    for number, note in enumerate(listing):
        attributes = dict(note.attributes)
        if _instant(attributes.get("created_at")) < since - SINCE_MARGIN:
            break  # sorted newest first: every later one is older still
        _bounded(number)
        found.update((mark, attributes) for mark in markers_in(attributes.get("body")) & wanted)
        if len(found) == len(wanted):
            break
    return found


def discussions_holding(
    gl: gitlab.Gitlab, project: str | int, iid: int, wanted: set[str], timeout: float
) -> dict[str, dict[str, Any]]:
    listing = noteable(gl, project, "merge_request", iid).discussions.list(
        iterator=True, per_page=PER_PAGE, timeout=timeout, **NO_RETRY
    )
    found: dict[str, dict[str, Any]] = {}
    for number, discussion in enumerate(listing):
        _bounded(number)
        notes = discussion.attributes.get("notes") or []
        first = notes[0] if notes and isinstance(notes[0], dict) else {}
        found.update((mark, dict(discussion.attributes)) for mark in markers_in(first.get("body")) & wanted)
        if len(found) == len(wanted):
            break
    return found


def issues_holding(
    gl: gitlab.Gitlab, project: str | int, wanted: set[str], since: datetime, timeout: float
) -> dict[str, dict[str, Any]]:
    listing = project_of(gl, project).issues.list(
        iterator=True,
        created_after=(since - SINCE_MARGIN).isoformat(),
        order_by="created_at",
        sort="asc",
        per_page=PER_PAGE,
        timeout=timeout,
        **NO_RETRY,
    )
    found: dict[str, dict[str, Any]] = {}
    for number, issue in enumerate(listing):
        _bounded(number)
        attributes = dict(issue.attributes)
        found.update((mark, attributes) for mark in markers_in(attributes.get("description")) & wanted)
        if len(found) == len(wanted):
            break
    return found


def _bounded(number: int) -> None:
    if number >= PER_PAGE * MAX_PAGES:
        raise TooMany(f"read-back: the listing holds more than {PER_PAGE * MAX_PAGES} posts since the first write")


def _instant(value: object) -> datetime:
    """A GitLab timestamp (2026-12-04T21:00:00.123Z); an unreadable one counts as new (it is looked at)."""
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return datetime.max.replace(tzinfo=UTC)
