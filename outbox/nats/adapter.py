"""NatsAdapter: the only adapter of NATS_EVENT; it publishes each event once to a JetStream stream.

    payload ─▶ event.prepare_async (the query, compose) ─▶ message: <subject>.<id>, Nats-Msg-Id: <id>, JSON body
        ─▶ connect (lazily, one client per adapter, 2 s) ─▶ the subject's stream (cached)
        ─▶ claimed before? read back (outbox.nats.readback): found ─▶ Done; cannot prove absence ─▶ Uncertain
        ─▶ nothing to publish ─▶ Cancelled NOT_WANTED; too large ─▶ Failed
        ─▶ note event_type, subject, msg_id, stream, seq_floor ─▶ fence ─▶ publish ─▶ classify

The trace (`attempt.note`, written with the fence, so durable before the publish) holds the event type, the
full subject, the message id, the stream and `seq_floor`, the stream's last sequence known before the
publish (from the last PubAck this process saw for the stream, or one stream_info on its first use): what
read-back needs to prove an absence, and what an operator searches the stream for.

| stage     | what happened                                                  | result                          |
| prepare   | the event's subject or data cannot make a message              | Failed                          |
|           | compose returned None                                          | Cancelled NOT_WANTED            |
| connect   | cannot connect; the stream look-up failed                      | Retry (nothing sent)            |
| stream    | no stream takes the subject                                    | Retry (nothing sent)            |
| read-back | (claimed before) found                                         | Done `stream=S seq=N read back` |
|           | absent, and the horizon passed (cannot be proven)              | Uncertain PROVIDER_UNCERTAIN    |
|           | absent and proven                                              | publish, as below               |
|           | failed                                                         | Retry; Uncertain at the last    |
|           |                                                                | attempt when one may have sent  |
| publish   | PubAck                                                         | Done `stream=S seq=N`           |
|           | PubAck of a Nats-Msg-Id inside the duplicate window            | Done `stream=S seq=N duplicate` |
|           | no responders (no stream for the subject)                      | Retry (nothing stored)          |
|           | a JetStream error reply (a limit, a stream error)              | Retry (nothing stored)          |
|           | timeout, connection lost, any other error: the client closed,  |                                 |
|           | then read back on a new connection: found                      | Done `stream=S seq=N read back` |
|           |   absent and proven                                            | Retry                           |
|           |   absent, and the horizon passed (cannot be proven)            | Uncertain PROVIDER_UNCERTAIN    |
|           |   cannot look                                                  | Retry; Uncertain at the last    |

With OpenTelemetry (`outbox.tracing`) the publish is a span of its own under the attempt's, and the message
carries its W3C `traceparent` (and `tracestate`) headers: a consumer may continue the trace.

No acknowledgement is never taken as proof of absence. A Retry after the fence clears the action's mark
of a write, so read-back runs whenever the action was claimed before (`attempt.claimed_before()`), not only
when that mark is set. Results carry stage names, subjects, stream names and codes, never data.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import tracing
from outbox._internal.config.extras import needs
from outbox._internal.connections.engines import answered_connection
from outbox.executor import ActionAdapter, ActionAttempt, Cancelled, Done, Failed, Result, Retry, Uncertain
from outbox.executor.attempt import WriteWindow
from outbox.kinds import ActionKind
from outbox.nats.client import CannotReach, NatsClient, connect
from outbox.nats.events import NatsEvent, PreparedEvent, event_of
from outbox.nats.kind import NATS_EVENT
from outbox.nats.message import (
    MAX_MESSAGE_BYTES,
    InvalidEvent,
    check_size,
    check_subject,
    event_token,
    message_headers,
    message_subject,
)
from outbox.nats.readback import Absent, Found, Unprovable, look, noted_floor
from outbox.nats.settings import NatsConfig, load_config

with needs("nats"):
    import nats.errors
    from nats.js.api import PubAck
    from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

# what a failed look-up or publish may raise: nats-py's errors (JetStream's among them), the socket's, a timeout
_CLIENT_ERRORS = (nats.errors.Error, OSError, TimeoutError)
# the streams and floors kept per adapter; past this many subjects the cache starts again
CACHE_LIMIT = 1024


class NoStream(Exception):
    """No stream takes the subject."""


class NatsAdapter:
    def __init__(self, engine: AsyncEngine, config: NatsConfig) -> None:
        self._engine = engine
        self.config = config
        self._client: NatsClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting = asyncio.Lock()
        # the application's subject (without the event's id) -> the stream that takes it
        self._streams: dict[str, str] = {}
        # stream -> its last sequence this process knows of (a floor for every later publish)
        self._floors: dict[str, int] = {}

    @property
    def kind(self) -> ActionKind:
        return NATS_EVENT

    async def close(self) -> None:
        """Close the adapter's connection (a later attempt connects again)."""
        if self._client is not None:
            await self._drop(self._client)

    async def execute(self, attempt: ActionAttempt) -> Result:
        action = attempt.action
        event_def, event = event_of(action.payload)
        token = event_token(action.idempotency_key)
        try:
            app_subject = check_subject(event_def.subject(event))
        except InvalidEvent as invalid:
            return Failed(f"prepare: the {event_def.name} event cannot be published: {invalid}")
        subject = message_subject(app_subject, token)
        attempt.note(event_type=event_def.name, subject=subject, msg_id=token)
        prepared, unpublishable = await self._prepare(event_def, event)
        if unpublishable is not None and not attempt.claimed_before():
            return unpublishable  # never published: no need to look
        # an earlier attempt noted a floor before its fence: it may have published
        may_hold = attempt.claimed_before() and noted_floor(attempt.trace) is not None
        last = action.attempt >= action.max_attempts
        client: NatsClient | None = None
        stream: str | None = None
        stage = "connect"
        try:
            client = await self._connected()
            stage = "stream"
            stream = await self._stream_for(client, app_subject, subject)
            if attempt.claimed_before():
                stage = "read-back"
                found = await look(client.js, stream, subject, token, attempt.trace)
                if isinstance(found, Found):
                    return Done(found.ref)
                if isinstance(found, Unprovable):
                    return Uncertain(found.reason)
            if unpublishable is not None:
                return unpublishable
            assert prepared is not None
            # the attempt's trace context, as long as the publish's own that replaces it: the size holds
            headers = {**message_headers(token), "Nats-Expected-Stream": stream, **tracing.context_headers()}
            check_size(len(prepared.body), headers, min(client.max_payload, MAX_MESSAGE_BYTES))
            stage = "stream"
            floor = await self._floor(client, stream)
        except InvalidEvent as invalid:
            return Failed(f"prepare: the {event_def.name} event cannot be published: {invalid}")
        except NoStream:
            reason = f"stream: no stream takes {subject}; create one (outbox nats ensure-stream)"
            if last and may_hold:  # the stream an earlier attempt published to is gone
                return Uncertain(f"{reason}; an earlier attempt may have published the event")
            return Retry(reason)
        except (CannotReach, *_CLIENT_ERRORS) as error:
            if isinstance(error, APIError) and stream is not None:
                self._forget(stream)  # the stream may be gone: look it up again next time
            elif client is not None:
                await self._drop(client)
            reason = f"{stage}: {_described(error)}"
            if last and may_hold:
                return Uncertain(f"{reason}; an earlier attempt may have published the event")
            return Retry(reason)
        try:
            attempt.note(stream=stream, seq_floor=floor)
        except ValueError as refused:
            return Failed(f"prepare: {refused}")
        window = await attempt.fence().begin_write()
        return await self._publish(attempt, client, stream, prepared, headers, window)

    async def _prepare(
        self, event_def: NatsEvent, event: dict[str, Any]
    ) -> tuple[PreparedEvent | None, Failed | Cancelled | None]:
        """The message as it goes now, or why nothing can be published (the query runs on outbox's engine)."""
        try:
            async with answered_connection(self._engine) as conn:
                prepared = await event_def.prepare_async(conn, event)
        except InvalidEvent as invalid:
            return None, Failed(f"prepare: the {event_def.name} event cannot be published: {invalid}")
        if prepared is None:
            return None, Cancelled(f"prepare: the {event_def.name} event has nothing to publish now")
        return prepared, None

    async def _publish(
        self,
        attempt: ActionAttempt,
        client: NatsClient,
        stream: str,
        prepared: PreparedEvent,
        headers: dict[str, str],
        window: WriteWindow,
    ) -> Result:
        timeout = min(self.config.publish_timeout_seconds, window.check())
        try:
            with tracing.provider_call(f"{NATS_EVENT.name} publish", producer=True) as call:
                publish = client.js.publish(
                    prepared.subject, prepared.body, timeout=timeout, headers={**headers, **call.headers}
                )
                ack = await _until_lost(client, publish, timeout)
        except NoStreamResponseError:
            self._forget(stream)
            return Retry(f"publish: no responders for {prepared.subject}: no stream stored it")
        except APIError as refused:
            self._forget(stream)
            return Retry(f"publish: JetStream refused it (code {refused.code}, err_code {refused.err_code})")
        except Exception as error:  # the publish may have been stored: look before deciding
            await self._drop(client)
            return await self._after_unclear(attempt, stream, prepared, f"publish: {_described(error)}")
        # a sequence the stream has reached (lower than the last when acks cross: a floor still holds)
        self._floors[stream] = ack.seq
        return Done(f"stream={ack.stream} seq={ack.seq}{' duplicate' if ack.duplicate else ''}")

    async def _after_unclear(self, attempt: ActionAttempt, stream: str, prepared: PreparedEvent, what: str) -> Result:
        """After the fence, the publish unclear: read back on a new connection."""
        last = attempt.action.attempt >= attempt.action.max_attempts
        try:
            client = await self._connected()
            found = await look(client.js, stream, prepared.subject, prepared.token, attempt.trace)
        except (CannotReach, *_CLIENT_ERRORS) as error:
            if last:
                return Uncertain(f"{what}; read-back: {_described(error)}: the event may be in the stream")
            return Retry(f"{what}; read-back: {_described(error)}; the next attempt looks again")
        if isinstance(found, Found):
            return Done(found.ref)
        if isinstance(found, Absent):
            return Retry(f"{what}; read-back proved stream {stream} does not hold it")
        return Uncertain(f"{what}; {found.reason}")

    async def _connected(self) -> NatsClient:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (a flow run of its own): the old client is gone with its loop
            self._loop, self._client, self._connecting = loop, None, asyncio.Lock()
        async with self._connecting:
            if self._client is not None and not self._client.usable:
                await self._client.drop()
                self._client = None
            if self._client is None:
                self._client = await connect(self.config)
            return self._client

    async def _drop(self, client: NatsClient) -> None:
        if self._client is client:
            self._client = None
        await client.drop()

    async def _stream_for(self, client: NatsClient, app_subject: str, subject: str) -> str:
        stream = self._streams.get(app_subject)
        if stream is None:
            try:
                stream = await client.js.find_stream_name_by_subject(subject)
            except NotFoundError:
                raise NoStream() from None
            if len(self._streams) >= CACHE_LIMIT:
                self._streams.clear()
            self._streams[app_subject] = stream
        return stream

    async def _floor(self, client: NatsClient, stream: str) -> int:
        if stream not in self._floors:
            info = await client.js.stream_info(stream)
            if len(self._floors) >= CACHE_LIMIT:
                self._floors.clear()
            self._floors[stream] = info.state.last_seq
        return self._floors[stream]

    def _forget(self, stream: str) -> None:
        """A publish found the stream gone or changed: look its subjects and floor up again."""
        self._floors.pop(stream, None)
        for app_subject in [s for s, name in self._streams.items() if name == stream]:
            del self._streams[app_subject]


async def _until_lost(client: NatsClient, publish: Coroutine[Any, Any, PubAck], seconds: float) -> PubAck:
    """The publish's acknowledgement; ConnectionError as soon as the connection is lost (nats-py would only
    time out), TimeoutError after `seconds` and one more."""
    task = asyncio.ensure_future(publish)
    lost = asyncio.ensure_future(client.lost.wait())
    try:
        await asyncio.wait({task, lost}, timeout=seconds + 1, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.cancelled():
        if client.lost.is_set():
            raise ConnectionError("the connection was lost before the acknowledgement")
        raise TimeoutError
    return task.result()


def _described(error: BaseException) -> str:
    if isinstance(error, CannotReach):
        return f"cannot reach NATS ({error.reason})"
    if isinstance(error, TimeoutError | nats.errors.TimeoutError):
        return "no answer in time"
    if isinstance(error, APIError):
        return f"JetStream answered code {error.code}, err_code {error.err_code}"
    return type(error).__name__


def nats_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The NATS_EVENT adapter configured from OUTBOX_NATS_*; the application registers its events first."""
    return [NatsAdapter(engine, load_config())]
