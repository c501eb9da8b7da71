"""EmailAdapter: the only adapter of EMAIL and the only code that talks SMTP.

    payload ─▶ the notice's recipients query (who wants it now?) ─▶ notice.composed ─ nobody ─▶ Cancelled NOT_WANTED
        ─ a field the message cannot carry ─▶ Failed
        ─▶ written: the message built once (stable Message-ID, Date now) ─ the mail library refuses ─▶ Failed
        ─▶ fence ─▶ connect, EHLO (helo name), STARTTLS, login, MAIL, RCPT
        ─▶ window re-checked ─▶ DATA ─▶ classify what the relay answered

The whole SMTP exchange runs under the fence's deadline; a slower relay is cut off and classified by the
stage it had reached. Results carry stage names and reply codes only, never an address, a reply's text or
the body: the executor keeps each result's reason as the action's last_error (`rcpt: 550; every recipient
refused`). Before it prepares the email, the adapter notes the action's trace (`attempt.note`): the notice's
name and the Message-ID, which outlive the payload, so an operator can find an UNCERTAIN email in the
relay's logs. The executor writes the trace with the fence (durable before anything is sent) or with the
result, and shows it in the UNCERTAIN warning line and the drain's events; the adapter runs no SQL of its
own beyond the notice's recipients query.

A reply the relay gives is classified by the rules of `outbox.email.replies` (REPLY_RULES, shown in
docs/email.md): before DATA, a 421 or a 4xx that means a rate, a throttle or greylisting is a slow-down,
so the attempt ends Defer (nothing was sent, it does not count) and waits a backoff that grows with the
action's earlier uncounted claims (`attempt.uncounted_claims()`, `outbox.executor.backoff.slow_down_delay`:
SMTP names no time); any other 4xx is Retry, a 5xx at MAIL FROM or to every RCPT TO is Failed; from DATA
on, a 4xx is Retry, a 5xx Failed, anything else Uncertain. What the rules alone do not decide:

| stage                        | what happened                                 | result                         |
| connect, EHLO, TLS, login    | refused, dropped, timed out                   | Retry                          |
| STARTTLS                     | required, and the relay does not offer it     | Retry                          |
| RCPT TO                      | any 4xx / every recipient 5xx / some 5xx      | the rules (a slow-down first) /|
|                              |                                               | Failed / send the rest (Done   |
|                              |                                               | notes the refusals)            |
| before DATA                  | the write window closed                       | Retry                          |
| DATA and after               | dropped, timed out                            | Uncertain PROVIDER_UNCERTAIN   |
| DATA                         | 250                                           | Done, the reply as readback_ref|

When some recipients were refused with 5xx and the others took the message, the result is Done and its
readback_ref ends with `| N of M recipients refused: 550, 553` (counts and codes, never an address).
The EHLO name is `SmtpSettings.helo_name` when set; otherwise the sender's domain when it is a public
host name, else this machine's fully qualified name when that is one, else the address literal of the
connection's own end (`[192.0.2.1]`): never `localhost` unless configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import aiosmtplib
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox._internal.checks.provider_urls import is_loopback
from outbox._internal.config.rates import Rate, parse_rate
from outbox._internal.connections.engines import answered_connection
from outbox.email.kind import EMAIL
from outbox.email.message import (
    HOST_LABEL,
    InvalidEmail,
    PreparedEmail,
    Recipient,
    check_address,
    check_display_name,
    message_id,
    written,
)
from outbox.email.notice import notice_of
from outbox.email.replies import classify_reply
from outbox.email.settings import EmailSettings, load_settings
from outbox.executor import (
    ActionAdapter,
    ActionAttempt,
    Cancelled,
    Defer,
    Done,
    Failed,
    Result,
    Retry,
    Uncertain,
    WriteWindow,
)
from outbox.kinds import ActionKind

TlsMode = Literal["auto", "starttls", "implicit", "none"]
# the longest readback_ref the adapter records
READBACK_LIMIT = 500
# names under these are never public host names (RFC 6761, RFC 6762 and common private uses)
_PRIVATE_SUFFIXES = ("localhost", "localdomain", "local", "invalid", "test", "internal", "lan", "home")


@dataclass(frozen=True)
class SmtpSettings:
    host: str
    port: int
    sender: str
    sender_name: str = ""
    # auto: none on a loopback relay, STARTTLS required anywhere else
    tls: TlsMode = "auto"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # the longest one SMTP command may take (the write window bounds the whole exchange too)
    timeout_seconds: float = 30.0
    # a CA bundle (or a self-signed certificate) to trust besides the system's
    ca_file: Path | None = None
    # the name EHLO gives; None: derived (see the module's docstring and `default_helo_name`)
    helo_name: str | None = None
    # the relay's rate for all executors together; None: none (outbox._internal.config.rates)
    rate: Rate | None = None

    def __post_init__(self) -> None:
        check_address("smtp sender", self.sender)
        check_display_name("smtp sender name", self.sender_name)
        if self.helo_name is not None and not is_helo_name(self.helo_name):
            raise ValueError("smtp helo name must be a host name or an address literal such as [192.0.2.1]")
        if not 0 < self.port < 65536:
            raise ValueError(f"smtp port must be 1-65535, not {self.port}")

    @classmethod
    def from_settings(cls, settings: EmailSettings) -> SmtpSettings:
        return cls(
            host=settings.smtp_host,
            port=settings.smtp_port,
            sender=settings.smtp_sender,
            sender_name=settings.smtp_sender_name,
            tls=settings.smtp_tls,
            username=settings.smtp_username,
            password=settings.smtp_password.get_secret_value() if settings.smtp_password else None,
            timeout_seconds=settings.smtp_timeout_seconds,
            ca_file=settings.smtp_ca_file,
            helo_name=settings.smtp_helo_name or None,
            rate=parse_rate(settings.smtp_rate, "OUTBOX_SMTP_RATE") if settings.smtp_rate else None,
        )

    @property
    def effective_tls(self) -> Literal["starttls", "implicit", "none"]:
        if self.tls != "auto":
            return self.tls
        return "none" if is_loopback(self.host) else "starttls"

    @property
    def message_id_domain(self) -> str:
        return self.sender.rpartition("@")[2]


def is_public_name(name: str) -> bool:
    """A fully qualified host name a strict relay accepts in EHLO: two labels or more, no IP address,
    nothing under localhost, .local or another private suffix."""
    labels = name.lower().split(".")
    return (
        len(name) <= 253
        and len(labels) >= 2
        and all(HOST_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()
        and labels[-1] not in _PRIVATE_SUFFIXES
    )


def is_helo_name(name: str) -> bool:
    """A host name (any, `localhost` included: it was chosen) or an address literal."""
    if name.startswith("[") and name.endswith("]"):
        literal, version = (name[6:-1], 6) if name[1:6].lower() == "ipv6:" else (name[1:-1], 4)
        try:
            return ipaddress.ip_address(literal).version == version
        except ValueError:
            return False
    return len(name) <= 253 and all(HOST_LABEL.fullmatch(label) for label in name.split("."))


def default_helo_name(sender_domain: str) -> str | None:
    """The EHLO name when none is set: the sender's domain, else this machine's FQDN, when public; else None."""
    if is_public_name(sender_domain):
        return sender_domain
    fqdn = socket.getfqdn()
    return fqdn if is_public_name(fqdn) else None


def address_literal(sockname: object) -> str:
    """The EHLO address literal of a socket's own address: [192.0.2.1] or [IPv6:2001:db8::1]."""
    host = str(sockname[0]) if isinstance(sockname, tuple) and sockname else "127.0.0.1"
    address = ipaddress.ip_address(host.partition("%")[0])
    if isinstance(address, ipaddress.IPv6Address):
        return f"[{address.ipv4_mapped}]" if address.ipv4_mapped else f"[IPv6:{address.compressed}]"
    return f"[{address}]"


