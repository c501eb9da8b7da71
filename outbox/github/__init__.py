"""GitHub: the GITHUB_POST kind, a comment or a review on a pull request, or an issue opened in a repository.

An application registers its accounts (`register_account`: a token, or a GitHub App's installation) and enqueues
with `enqueue_comment`, `enqueue_review` or `enqueue_issue` (or `outbox.enqueue` of a `*_request`); executors run
`github_adapters(engine)` (`outbox run --adapters outbox.github:github_adapters`, from a module that registers
the accounts first).

    import outbox ──▶ outbox.github.kind (GITHUB_POST's declaration; nothing else of this package)
    outbox.github.<name> ──first use──▶ its module: the accounts (outbox.github.accounts), the posts and their
                                        check (outbox.github.posts), the answers (outbox.github.replies), the
                                        adapter (outbox.github.adapter) with its client and read-back

Each name loads its module on first use, so registering GITHUB_POST at `import outbox` loads no GitHub client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox.github.accounts import (
        GithubAccount,
        GithubSecretError,
        UnknownAccount,
        account_named,
        add_secret_source,
        register_account,
    )
    from outbox.github.adapter import GithubAdapter, github_adapters
    from outbox.github.posts import (
        BODY_LIMIT,
        check_payload,
        comment_request,
        enqueue_comment,
        enqueue_issue,
        enqueue_review,
        issue_request,
        marker,
        review_request,
    )
    from outbox.github.replies import classify

# no name here may be a module of this package too (the module would replace the name once imported)
_HOMES = {
    "BODY_LIMIT": "outbox.github.posts",
    "GithubAccount": "outbox.github.accounts",
    "GithubAdapter": "outbox.github.adapter",
    "GithubSecretError": "outbox.github.accounts",
    "UnknownAccount": "outbox.github.accounts",
    "account_named": "outbox.github.accounts",
    "add_secret_source": "outbox.github.accounts",
    "check_payload": "outbox.github.posts",
    "classify": "outbox.github.replies",
    "comment_request": "outbox.github.posts",
    "enqueue_comment": "outbox.github.posts",
    "enqueue_issue": "outbox.github.posts",
    "enqueue_review": "outbox.github.posts",
    "github_adapters": "outbox.github.adapter",
    "issue_request": "outbox.github.posts",
    "marker": "outbox.github.posts",
    "register_account": "outbox.github.accounts",
    "review_request": "outbox.github.posts",
}

__all__ = [
    "BODY_LIMIT",
    "GithubAccount",
    "GithubAdapter",
    "GithubSecretError",
    "UnknownAccount",
    "account_named",
    "add_secret_source",
    "check_payload",
    "classify",
    "comment_request",
    "enqueue_comment",
    "enqueue_issue",
    "enqueue_review",
    "github_adapters",
    "issue_request",
    "marker",
    "register_account",
    "review_request",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
