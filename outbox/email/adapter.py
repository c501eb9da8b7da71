"""EmailAdapter: the only adapter of EMAIL and the only code that talks SMTP.

    payload ─▶ notice.prepare_async (who wants it now?) ─ nobody ─▶ Cancelled NOT_WANTED
        ─▶ build message (stable Message-ID) ─▶ fence ─▶ connect, STARTTLS, login, MAIL, RCPT
        ─▶ window re-checked ─▶ DATA ─▶ classify what the relay answered

The whole SMTP exchange runs under the fence's deadline; a slower relay is cut off and classified by the
stage it had reached. Results carry stage names and reply codes only, never an address or the body.

| stage                        | what happened                                 | result                         |
| connect, greeting, EHLO, TLS | refused, dropped, timed out, any reply        | Retry                          |
| login                        | any refusal (535) or failure                  | Retry                          |
| MAIL FROM                    | 4xx, or dropped / 5xx                         | Retry / Failed PROVIDER_REFUSED|
| RCPT TO                      | any 4xx / every recipient 5xx / some 5xx      | Retry / Failed / send the rest |
| before DATA                  | the write window closed                       | Retry                          |
| DATA and after               | 4xx / 5xx                                     | Retry / Failed PROVIDER_REFUSED|
| DATA and after               | dropped, timed out, any other reply           | Uncertain PROVIDER_UNCERTAIN   |
| DATA                         | 250                                           | Done, the reply as readback_ref|
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiosmtplib
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.email.message import InvalidEmail, PreparedEmail, Recipient, build_message, check_address, message_id
from outbox.email.notice import notice_of
from outbox.executor import ActionAttempt, Cancelled, Done, Failed, Result, Retry, Uncertain, WriteWindow
from outbox.kinds import ActionKind
from outbox.settings import Settings

TlsMode = Literal["auto", "starttls", "implicit", "none"]


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
    helo_name: str = "localhost"

    def __post_init__(self) -> None:
        check_address("smtp sender", self.sender)
        if not 0 < self.port < 65536:
            raise ValueError(f"smtp port must be 1-65535, not {self.port}")

    @classmethod
    def from_settings(cls, settings: Settings) -> SmtpSettings:
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
        )

    @property
    def effective_tls(self) -> Literal["starttls", "implicit", "none"]:
        if self.tls != "auto":
            return self.tls
        return "none" if _is_loopback(self.host) else "starttls"

    @property
    def message_id_domain(self) -> str:
        return self.sender.rpartition("@")[2]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class EmailAdapter:
    def __init__(self, engine: AsyncEngine, settings: SmtpSettings) -> None:
        self._engine = engine
        self.settings = settings
        self._sender = Recipient(settings.sender, settings.sender_name)

    @property
    def kind(self) -> ActionKind:
        return ActionKind.EMAIL

    async def execute(self, attempt: ActionAttempt) -> Result:
        notice, event = notice_of(attempt.action.payload)
        try:
            async with self._engine.connect() as conn:
                email = await notice.prepare_async(conn, event)
        except InvalidEmail as invalid:
            return Failed(f"the {notice.name} notice cannot be sent: {invalid.field} {invalid.message}")
        if email is None:
            return Cancelled(f"the {notice.name} notice reaches nobody now")
        message_id_value = message_id(attempt.action.idempotency_key, self.settings.message_id_domain)
        message = build_message(email, self._sender, message_id_value).as_bytes()
        window = await attempt.fence().begin_write()
        return await self._send(window, email, message)

    async def _send(self, window: WriteWindow, email: PreparedEmail, message: bytes) -> Result:
        settings = self.settings
        tls = settings.effective_tls
        smtp = aiosmtplib.SMTP(
            hostname=settings.host,
            port=settings.port,
            use_tls=tls == "implicit",
            start_tls=False,
            tls_context=self._tls_context() if tls != "none" else None,
            timeout=min(settings.timeout_seconds, max(window.remaining(), 0.001)),
            local_hostname=settings.helo_name,
        )
        stage = "connect"
        try:
            async with asyncio.timeout_at(window.deadline):
                await smtp.connect()
                await smtp.ehlo()
                if tls == "starttls":
                    stage = "starttls"
                    if not smtp.supports_extension("starttls"):
                        return Retry("the relay offers no STARTTLS and TLS is required")
                    await smtp.starttls()
                if settings.username:
                    stage = "login"
                    await smtp.login(settings.username, settings.password or "")
                stage = "mail"
                await smtp.mail(settings.sender)
                stage = "rcpt"
                refused = await _recipients(smtp, email.recipients)
                if any(400 <= code < 500 for code in refused):
                    return Retry(f"RCPT refused for now ({_codes(refused)}); nothing was sent")
                if len(refused) == len(email.recipients):
                    return Failed(f"RCPT refused for every recipient ({_codes(refused)})")
                if window.remaining() <= 0:
                    return Retry("the write window closed before DATA; nothing was sent")
                stage = "data"
                response = await smtp.data(message)
            with contextlib.suppress(aiosmtplib.SMTPException, OSError, TimeoutError):
                await smtp.quit(timeout=1)
            return Done(f"{response.code} {response.message}"[:500])
        except aiosmtplib.SMTPResponseException as reply:
            return classify_reply(stage, reply.code)
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as error:
            if stage == "data":
                return Uncertain(f"{type(error).__name__} during or after DATA")
            return Retry(f"{stage}: {type(error).__name__}")
        finally:
            smtp.close()

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.settings.ca_file is not None:
            context.load_verify_locations(cafile=str(self.settings.ca_file))
        return context


async def _recipients(smtp: aiosmtplib.SMTP, recipients: tuple[Recipient, ...]) -> list[int]:
    """RCPT TO each recipient; the codes of those refused."""
    refused = []
    for recipient in recipients:
        try:
            await smtp.rcpt(recipient.address)
        except aiosmtplib.SMTPRecipientRefused as reply:
            refused.append(reply.code)
    return refused


def _codes(codes: list[int]) -> str:
    return ", ".join(str(code) for code in sorted(set(codes)))


def classify_reply(stage: str, code: int) -> Result:
    """A relay's refusal at `stage`, by the table in this module's docstring."""
    if 400 <= code < 500:
        return Retry(f"{stage}: {code}; the relay accepted nothing")
    if stage == "data":
        if 500 <= code < 600:
            return Failed(f"data: {code}; the relay refused the message")
        return Uncertain(f"data: unexpected reply {code}")
    if stage in ("mail", "rcpt") and 500 <= code < 600:
        return Failed(f"{stage}: {code}; the relay refused it")
    return Retry(f"{stage}: {code}; nothing was sent")
