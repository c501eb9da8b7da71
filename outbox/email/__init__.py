"""Email: the EMAIL kind's adapter, its notices, the message it sends, and a local SMTP sink.

An application defines an `EmailNotice` per kind of email, registers it, and enqueues with
`enqueue_email`; executors run `email_adapters(engine)` (the `outbox run` default).
"""

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.email.adapter import EmailAdapter, SmtpSettings, classify_reply
from outbox.email.message import Draft, InvalidEmail, PreparedEmail, Recipient, message_id
from outbox.email.notice import (
    EmailNotice,
    UnknownNotice,
    enqueue_email,
    enqueue_email_async,
    notice_named,
    register,
)
from outbox.executor import ActionAdapter
from outbox.settings import load_settings


def email_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The EMAIL adapter configured from OUTBOX_SMTP_*; the application registers its notices first."""
    return [EmailAdapter(engine, SmtpSettings.from_settings(load_settings()))]


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
