"""SmtpSink: a local SMTP server (aiosmtpd, 127.0.0.1) that keeps what it receives and fails on request.

    relay faults (per stage) ──▶ aiosmtpd handler ──▶ Received (envelope, EHLO name, Message-ID, data) kept in memory

Tests inject one fault per stage (a reply instead of the greeting, or to EHLO, STARTTLS, AUTH, MAIL, RCPT or
DATA, a drop or a stall after DATA); a 421 closes the connection after it, as relays do. The demo sets
`flaky` to fail a share of deliveries the way real relays do. A message is kept
as soon as its content arrived, also when the connection is then dropped or stalled, because a real
relay may deliver such a message: that is what makes the at-most-once rule matter.

Each message kept carries the sink's wall-clock times of its MAIL FROM and of its content's arrival, so a
test can tell whether two writes to one lane were in flight at once. `on_mail` and `on_rcpt`, when set, are
called (in the sink's thread) with the session (and the address) before each MAIL FROM and RCPT TO is
answered; a reply they return is answered instead. The chaos runner uses `on_rcpt` to freeze the sending
process at a chosen moment; tests/throttling_relay.py uses both to throttle and greylist.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email import message_from_bytes
from typing import Any, Literal

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SmtpServer
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session


@dataclass
class Faults:
    connect: str | None = None  # the reply instead of the greeting, e.g. "421 4.7.0 too many connections"
    ehlo: str | None = None  # the reply to EHLO
    starttls: str | None = None  # the reply to STARTTLS (the sink offers it when it has a TLS context)
    login: str | None = None  # the reply to AUTH
    mail: str | None = None  # the reply to MAIL FROM, e.g. "451 4.3.0 try later"
    rcpt: dict[str, str] = field(default_factory=dict)  # address -> reply to its RCPT TO
    data: str | None = None  # the reply once the content arrived, e.g. "554 5.7.1 refused"
    after_data: Literal["drop", "stall"] | None = None  # keep the message, then drop or never answer
    # the demo's relay: this share of deliveries fails, half with a 451 at RCPT, half dropped after DATA
    flaky: float = 0.0


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message_id: str
    subject: str
    data: bytes
    # the sink's wall clock (time.time()) when MAIL FROM arrived and when the content arrived
    mail_at: float = 0.0
    received_at: float = 0.0
    # the client's address and port
    peer: tuple[str, int] | None = None
    # the name the client gave in EHLO (or HELO)
    helo_name: str | None = None


class _Handler:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    async def handle_MAIL(
        self, server: SmtpServer, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.sink.faults.mail:
            return self.sink.faults.mail
        refused = self.sink.on_mail(session) if self.sink.on_mail is not None else None
        if refused:
            return refused
        envelope.mail_from = address
        envelope.mail_at = time.time()  # type: ignore[attr-defined]
        return "250 OK"

    async def handle_RCPT(
        self, server: SmtpServer, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        refused = self.sink.on_rcpt(session, address) if self.sink.on_rcpt is not None else None
        reply = refused or self.sink.faults.rcpt.get(address)
        if reply:
            return reply
        if self.sink.faults.flaky and self.sink.rng.random() < self.sink.faults.flaky / 2:
            return "451 4.7.1 greylisted, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SmtpServer, session: Session, envelope: Envelope) -> str:
        faults = self.sink.faults
        if faults.data:
            return faults.data
        self.sink.keep(envelope, session)
        drop = faults.after_data == "drop" or (faults.flaky and self.sink.rng.random() < faults.flaky / 2)
        if drop:
            transport = server.transport
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
            return "250 dropped before the reply"  # never reaches the client
        if faults.after_data == "stall":
            await asyncio.Event().wait()  # until the sink stops
        return f"250 2.0.0 queued as {len(self.sink.received)}"


class _FaultyServer(SmtpServer):
    """aiosmtpd's server, answering the sink's faults for the greeting, EHLO, STARTTLS and AUTH."""

    def __init__(self, sink: SmtpSink, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sink = sink
        self._greeted = False

    async def push(self, status: Any) -> None:
        if not self._greeted:  # the first line is the greeting
            self._greeted = True
            status = self.sink.faults.connect or status
        await super().push(status)
        if (status.encode() if isinstance(status, str) else status).startswith(b"421") and self.transport:
            self.transport.close()  # a 421 ends the session

    async def smtp_EHLO(self, hostname: str) -> None:
        if self.sink.faults.ehlo:
            await self.push(self.sink.faults.ehlo)
            return
        await super().smtp_EHLO(hostname)

    async def smtp_STARTTLS(self, arg: str) -> None:
        if self.sink.faults.starttls:
            await self.push(self.sink.faults.starttls)
            return
        await super().smtp_STARTTLS(arg)

    async def smtp_AUTH(self, arg: str) -> None:
        if self.sink.faults.login:
            await self.push(self.sink.faults.login)
            return
        await super().smtp_AUTH(arg)


class _FaultyController(Controller):
    def __init__(self, sink: SmtpSink, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sink = sink

    def factory(self) -> SmtpServer:
        return _FaultyServer(self.sink, self.handler, **self.SMTP_kwargs)


class SmtpSink:
    """Start with `start()`, stop with `stop()`; `received` holds every message kept."""

    def __init__(
        self,
        port: int = 0,
        *,
        faults: Faults | None = None,
        tls_context: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        seed: int | None = None,
    ) -> None:
        self.faults = faults or Faults()
        self.rng = random.Random(seed)
        self.received: list[Received] = []
        self.on_mail: Callable[[Session], str | None] | None = None
        self.on_rcpt: Callable[[Session, str], str | None] | None = None
        self.data_arrived = threading.Event()
        self._lock = threading.Lock()
        self._credentials = credentials
        options: dict[str, Any] = {}
        if tls_context is not None:
            options["tls_context"] = tls_context
        if credentials is not None:
            options.update(authenticator=self._authenticate, auth_require_tls=False, auth_required=True)
        self._controller = _FaultyController(
            self, _Handler(self), hostname="127.0.0.1", port=port or _free_port(), **options
        )

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def start(self) -> SmtpSink:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def keep(self, envelope: Envelope, session: Session | None = None) -> None:
        received_at = time.time()
        content = envelope.content if isinstance(envelope.content, bytes) else str(envelope.content).encode()
        parsed = message_from_bytes(content)
        received = Received(
            mail_from=str(envelope.mail_from),
            rcpt_tos=tuple(envelope.rcpt_tos),
            message_id=str(parsed.get("Message-ID", "")),
            subject=str(parsed.get("Subject", "")),
            data=content,
            mail_at=float(getattr(envelope, "mail_at", received_at)),
            received_at=received_at,
            peer=_peer(session),
            helo_name=getattr(session, "host_name", None),
        )
        with self._lock:
            self.received.append(received)
        self.data_arrived.set()

    def count_by_message_id(self) -> Counter[str]:
        with self._lock:
            return Counter(r.message_id for r in self.received)

    def _authenticate(
        self, server: SmtpServer, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
    ) -> AuthResult:
        ok = isinstance(auth_data, LoginPassword) and self._credentials == (
            auth_data.login.decode(),
            auth_data.password.decode(),
        )
        return AuthResult(success=ok, handled=False)


def _peer(session: Session | None) -> tuple[str, int] | None:
    peer = getattr(session, "peer", None)
    if isinstance(peer, tuple) and len(peer) >= 2:
        return str(peer[0]), int(peer[1])
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