class EmailAdapter:
    def __init__(self, engine: AsyncEngine, settings: SmtpSettings) -> None:
        self._engine = engine
        self.settings = settings
        self._sender = Recipient(settings.sender, settings.sender_name)
        # None: the address literal of each connection's own end
        self._helo_name = settings.helo_name or default_helo_name(settings.message_id_domain)

    @property
    def kind(self) -> ActionKind:
        return EMAIL

    @property
    def rates(self) -> dict[str, Rate | None]:
        """The destination this adapter sends to, the relay, and its configured rate."""
        return {EMAIL.destination: self.settings.rate}

    async def execute(self, attempt: ActionAttempt) -> Result:
        action = attempt.action
        notice, event = notice_of(action.payload)
        message_id_value = message_id(action.idempotency_key, self.settings.message_id_domain)
        # what traces the email once its payload is gone: written with the fence, or with the result
        attempt.note(notice=notice.name, message_id=message_id_value)
        async with answered_connection(self._engine) as conn:
            rows = await notice.rows_async(conn, event)
        try:
            email = notice.composed(event, rows)
            if email is None:
                return Cancelled(f"prepare: the {notice.name} notice reaches nobody now")
            # built once, before the fence: whatever the mail library refuses fails it, and nothing was sent
            message = written(email, self._sender, message_id_value, datetime.now(UTC))
        except InvalidEmail as invalid:
            return Failed(f"prepare: the {notice.name} notice cannot be sent: {invalid.field} {invalid.message}")
        window = await attempt.fence().begin_write()
        return await self._send(window, email, message, attempt.uncounted_claims())

    async def _send(self, window: WriteWindow, email: PreparedEmail, message: bytes, uncounted: int) -> Result:
        """One SMTP exchange; `uncounted`: the action's earlier claims that did not count (a slow-down's wait)."""
        settings = self.settings
        tls = settings.effective_tls
        smtp = aiosmtplib.SMTP(
            hostname=settings.host,
            port=settings.port,
            use_tls=tls == "implicit",
            start_tls=False,
            tls_context=self._tls_context() if tls != "none" else None,
            timeout=min(settings.timeout_seconds, max(window.remaining(), 0.001)),
            # replaced by the connection's address literal before EHLO when no name is known
            local_hostname=self._helo_name or "[127.0.0.1]",
        )
        stage = "connect"
        try:
            async with asyncio.timeout_at(window.deadline):
                await smtp.connect()
                if self._helo_name is None:
                    smtp.local_hostname = address_literal(smtp.get_transport_info("sockname"))
                stage = "ehlo"
                await smtp.ehlo()
                if tls == "starttls":
                    stage = "starttls"
                    if not smtp.supports_extension("starttls"):
                        return Retry("starttls: the relay offers no STARTTLS and TLS is required")
                    await smtp.starttls()
                    stage = "ehlo"
                    await smtp.ehlo()  # again, over TLS: what the relay offers may have changed
                if settings.username:
                    stage = "login"
                    await _login(smtp, settings.username, settings.password or "")
                stage = "mail"
                await smtp.mail(settings.sender)
                stage = "rcpt"
                replies = await _recipients(smtp, email.recipients)
                for_now = [classify_reply("rcpt", code, text, uncounted) for code, text in replies if code < 500]
                if for_now:  # nobody receives it yet: a slow-down of any recipient defers the whole transaction
                    return next((result for result in for_now if isinstance(result, Defer)), for_now[0])
                refused = [code for code, _ in replies]
                if len(refused) == len(email.recipients):
                    return Failed(f"rcpt: {_codes(refused)}; every recipient refused")
                if window.remaining() <= 0:
                    return Retry("data: the write window closed before DATA; nothing was sent")
                stage = "data"
                response = await smtp.data(message)
            with contextlib.suppress(aiosmtplib.SMTPException, OSError, TimeoutError):
                await smtp.quit(timeout=1)
            return Done(readback_ref(f"{response.code} {response.message}", refused, len(email.recipients)))
        except aiosmtplib.SMTPResponseException as reply:
            return classify_reply(stage, reply.code, reply.message, uncounted)
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as error:
            if stage == "data":
                return Uncertain(f"data: {type(error).__name__} during or after DATA")
            return Retry(f"{stage}: {type(error).__name__}")
        finally:
            smtp.close()

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.settings.ca_file is not None:
            context.load_verify_locations(cafile=str(self.settings.ca_file))
        return context


