"""EmailNotice: one kind of email, prepared from its event at enqueue and again before every attempt.

    event (identifiers) ──recipients query──▶ rows (address, display_name) ──compose──▶ PreparedEmail
    enqueue: nobody found ─▶ the action its idempotency key holds, else InvalidRequest
    attempt: nobody found ─▶ CANCELLED / NOT_WANTED

A notice is declarative: a SQL query that finds who should receive it now (so a person who unsubscribed,
lost the role or lost the address drops out), and a function that writes the text. The same query runs on
the caller's sync connection at enqueue and on the adapter's async connection before each attempt.
The action's payload is `{"notice": name, "event": {...}}`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import TextClause

from outbox.action import Action
from outbox.email.kind import EMAIL
from outbox.email.message import Draft, PreparedEmail, Recipient
from outbox.errors import InvalidRequest, OutboxError
from outbox.event_definition import EventDefinition
from outbox.intake import enqueue, enqueue_async, held_action, held_action_async
from outbox.store.caller import AsyncConn, SyncConnection


class UnknownNotice(OutboxError, LookupError):
    def __init__(self, name: object) -> None:
        known = ", ".join(sorted(_NOTICES)) or "none"
        super().__init__(f"no email notice is registered as {name!r} (registered: {known})")


class EmailNotice(EventDefinition):
    """One kind of email: subclass it once, set the three class attributes (`name`, `workspace_scoped`,
    `recipients_query`), write the four methods (`params`, `compose`, `idempotency_key`, `lane_key`), and
    `register` an instance in every process that enqueues it or runs the executor (docs/email.md, "The
    notice interface"). `event` is always the JSON object of identifiers the action's payload holds. The
    Message-ID derives from `idempotency_key`. What every kind's definition shares (the rows, the action's
    request, its workspace and account) is EventDefinition's."""

    _kind = EMAIL
    _name_key = "notice"

    # SELECT address, display_name ... : who receives it now; binds the parameters `params` returns
    recipients_query: ClassVar[TextClause]

    @abstractmethod
    def compose(self, event: dict[str, Any], recipients: tuple[Recipient, ...]) -> Draft:
        """The subject and plain text for the recipients the query found now (at least one)."""

    def _rows_query(self) -> TextClause:
        return self.recipients_query

    def prepared(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> PreparedEmail | None:
        """The email for the rows the query found; None when no row names an address.

        A row with a NULL or empty address is skipped and a repeated address is kept once (the first row's
        display name wins); an invalid address or display name, or a subject or text the message cannot
        carry, raises InvalidEmail, and so does anything else the mail library refuses (a trial build).
        """
        email = self.composed(event, rows)
        if email is not None:
            email.check()
        return email

    def composed(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> PreparedEmail | None:
        """`prepared` without the trial build: every field checked (InvalidEmail), the message not built. The
        adapter's attempt builds the message it sends, which refuses what the trial would (outbox.email.message)."""
        recipients = PreparedEmail.recipients_of(rows)
        if not recipients:
            return None
        draft = self.compose(event, recipients)
        email = PreparedEmail(recipients, draft.subject, draft.text)
        email.check_fields()
        return email

    def prepare(self, conn: SyncConnection, event: dict[str, Any]) -> PreparedEmail | None:
        """The email as it would go now, or None when it would reach nobody."""
        return self.prepared(event, self.rows(conn, event))

    async def prepare_async(self, conn: AsyncConn, event: dict[str, Any]) -> PreparedEmail | None:
        """`prepare` on an async connection (as the adapter runs it before every attempt)."""
        return self.prepared(event, await self.rows_async(conn, event))


_NOTICES: dict[str, EmailNotice] = {}


def register(notice: EmailNotice) -> EmailNotice:
    known = _NOTICES.get(notice.name)
    if known is not None and known is not notice:
        raise ValueError(f"an email notice named {notice.name!r} is already registered")
    _NOTICES[notice.name] = notice
    return notice


def notice_named(name: object) -> EmailNotice:
    notice = _NOTICES.get(name) if isinstance(name, str) else None
    if notice is None:
        raise UnknownNotice(name)
    return notice


def notice_of(payload: Any) -> tuple[EmailNotice, dict[str, Any]]:
    """The notice and event an EMAIL action's payload holds."""
    if not isinstance(payload, dict) or not isinstance(payload.get("event"), dict):
        raise InvalidRequest("payload", 'an EMAIL payload is {"notice": name, "event": {...}}')
    return notice_named(payload.get("notice")), payload["event"]


def check_payload(payload: Any) -> None:
    """The EMAIL kind's payload check at enqueue: `{"notice": name, "event": {...}}` and nothing else, the
    notice registered in this process and its `params` accepting the event; InvalidRequest otherwise."""
    if not isinstance(payload, dict):
        shape = '{"notice": name, "event": {...}}'
        raise InvalidRequest("payload", f"an EMAIL payload is {shape}, not a {type(payload).__name__}")
    others = sorted(repr(key) for key in payload if key not in ("notice", "event"))
    if others:
        raise InvalidRequest("payload", f"an EMAIL payload holds only notice and event, not {', '.join(others[:3])}")
    try:
        notice = notice_named(payload.get("notice"))
    except UnknownNotice as unknown:
        raise InvalidRequest("payload.notice", str(unknown)) from None
    event = payload.get("event")
    if not isinstance(event, dict):
        raise InvalidRequest("payload.event", f"must be an object of the {notice.name} notice's identifiers")
    try:
        notice.params(event)
    except InvalidRequest as refused:
        raise InvalidRequest("payload.event", refused.message) from None
    except (LookupError, TypeError, ValueError) as error:
        raise InvalidRequest("payload.event", f"the {notice.name} notice cannot read it: {error!r}") from None


def _held_or_nobody(notice: EmailNotice, held: Action | None) -> Action:
    """The action the notice's key already holds; InvalidRequest when there is none."""
    if held is None:
        raise InvalidRequest("event", f"the {notice.name} notice would reach nobody (no recipient wants it now)")
    return held


def enqueue_email(conn: SyncConnection, notice: EmailNotice, event: dict[str, Any], *, max_attempts: int = 5) -> Action:
    """Prepare the notice now and enqueue it in the caller's transaction (see `outbox.enqueue`).

    A notice that reaches nobody now is refused (InvalidRequest naming `event`), unless its idempotency key
    already holds an action: that action is returned unchanged, as for any repeated key."""
    notice_named(notice.name)
    if notice.prepare(conn, event) is None:
        return _held_or_nobody(notice, held_action(conn, notice.request(event, max_attempts=max_attempts)))
    return enqueue(conn, notice.request(event, max_attempts=max_attempts))


async def enqueue_email_async(
    conn: AsyncConn, notice: EmailNotice, event: dict[str, Any], *, max_attempts: int = 5
) -> Action:
    """`enqueue_email` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    notice_named(notice.name)
    if await notice.prepare_async(conn, event) is None:
        return _held_or_nobody(notice, await held_action_async(conn, notice.request(event, max_attempts=max_attempts)))
    return await enqueue_async(conn, notice.request(event, max_attempts=max_attempts))
