"""Read-back: does the stream hold an event published by an earlier attempt, and can its absence be proven?

    get_last_msg(stream, <subject>.<id>) ── Nats-Msg-Id is the id ──▶ Found(stream, seq)
                                         ── another id on the subject ──▶ Unprovable
                                         ── no message (10037) ──▶ stream_info(stream), read AFTER the look-up:
        retention is not limits (work queue, interest: a consumed message is gone) ──▶ Unprovable
        last_seq < seq_floor (the stream was reset or made again)                  ──▶ Unprovable
        first_seq > seq_floor + 1 (max_age / max_msgs / max_bytes removed messages
        published after the floor: the provider's horizon)                         ──▶ Unprovable
        otherwise: it keeps every message after the floor, and ours is not there   ──▶ Absent

`seq_floor` is the stream's last sequence known before the publish, noted in the trace before the fence:
any message the publish stored has a higher sequence. The stream is read after the look-up, so a message
removed between the two shows as a first sequence past the floor. A look-up that fails (the server down,
no answer, the stream gone) raises: the caller cannot tell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from outbox._internal.config.extras import needs
from outbox.executor.attempt import TraceValue
from outbox.nats.message import MSG_ID_HEADER

with needs("nats"):
    from nats.js import JetStreamContext
    from nats.js.api import RetentionPolicy
    from nats.js.errors import NotFoundError

# JetStream's error code for "no message found" (a stream that is gone answers 10059)
NO_MESSAGE = 10037


@dataclass(frozen=True)
class Found:
    stream: str
    seq: int

    @property
    def ref(self) -> str:
        return f"stream={self.stream} seq={self.seq} read back"


@dataclass(frozen=True)
class Absent:
    """Proven: the stream holds every message published after the floor, and none of them is the event."""


@dataclass(frozen=True)
class Unprovable:
    reason: str


Look = Found | Absent | Unprovable


def noted_floor(trace: Mapping[str, TraceValue]) -> int | None:
    """The floor an earlier attempt noted before its fence; None when none fenced (nothing was published)."""
    floor = trace.get("seq_floor")
    return floor if isinstance(floor, int) and not isinstance(floor, bool) else None


async def look(js: JetStreamContext, stream: str, subject: str, token: str, trace: Mapping[str, TraceValue]) -> Look:
    """Whether `stream` holds the event published on `subject` with id `token`, by the rule above."""
    floor = noted_floor(trace)
    noted_stream = trace.get("stream")
    try:
        message = await js.get_last_msg(stream, subject)
    except NotFoundError as missing:
        if missing.err_code != NO_MESSAGE:
            raise
    else:
        if (message.headers or {}).get(MSG_ID_HEADER) == token and message.seq is not None:
            return Found(stream, message.seq)
        return Unprovable(f"read-back: another message (not Nats-Msg-Id {token}) holds {subject} in {stream}")
    if floor is None:
        return Absent()  # no attempt passed its fence: nothing was published
    if noted_stream != stream:
        return Unprovable(f"read-back: the event went to stream {noted_stream}, the subject is now in {stream}")
    info = await js.stream_info(stream)
    retention = RetentionPolicy(info.config.retention or RetentionPolicy.LIMITS)  # nats-py may give the text
    if retention != RetentionPolicy.LIMITS:
        return Unprovable(
            f"read-back: stream {stream} has {retention.value} retention: a message consumed from it is gone,"
            " so its absence proves nothing"
        )
    state = info.state
    if state.last_seq < floor:
        return Unprovable(
            f"read-back: stream {stream} ends at sequence {state.last_seq}, before the floor {floor}: it was"
            " purged to zero or made again"
        )
    if state.first_seq > floor + 1:
        return Unprovable(
            f"read-back: stream {stream} no longer holds the messages after sequence {floor} (its first is"
            f" {state.first_seq}): the provider's horizon (max_age, max_msgs or max_bytes) passed the event"
        )
    return Absent()
