"""An email as a notice prepares it, checked so that every header can be written, and the message the relay receives.

    recipients query rows ─▶ recipients_of: skip NULL/empty, refuse invalid, drop duplicates ─▶ notice.compose
        ─▶ Draft ─▶ PreparedEmail.check_fields(): every field ─▶ InvalidEmail, or
           at enqueue, check(): then a trial build (written) ─▶ InvalidEmail, or accepted
           before an attempt: written(email, sender, Message-ID, send time): build_message, message_bytes
               ─▶ InvalidEmail, or DATA

`check_fields` refuses whatever the mail library (Python's `email` package, default policy) would refuse or
change: line breaks of any kind, control characters, unpaired surrogates, the start of an encoded word
(`=?utf-8?Q?`, which the library decodes when a header is set, CR LF included), and values over the
lengths below; `check` then builds the message once (`written`), so that anything else the library refuses
is refused too. The notice runs `check` at enqueue (InvalidEmail, an InvalidRequest); before every attempt
it runs `check_fields`, and the message the attempt sends is itself built by `written`, whose refusal is the
same InvalidEmail (the adapter returns Failed, before the fence): one build an attempt, not a trial and then
the real one.

The library makes a new header class every time its HeaderRegistry is asked for one (`type()`, for each
header of each message, each time it is set and again as it is written): outbox's registry makes each once
and hands out the same class after (`_HeadersMadeOnce`), which halves the CPU of building a message.

`build_message` writes the headers RFC 5322 requires (From, Date, Message-ID) and never shows one
recipient another's address: one recipient is the `To:`, several are `To: undisclosed-recipients:;` with
every address only in the envelope (RCPT TO). A subject loses its surrounding whitespace, a display name
also its runs of whitespace (one space each), as mail programs read them anyway. From and To are folded
by outbox when their display name is not ASCII (see `_MailboxHeader`), everything else by the library.

The Message-ID derives from the idempotency key alone, so every attempt on every replica sends the same
one and a receiving system can deduplicate. Errors name the field, never its value; nothing in this module
logs an address, a name or a subject.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import Address, BaseHeader, Group, HeaderRegistry, UniqueAddressHeader
from email.message import EmailMessage
from email.policy import Policy
from email.policy import default as default_policy
from email.utils import format_datetime
from typing import Any

from outbox.errors import InvalidRequest

# RFC 5322 2.1.1: a line of a message is at most 998 characters (octets once written), CRLF excluded
MAX_LINE_LENGTH = 998
MAX_SUBJECT_LENGTH = 255
MAX_DISPLAY_NAME_LENGTH = 200
# RFC 5321 4.5.3.1: an address of at most 254 octets, its local part at most 64, a domain label at most 63
MAX_ADDRESS_LENGTH = 254
MAX_LOCAL_PART_LENGTH = 64

# the line breaks str.splitlines() knows, which the mail library refuses in a header
_LINE_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# C0 controls (tab included), DEL, C1 controls; NUL among them
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# the start of an RFC 2047 encoded word: the mail library decodes one wherever it finds it when a header is
# set (a CR LF encoded in one becomes a real line break) and mail programs decode it when they read one
_ENCODED_WORD = re.compile(r"=\?[^?]*\?[bBqQ]\?")
# a dot-atom local part (RFC 5322 3.2.3), ASCII only: no quoted local parts, no SMTPUTF8
_LOCAL_PART = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
# a host name: labels of letters, digits and inner hyphens, at most 63 each
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_LABEL = re.compile(_LABEL)
_DOMAIN = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")
UNDISCLOSED_RECIPIENTS = "undisclosed-recipients"


class InvalidEmail(InvalidRequest):
    """A recipient, sender or header the email cannot carry. Names the field, never its value."""


@dataclass(frozen=True)
class Recipient:
    address: str
    display_name: str = ""


@dataclass(frozen=True)
class Draft:
    subject: str
    text: str


@dataclass(frozen=True)
class PreparedEmail:
    """What one attempt sends: the recipients the notice found now, and the text it composed."""

    recipients: tuple[Recipient, ...]
    subject: str
    text: str

    @staticmethod
    def recipients_of(rows: Sequence[Mapping[str, Any]]) -> tuple[Recipient, ...]:
        """The recipients a notice's query found: see `recipients_of`."""
        return recipients_of(rows)

    def check(self) -> None:
        """Raise InvalidEmail unless every field can be written and the message can be built."""
        self.check_fields()
        # whatever else the mail library refuses, refused here rather than before each attempt
        written(self, _TRIAL_SENDER, "<trial@outbox.invalid>", _TRIAL_DATE)

    def check_fields(self) -> None:
        """Raise InvalidEmail unless every field can be written (the message is not built)."""
        for index, recipient in enumerate(self.recipients, 1):
            check_address(f"recipient {index} address", recipient.address)
            check_display_name(f"recipient {index} display name", recipient.display_name)
        check_header("subject", self.subject)
        if len(subject_text(self.subject)) > MAX_SUBJECT_LENGTH:
            raise InvalidEmail("subject", f"is longer than {MAX_SUBJECT_LENGTH} characters")
        check_body("text", self.text)


