"""An email as a notice prepares it, checked for header injection, and the MIME message the relay receives.

    notice.compose(event, recipients) ─▶ Draft ─▶ PreparedEmail.check() ─▶ build_message(..., Message-ID)

The Message-ID derives from the idempotency key alone, so every attempt on every replica sends the same
one and a receiving system can deduplicate. Addresses and display names are checked here, once for
enqueue and again before every attempt; nothing in this module logs them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage

from outbox.errors import InvalidRequest

# local@domain: no spaces, no CR/LF, one @, a domain of labels (letters, digits, hyphens)
_ADDRESS = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*$"
)
MAX_SUBJECT_LENGTH = 998


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

    def check(self) -> None:
        for index, recipient in enumerate(self.recipients):
            check_address(f"recipient {index + 1} address", recipient.address)
            check_header(f"recipient {index + 1} display name", recipient.display_name)
        check_header("subject", self.subject)
        if len(self.subject) > MAX_SUBJECT_LENGTH:
            raise InvalidEmail("subject", f"is longer than {MAX_SUBJECT_LENGTH} characters")


def check_header(field: str, value: str) -> None:
    """Refuse a value that could start a new header line (CR, LF, NUL)."""
    if any(c in value for c in "\r\n\x00"):
        raise InvalidEmail(field, "contains a line break or NUL, which could inject a header")


def check_address(field: str, address: str) -> None:
    check_header(field, address)
    if len(address) > 254 or not _ADDRESS.match(address):
        raise InvalidEmail(field, "is not a valid email address (local@domain)")


def message_id(idempotency_key: str, domain: str) -> str:
    """The same Message-ID for every attempt of one action, on every replica."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
    return f"<outbox.{digest}@{domain}>"


def build_message(email: PreparedEmail, sender: Recipient, message_id_value: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = _address(sender)
    message["To"] = [_address(r) for r in email.recipients]
    message["Subject"] = email.subject
    message["Message-ID"] = message_id_value
    message.set_content(email.text)
    return message


def _address(recipient: Recipient) -> Address:
    local, _, domain = recipient.address.rpartition("@")
    return Address(display_name=recipient.display_name, username=local, domain=domain)
