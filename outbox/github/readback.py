"""Read-back: does GitHub already hold the post an earlier attempt made, found by its marker in the target's listing?

    comment ──GET /repos/{o}/{r}/issues/{n}/comments?since=<since>&per_page=100, page by page (ascending id)
    review  ──GET /repos/{o}/{r}/pulls/{n}/reviews?per_page=100, page by page (chronological; no `since` there)
    issue   ──GET /repos/{o}/{r}/issues?state=all&sort=created&direction=desc&since=<since>&per_page=100, page by
              page, stopping at the first issue created before <since>
        ──▶ the html_url of the first post whose body carries the marker, or None

`since` is the instant the claim of the action's first write took it, by the database's clock (never the
executor's: a host clock hours ahead would start the window after the post), less SINCE_MARGIN for a GitHub
clock behind it; GitHub's `since` takes posts updated at or after it, and a post is updated no earlier than it was
made. Never the search API: its index is filled after a post is made (seconds, at times minutes later), so a
search could miss a post that exists and outbox would make it twice. These listings read the repository's
own records, the same the post was written to. More than MAX_PAGES pages are not read within one attempt:
TooMany, and the caller cannot tell. Every answer is parsed by githubkit's typed models.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from outbox._internal.config.extras import needs
from outbox.errors import OutboxError
from outbox.github.posts import holds_marker

with needs("github"):
    from githubkit import GitHub

PER_PAGE = 100
MAX_PAGES = 30
# how far behind the database's clock GitHub's may run, at most
SINCE_MARGIN = timedelta(minutes=10)


class TooMany(OutboxError):
    """The listing is longer than read-back reads in one attempt."""


class Listed(Protocol):
    @property
    def body(self) -> Any: ...

    @property
    def html_url(self) -> str: ...


async def find_post(github: GitHub[Any], payload: dict[str, Any], mark: str, since: datetime) -> str | None:
    """The URL of the post carrying `mark` on the payload's target, or None when the listing proves there is none."""
    owner, repo = payload["repo"].split("/")
    after = since - SINCE_MARGIN
    if payload["post"] == "comment":

        async def comments(page: int) -> Sequence[Listed]:
            found = await github.rest.issues.async_list_comments(
                owner, repo, payload["number"], since=after, per_page=PER_PAGE, page=page
            )
            return found.parsed_data

        return await _first_marked(comments, mark)
    if payload["post"] == "review":

        async def reviews(page: int) -> Sequence[Listed]:
            found = await github.rest.pulls.async_list_reviews(
                owner, repo, payload["number"], per_page=PER_PAGE, page=page
            )
            return found.parsed_data

        return await _first_marked(reviews, mark)

    stop = False

    async def issues(page: int) -> Sequence[Listed]:
        nonlocal stop
        found = await github.rest.issues.async_list_for_repo(
            owner, repo, state="all", sort="created", direction="desc", since=after, per_page=PER_PAGE, page=page
        )
        listed: Sequence[Any] = found.parsed_data
        recent = [issue for issue in listed if issue.created_at >= after]
        stop = len(recent) < len(listed)  # sorted newest first: every later one is older still
        return recent

    return await _first_marked(issues, mark, lambda: stop)


async def _first_marked(
    listing: Callable[[int], Awaitable[Sequence[Listed]]], mark: str, done: Callable[[], bool] = lambda: False
) -> str | None:
    for page in range(1, MAX_PAGES + 1):
        posts = await listing(page)
        for post in posts:
            if holds_marker(post.body, mark):
                return post.html_url
        if len(posts) < PER_PAGE or done():
            return None
    raise TooMany(f"read-back: more than {MAX_PAGES * PER_PAGE} posts to read on the target")