_TRIAL_SENDER = Recipient("sender@outbox.invalid", "")
_TRIAL_DATE = datetime(2000, 1, 1, tzinfo=UTC)


def recipients_of(rows: Sequence[Mapping[str, Any]]) -> tuple[Recipient, ...]:
    """Who the rows name: a NULL or empty address is skipped, an invalid one refused, a repeated one dropped.

    Two addresses are the same when they match with the domain's case ignored (the local part's case is
    kept: RFC 5321 lets a mailbox tell `Ann` from `ann`); the first row wins, with its display name.
    Rows are numbered from 1 in errors, in the query's order.
    """
    recipients: dict[str, Recipient] = {}
    for number, row in enumerate(rows, 1):
        address = row["address"]
        if address is None or address == "":
            continue
        check_address(f"recipient {number} address", address)
        name = row["display_name"]
        name = "" if name is None else name
        check_display_name(f"recipient {number} display name", name)
        recipients.setdefault(address_key(address), Recipient(address, name))
    return tuple(recipients.values())


def address_key(address: str) -> str:
    """The address as duplicates are found: the domain in lower case."""
    local, _, domain = address.rpartition("@")
    return f"{local}@{domain.lower()}"


def check_header(field: str, value: object) -> str:
    """The value, unless it is text a header cannot carry as it is: a line break, a control character, a
    surrogate, or what reads as an encoded word."""
    if not isinstance(value, str):
        raise InvalidEmail(field, "is not text")
    if _LINE_BREAK.search(value):
        raise InvalidEmail(field, "contains a line break, which could inject a header")
    if _CONTROL.search(value):
        raise InvalidEmail(field, "contains a control character")
    if _SURROGATE.search(value):
        raise InvalidEmail(field, "contains an unpaired surrogate, which is not text")
    if _ENCODED_WORD.search(value):
        raise InvalidEmail(field, "contains the start of an encoded word (=?charset?Q? or ?B?), which would be decoded")
    return value


def check_display_name(field: str, value: object) -> None:
    value = check_header(field, value)
    if len(display_name(value)) > MAX_DISPLAY_NAME_LENGTH:
        raise InvalidEmail(field, f"is longer than {MAX_DISPLAY_NAME_LENGTH} characters")


def check_address(field: str, value: object) -> None:
    address = check_header(field, value)
    local, at, domain = address.rpartition("@")
    if (
        not at
        or len(address) > MAX_ADDRESS_LENGTH
        or len(local) > MAX_LOCAL_PART_LENGTH
        or not _LOCAL_PART.fullmatch(local)
        or not _DOMAIN.fullmatch(domain)
    ):
        raise InvalidEmail(
            field,
            f"is not a valid email address (local@domain, ASCII, at most {MAX_ADDRESS_LENGTH} characters,"
            f" {MAX_LOCAL_PART_LENGTH} before the @)",
        )