def email_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The EMAIL adapter configured from OUTBOX_SMTP_*; the application registers its notices first."""
    return [EmailAdapter(engine, SmtpSettings.from_settings(load_settings()))]


async def _login(smtp: aiosmtplib.SMTP, username: str, password: str) -> None:
    """As aiosmtplib's login (each method the relay offers until one succeeds, the last refusal raised), except
    that a 421 ends it: the relay closed the connection, and the next method would only find it closed."""
    if not smtp.supports_extension("auth"):
        raise aiosmtplib.SMTPException("the relay offers no AUTH")
    refusal: aiosmtplib.SMTPAuthenticationError | None = None
    for method in smtp.supported_auth_methods:
        try:
            await getattr(smtp, f"auth_{method.replace('-', '')}")(username, password)
            return
        except aiosmtplib.SMTPAuthenticationError as refused:
            if refused.code == 421:
                raise
            refusal = refused
    raise refusal or aiosmtplib.SMTPException("the relay offers no AUTH method aiosmtplib knows")


async def _recipients(smtp: aiosmtplib.SMTP, recipients: tuple[Recipient, ...]) -> list[tuple[int, str]]:
    """RCPT TO each recipient; the code and text of each refusal. A 421 ends the loop: the relay closes."""
    refused = []
    for recipient in recipients:
        try:
            await smtp.rcpt(recipient.address)
        except aiosmtplib.SMTPRecipientRefused as reply:
            refused.append((reply.code, reply.message))
            if reply.code == 421:
                break
    return refused


def readback_ref(reply: str, refused: list[int], recipients: int) -> str:
    """The relay's reply to DATA, then how many recipients RCPT refused and with which codes, if any."""
    if not refused:
        return reply[:READBACK_LIMIT]
    note = f" | {len(refused)} of {recipients} recipients refused: {_codes(refused)}"
    return (reply[: max(READBACK_LIMIT - len(note), 0)] + note)[:READBACK_LIMIT]


def _codes(codes: list[int]) -> str:
    return ", ".join(str(code) for code in sorted(set(codes)))
