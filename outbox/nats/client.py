"""One connection to NATS and its JetStream context, connected within CONNECT_SECONDS and never reconnecting.

    NatsConfig ──connect()──▶ NatsClient(nc, js, lost)  ─ refused, no answer in 2 s, auth ─▶ CannotReach
    the server closes or drops the connection ──▶ `lost` is set (the client is closed, never reconnects)
    drop() ──▶ the connection closed within 2 s: what it had buffered goes out with the close or never

A client that lost its connection stays closed: nothing it had buffered is sent later behind the caller's
back (nats-py's reconnect would replay it on the next connection). The caller connects again when it
needs to. The client's own error callback only keeps the last error for the reason CannotReach gives: a
caller classifies what failed, and no message of it names a password.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from outbox._internal.config.extras import needs
from outbox.errors import OutboxError
from outbox.nats.settings import NatsConfig

with needs("nats"):
    import nats
    import nats.errors
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext

CONNECT_SECONDS = 2.0
# the longest a JetStream API call (a stream look-up, a message read) may take
API_SECONDS = 2.0


class CannotReach(OutboxError):
    """No server of the configuration could be reached (or not in time)."""

    exit_code = 1

    def __init__(self, config: NatsConfig, reason: str) -> None:
        super().__init__(f"cannot reach NATS at {config.shown} ({reason})")
        self.reason = reason


@dataclass(eq=False)
class NatsClient:
    nc: NATS
    js: JetStreamContext
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def usable(self) -> bool:
        return not self.lost.is_set() and self.nc.is_connected

    @property
    def max_payload(self) -> int:
        return self.nc.max_payload

    async def drop(self) -> None:
        """Close the connection, bounded: a silent network cannot hold the caller."""
        self.lost.set()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CONNECT_SECONDS):
                await self.nc.close()


async def connect(config: NatsConfig) -> NatsClient:
    """A connected client, or CannotReach within CONNECT_SECONDS."""
    lost = asyncio.Event()
    seen: list[Exception] = []

    async def quiet(error: Exception) -> None:
        """nats-py's error callback: kept for the reason, never logged (the caller classifies what failed)."""
        seen[:] = [error]

    async def closed() -> None:
        lost.set()

    nc = NATS()
    options: dict[str, object] = {}
    if config.credentials is not None:
        options["user_credentials"] = str(config.credentials)
    try:
        async with asyncio.timeout(CONNECT_SECONDS):
            await nc.connect(
                servers=list(config.servers),
                allow_reconnect=False,
                # each server tried twice at once, then given up: a refusal fails now, not after the bound
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                connect_timeout=int(CONNECT_SECONDS),
                error_cb=quiet,
                disconnected_cb=closed,
                closed_cb=closed,
                name="outbox",
                **options,  # type: ignore[arg-type]
            )
    except (OSError, TimeoutError, nats.errors.Error) as error:
        with contextlib.suppress(Exception):
            await nc.close()
        # NoServersError: why the last server could not be reached
        cause: BaseException = seen[0] if isinstance(error, nats.errors.NoServersError) and seen else error
        raise CannotReach(config, _reason(cause)) from None
    return NatsClient(nc, nc.jetstream(timeout=API_SECONDS), lost)


def _reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError | nats.errors.TimeoutError):
        return f"no answer within {CONNECT_SECONDS:g} s"
    if isinstance(error, nats.errors.NoServersError):
        return "no server answered"
    if isinstance(error, nats.errors.AuthorizationError):
        return "authorization refused"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return type(error).__name__
