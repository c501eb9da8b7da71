"""NATS JetStream: the NATS_EVENT kind's adapter, its events, and the stream they are published to.

An application defines a `NatsEvent` per type of event, registers it (`register_nats_event`), and
enqueues with `enqueue_event`; executors run `nats_adapters(engine)`; `outbox nats ensure-stream` makes the
stream (docs/nats.md).

    import outbox ──▶ outbox.nats.kind (NATS_EVENT's declaration; nothing else of this package)
    outbox.nats.<name> ──first use──▶ its module: the events (outbox.nats.events), the message
                                      (outbox.nats.message), the adapter (outbox.nats.adapter), the
                                      stream (outbox.nats.streams), the settings (outbox.nats.settings)

Each name loads its module on first use, so registering NATS_EVENT at `import outbox` loads no NATS client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox.nats.adapter import NatsAdapter, nats_adapters
    from outbox.nats.events import (
        NatsEvent,
        PreparedEvent,
        UnknownEvent,
        enqueue_event,
        enqueue_event_async,
        event_named,
        register,
        register_nats_event,
    )
    from outbox.nats.message import InvalidEvent, event_token
    from outbox.nats.settings import NatsConfig
    from outbox.nats.streams import StreamSpec, ensure_stream

# no name here may be a module of this package too (the module would replace the name once imported)
_HOMES = {
    "InvalidEvent": "outbox.nats.message",
    "NatsAdapter": "outbox.nats.adapter",
    "NatsConfig": "outbox.nats.settings",
    "NatsEvent": "outbox.nats.events",
    "PreparedEvent": "outbox.nats.events",
    "StreamSpec": "outbox.nats.streams",
    "UnknownEvent": "outbox.nats.events",
    "ensure_stream": "outbox.nats.streams",
    "enqueue_event": "outbox.nats.events",
    "enqueue_event_async": "outbox.nats.events",
    "event_named": "outbox.nats.events",
    "event_token": "outbox.nats.message",
    "nats_adapters": "outbox.nats.adapter",
    "register": "outbox.nats.events",
    "register_nats_event": "outbox.nats.events",
}

__all__ = [
    "InvalidEvent",
    "NatsAdapter",
    "NatsConfig",
    "NatsEvent",
    "PreparedEvent",
    "StreamSpec",
    "UnknownEvent",
    "enqueue_event",
    "enqueue_event_async",
    "ensure_stream",
    "event_named",
    "event_token",
    "nats_adapters",
    "register",
    "register_nats_event",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
