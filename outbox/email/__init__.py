"""Email: the EMAIL kind's adapter, its notices, the message it sends, and a local SMTP sink.

An application defines an `EmailNotice` per kind of email, registers it, and enqueues with
`enqueue_email`; executors run `email_adapters(engine)` (the `outbox run` default).

    import outbox ──▶ outbox.email.kind (EMAIL's declaration; nothing else of this package)
    outbox.email.<name> ──first use──▶ its module: the notices (outbox.email.notice), the message
                                       (outbox.email.message), the adapter and SMTP (outbox.email.adapter)

Each name loads its module on first use, so registering EMAIL at `import outbox` loads no SMTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox.email.adapter import EmailAdapter, SmtpSettings, email_adapters
    from outbox.email.message import Draft, InvalidEmail, PreparedEmail, Recipient, message_id
    from outbox.email.notice import (
        EmailNotice,
        UnknownNotice,
        enqueue_email,
        enqueue_email_async,
        notice_named,
        register,
    )
    from outbox.email.replies import classify_reply

# no name here may be a module of this package too (the module would replace the name once imported)
_HOMES = {
    "Draft": "outbox.email.message",
    "EmailAdapter": "outbox.email.adapter",
    "EmailNotice": "outbox.email.notice",
    "InvalidEmail": "outbox.email.message",
    "PreparedEmail": "outbox.email.message",
    "Recipient": "outbox.email.message",
    "SmtpSettings": "outbox.email.adapter",
    "UnknownNotice": "outbox.email.notice",
    "classify_reply": "outbox.email.replies",
    "email_adapters": "outbox.email.adapter",
    "enqueue_email": "outbox.email.notice",
    "enqueue_email_async": "outbox.email.notice",
    "message_id": "outbox.email.message",
    "notice_named": "outbox.email.notice",
    "register": "outbox.email.notice",
}

__all__ = [
    "Draft",
    "EmailAdapter",
    "EmailNotice",
    "InvalidEmail",
    "PreparedEmail",
    "Recipient",
    "SmtpSettings",
    "UnknownNotice",
    "classify_reply",
    "email_adapters",
    "enqueue_email",
    "enqueue_email_async",
    "message_id",
    "notice_named",
    "register",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
