"""The stream the events are published to: made when missing, checked when present, never changed.

    StreamSpec (name, subjects, duplicate window, max age, replicas) ──ensure_stream──▶
        missing  ─▶ created: limits retention, file storage, as asked            ─▶ Ensured(created=True)
        present  ─▶ compared: what read-back needs (limits retention, every subject covered) ─▶ `problems`
                    and the other settings asked for                                      ─▶ `notes`

outbox creates nothing on a server unless `outbox nats ensure-stream` (or this function) runs. Read-back
needs limits retention (a work-queue or interest stream drops what was consumed, so an absence proves
nothing) and every event subject in the stream. A stream name is letters, digits, `-` and `_` (at most
64); a subject is tokens of letters, digits, `-` and `_`, with `*` as a whole token and `>` as the last one,
and ends in a wildcard (each event is published on `<subject>.<id>`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from outbox._internal.config.extras import needs
from outbox.errors import OutboxError
from outbox.nats.client import connect
from outbox.nats.settings import NatsConfig

with needs("nats"):
    import nats.errors
    from nats.js import JetStreamContext
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]+|\*")
MAX_REPLICAS = 5


class StreamRefused(OutboxError):
    """The server refused or failed a stream request (JetStream off, a permission, a limit): exit 1."""

    exit_code = 1


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    duplicate_window_seconds: float = 120.0
    # None: messages are kept until another limit removes them
    max_age_seconds: float | None = None
    replicas: int = 1

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"--stream: {self.name!r} must be 1 to 64 letters, digits, '-' or '_'")
        if not self.subjects:
            raise ValueError("--subject: give at least one subject, such as 'orders.>'")
        for subject in self.subjects:
            check_filter(subject)
        if not 0 < self.duplicate_window_seconds <= 7 * 86_400:
            raise ValueError("--duplicate-window: more than 0 and at most 7d")
        if self.max_age_seconds is not None and self.max_age_seconds < self.duplicate_window_seconds:
            raise ValueError("--max-age: at least the duplicate window")
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"--replicas: 1 to {MAX_REPLICAS}")


def check_filter(subject: str) -> None:
    """A subject a stream may take: tokens, `*` as a whole token, `>` as the last; ValueError otherwise."""
    tokens = subject.split(".")
    if tokens[-1] == ">":
        tokens = tokens[:-1]
    if len(subject) > 255 or not all(_TOKEN.fullmatch(token) for token in tokens) or subject == ">":
        raise ValueError(
            f"--subject: {subject!r} must be tokens of letters, digits, '-' or '_' between dots, with '*' as a"
            " whole token and '>' only as the last (and not alone)"
        )
    if tokens == subject.split(".") and tokens[-1] != "*":
        raise ValueError(
            f"--subject: {subject!r} takes no event: each is published on <subject>.<id>;"
            f" write '{subject}.*' or '{subject}.>'"
        )


def covers(pattern: str, subject: str) -> bool:
    """Whether the stream subject `pattern` takes every subject `subject` matches."""
    wanted, have = subject.split("."), pattern.split(".")
    for index, token in enumerate(have):
        if token == ">":
            return len(wanted) > index
        if index >= len(wanted):
            return False
        if token != "*" and token != wanted[index]:
            return False
        if token == "*" and wanted[index] == ">":
            return False
    return len(have) == len(wanted)


@dataclass(frozen=True)
class Ensured:
    created: bool
    # what read-back needs and the stream does not give: nothing was changed
    problems: list[str] = field(default_factory=list)
    # settings that differ from what was asked, left as they are
    notes: list[str] = field(default_factory=list)


async def ensure_stream(config: NatsConfig, asked: StreamSpec) -> Ensured:
    """Create the stream `asked` names if it is missing, else compare it; CannotReach, StreamRefused."""
    client = await connect(config)
    try:
        return await _ensure(client.js, asked)
    except (nats.errors.Error, OSError, TimeoutError) as error:
        raise StreamRefused(f"NATS at {config.shown} refused or failed the stream request: {_said(error)}") from None
    finally:
        await client.drop()


async def _ensure(js: JetStreamContext, asked: StreamSpec) -> Ensured:
    try:
        info = await js.stream_info(asked.name)
    except NotFoundError:
        await js.add_stream(
            StreamConfig(
                name=asked.name,
                subjects=list(asked.subjects),
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=asked.duplicate_window_seconds,
                max_age=asked.max_age_seconds,
                num_replicas=asked.replicas,
            )
        )
        return Ensured(created=True)
    return compare(info.config, asked)


def compare(found: StreamConfig, asked: StreamSpec) -> Ensured:
    """What differs between an existing stream and `asked`."""
    problems: list[str] = []
    retention = RetentionPolicy(found.retention or RetentionPolicy.LIMITS)  # nats-py may give the text
    if retention != RetentionPolicy.LIMITS:
        problems.append(f"retention is {retention.value}, read-back needs limits")
    subjects = found.subjects or []
    for subject in asked.subjects:
        if not any(covers(pattern, subject) for pattern in subjects):
            problems.append(f"subject {subject} is not among the stream's subjects ({', '.join(subjects) or 'none'})")
    notes: list[str] = []
    storage = StorageType(found.storage or StorageType.FILE)
    if storage != StorageType.FILE:
        notes.append(f"storage is {storage.value}: a server restart loses the messages, and read-back then cannot tell")
    if found.duplicate_window != asked.duplicate_window_seconds:
        notes.append(f"duplicate window is {found.duplicate_window:g} s, asked {asked.duplicate_window_seconds:g} s")
    age = found.max_age or None
    if age != asked.max_age_seconds:
        notes.append(f"max age is {_age(age)}, asked {_age(asked.max_age_seconds)}")
    if (found.num_replicas or 1) != asked.replicas:
        notes.append(f"replicas are {found.num_replicas or 1}, asked {asked.replicas}")
    return Ensured(created=False, problems=problems, notes=notes)


def _age(seconds: float | None) -> str:
    return "unlimited" if seconds is None else f"{seconds:g} s"


def _said(error: BaseException) -> str:
    if isinstance(error, TimeoutError | nats.errors.TimeoutError):
        return "no answer in time"
    description = getattr(error, "description", None)
    code = getattr(error, "err_code", None)
    if description:
        return f"{description} (err_code {code})" if code else str(description)
    return type(error).__name__