def check_body(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise InvalidEmail(field, "is not text")
    if "\x00" in value:
        raise InvalidEmail(field, "contains NUL, which SMTP cannot carry")
    if _SURROGATE.search(value):
        raise InvalidEmail(field, "contains an unpaired surrogate, which is not text")


def subject_text(subject: str) -> str:
    """The subject as written: without surrounding whitespace."""
    return subject.strip()


def display_name(name: str) -> str:
    """A display name as written: runs of whitespace become one space, none around it."""
    return " ".join(name.split())


def message_id(idempotency_key: str, domain: str) -> str:
    """The same Message-ID for every attempt of one action, on every replica."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
    return f"<outbox.{digest}@{domain}>"


class _MailboxHeader(UniqueAddressHeader, BaseHeader):  # type: ignore[misc]  # as HeaderRegistry combines them
    """From and To as outbox writes them. A display name that is not ASCII is written as encoded words of at
    most 72 characters, each holding whole characters and separated by folds only: RFC 2047 readers join
    them without a space. (The folder of Python 3.11 can fold at a space of the name between two encoded
    words, where readers drop that space.) Anything else is folded by the mail library."""

    def fold(self, *, policy: Policy) -> str:
        mailboxes = self.addresses
        if len(mailboxes) != 1 or self.groups[0].display_name is not None or mailboxes[0].display_name.isascii():
            return super().fold(policy=policy)
        mailbox = mailboxes[0]
        first, *others = _encoded_words(mailbox.display_name)
        lines = [f"{self.name}: {first}", *(f" {word}" for word in others)]
        tail = f" <{mailbox.addr_spec}>"
        if len(lines[-1]) + len(tail) <= _FOLD_AT:
            lines[-1] += tail
        else:
            lines.append(tail)
        return policy.linesep.join(lines) + policy.linesep


_FOLD_AT = 78
# 45 octets of UTF-8 make 60 characters of base64: with `=?utf-8?b?` and `?=`, 72 (RFC 2047 allows 75)
_ENCODED_WORD_OCTETS = 45


def _encoded_words(text: str) -> list[str]:
    """`text` as base64 encoded words, each of whole characters and at most 72 characters long."""
    chunks: list[bytes] = [b""]
    for character in text:
        octets = character.encode()
        if len(chunks[-1]) + len(octets) > _ENCODED_WORD_OCTETS:
            chunks.append(b"")
        chunks[-1] += octets
    return [f"=?utf-8?b?{base64.b64encode(chunk).decode()}?=" for chunk in chunks]


class _HeadersMadeOnce(HeaderRegistry):
    """A HeaderRegistry that makes the class of each header name once: the library's makes a new one with
    `type()` every time it is asked, though every one it makes for a name is the same."""

    def __init__(self) -> None:
        super().__init__()
        self._made: dict[str, type[BaseHeader]] = {}

    def __getitem__(self, name: str) -> type[BaseHeader]:
        key = name.lower()
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = super().__getitem__(name)
        return made

    def map_to_type(self, name: str, cls: type[BaseHeader]) -> None:
        super().map_to_type(name, cls)
        self._made.pop(name.lower(), None)


_HEADERS = _HeadersMadeOnce()
_HEADERS.map_to_type("from", _MailboxHeader)
_HEADERS.map_to_type("to", _MailboxHeader)
# the default policy (lines of 78, CTE chosen by content), with outbox's From and To
POLICY = default_policy.clone(header_factory=_HEADERS)


def build_message(email: PreparedEmail, sender: Recipient, message_id_value: str, sent_at: datetime) -> EmailMessage:
    """The message for a checked email, dated `sent_at` (shown in UTC); the mail library raises on anything else."""
    message = EmailMessage(policy=POLICY)
    message["From"] = _address(sender)
    if len(email.recipients) == 1:
        message["To"] = _address(email.recipients[0])
    else:  # the addresses go in the envelope only: nobody sees who else received it
        message["To"] = Group(UNDISCLOSED_RECIPIENTS)
    message["Subject"] = subject_text(email.subject)
    message["Date"] = format_datetime(sent_at.astimezone(UTC))
    message["Message-ID"] = message_id_value
    message.set_content(email.text)
    return message


def written(email: PreparedEmail, sender: Recipient, message_id_value: str, sent_at: datetime) -> bytes:
    """What DATA sends for a checked email (`build_message`, then `message_bytes`); InvalidEmail for anything
    the mail library refuses, named by the field when outbox knows it, else as the message's."""
    try:
        return message_bytes(build_message(email, sender, message_id_value, sent_at))
    except InvalidEmail:
        raise
    except Exception as error:
        raise InvalidEmail("message", f"cannot be written ({type(error).__name__})") from None


def message_bytes(message: EmailMessage) -> bytes:
    """What DATA sends; InvalidEmail when a line would be longer than RFC 5322 allows."""
    written = message.as_bytes()
    if any(len(line) > MAX_LINE_LENGTH for line in written.splitlines()):
        raise InvalidEmail("message", f"has a line longer than {MAX_LINE_LENGTH} characters")
    return written


def _address(recipient: Recipient) -> Address:
    local, _, domain = recipient.address.rpartition("@")
    return Address(display_name=display_name(recipient.display_name), username=local, domain=domain)
