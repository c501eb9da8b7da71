"""GitLab: the GITLAB_POST kind's adapter, its hosts and its three posts (a note, a review, a new issue).

An application registers its hosts (`register_host`) and enqueues with `enqueue_note`, `enqueue_review` and
`enqueue_issue` (or `outbox.enqueue_async` of `note_request`, `review_request`, `issue_request`); executors run
`gitlab_adapters(engine)` (`outbox run --adapters outbox.gitlab:gitlab_adapters`, from a module that registers
the hosts first). docs/gitlab.md says how.

    import outbox ──▶ outbox.gitlab.kind (GITLAB_POST's declaration; nothing else of this package)
    outbox.gitlab.<name> ──first use──▶ its module: the hosts (outbox.gitlab.hosts), the posts and their check
                                        (outbox.gitlab.posts), the adapter (outbox.gitlab.adapter), which
                                        loads python-gitlab (outbox.gitlab.client, outbox.gitlab.readback)

Each name loads its module on first use, so registering GITLAB_POST at `import outbox` loads no GitLab client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox.gitlab.adapter import GitlabAdapter, classify, gitlab_adapters
    from outbox.gitlab.hosts import (
        GitlabHost,
        GitlabTokenError,
        UnknownHost,
        add_token_source,
        host_named,
        register_host,
    )
    from outbox.gitlab.posts import (
        check_payload,
        enqueue_issue,
        enqueue_note,
        enqueue_review,
        issue_request,
        marker,
        note_request,
        review_request,
    )

# no name here may be a module of this package too (the module would replace the name once imported)
_HOMES = {
    "GitlabAdapter": "outbox.gitlab.adapter",
    "GitlabHost": "outbox.gitlab.hosts",
    "GitlabTokenError": "outbox.gitlab.hosts",
    "UnknownHost": "outbox.gitlab.hosts",
    "add_token_source": "outbox.gitlab.hosts",
    "check_payload": "outbox.gitlab.posts",
    "classify": "outbox.gitlab.adapter",
    "enqueue_issue": "outbox.gitlab.posts",
    "enqueue_note": "outbox.gitlab.posts",
    "enqueue_review": "outbox.gitlab.posts",
    "gitlab_adapters": "outbox.gitlab.adapter",
    "host_named": "outbox.gitlab.hosts",
    "issue_request": "outbox.gitlab.posts",
    "marker": "outbox.gitlab.posts",
    "note_request": "outbox.gitlab.posts",
    "register_host": "outbox.gitlab.hosts",
    "review_request": "outbox.gitlab.posts",
}

__all__ = [
    "GitlabAdapter",
    "GitlabHost",
    "GitlabTokenError",
    "UnknownHost",
    "add_token_source",
    "check_payload",
    "classify",
    "enqueue_issue",
    "enqueue_note",
    "enqueue_review",
    "gitlab_adapters",
    "host_named",
    "issue_request",
    "marker",
    "note_request",
    "register_host",
    "review_request",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
