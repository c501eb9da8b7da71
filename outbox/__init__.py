"""outbox: carry out a product's effects on the outside world as reliably as the database that records them.

The public API, re-exported; nothing else. Each name loads its module on first use, so importing `outbox`
(or the `outbox` command) costs nothing it does not use. It registers the kinds outbox brings (EMAIL, WEBHOOK,
NATS_EVENT, SLACK_MESSAGE, GITHUB_POST and GITLAB_POST, from the `kind` module of `outbox.email`,
`outbox.webhook`, `outbox.nats`, `outbox.slack`, `outbox.github` and `outbox.gitlab`, which load no client
library) and nothing else: an application registers its own kinds' adapters, email notices, webhook
endpoints and events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# the kinds' declarations (ActionKind.EMAIL, WEBHOOK, ...), and nothing else of their packages
import outbox.email.kind
import outbox.github.kind
import outbox.gitlab.kind
import outbox.nats.kind
import outbox.slack.kind
import outbox.webhook.kind  # noqa: F401
from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox._internal.connections.engines import psycopg_url
    from outbox.action import Action
    from outbox.erasure import erase_account, erase_account_async
    from outbox.errors import ActionNotFound, InvalidRequest, OutboxError, TransitionRefused
    from outbox.intake import admit, cancel, enqueue, enqueue_async, enqueue_many, enqueue_many_async, refuse
    from outbox.kinds import ActionKind
    from outbox.requests import ActionRequest
    from outbox.states import ActionState, StopReason

# no name here may be a module of this package too (the module would replace the name once imported)
_HOMES = {
    "Action": "outbox.action",
    "ActionKind": "outbox.kinds",
    "ActionNotFound": "outbox.errors",
    "ActionRequest": "outbox.requests",
    "ActionState": "outbox.states",
    "InvalidRequest": "outbox.errors",
    "OutboxError": "outbox.errors",
    "StopReason": "outbox.states",
    "TransitionRefused": "outbox.errors",
    "admit": "outbox.intake",
    "cancel": "outbox.intake",
    "enqueue": "outbox.intake",
    "enqueue_async": "outbox.intake",
    "enqueue_many": "outbox.intake",
    "enqueue_many_async": "outbox.intake",
    "erase_account": "outbox.erasure",
    "erase_account_async": "outbox.erasure",
    "psycopg_url": "outbox._internal.connections.engines",
    "refuse": "outbox.intake",
}

__all__ = [
    "Action",
    "ActionKind",
    "ActionNotFound",
    "ActionRequest",
    "ActionState",
    "InvalidRequest",
    "OutboxError",
    "StopReason",
    "TransitionRefused",
    "admit",
    "cancel",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "erase_account",
    "erase_account_async",
    "psycopg_url",
    "refuse",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
