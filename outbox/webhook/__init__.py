"""Webhooks: the WEBHOOK kind's adapter, its endpoints, its events and the signed message it sends.

An application registers its endpoints (`register_endpoint`) and an event type per kind of webhook
(`WebhookEvent`, `register_webhook_event`), and enqueues with `enqueue_webhook`; executors run
`webhook_adapters(engine)` (`outbox run --adapters outbox.webhook:webhook_adapters`, from a module that
registers them first).

    import outbox ──▶ outbox.webhook.kind (WEBHOOK's declaration; nothing else of this package)
    outbox.webhook.<name> ──first use──▶ its module: the endpoints (outbox.webhook.endpoints), the events
                                         (outbox.webhook.events), the message (outbox.webhook.message),
                                         the adapter and HTTP (outbox.webhook.adapter)

Each name loads its module on first use, so registering WEBHOOK at `import outbox` loads no HTTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox._internal.exports import lazy_names

if TYPE_CHECKING:
    from outbox.webhook.adapter import WebhookAdapter, classify, webhook_adapters
    from outbox.webhook.endpoints import (
        UnknownEndpoint,
        WebhookEndpoint,
        WebhookSecretError,
        add_secret_source,
        endpoint_named,
        register_endpoint,
    )
    from outbox.webhook.events import (
        UnknownEvent,
        WebhookEvent,
        check_payload,
        enqueue_webhook,
        enqueue_webhook_async,
        event_named,
        register,
        register_webhook_event,
    )
    from outbox.webhook.message import BODY_LIMIT, InvalidBody, webhook_id

# no name here may be a module of this package too (the module would replace the name once imported)
_HOMES = {
    "BODY_LIMIT": "outbox.webhook.message",
    "InvalidBody": "outbox.webhook.message",
    "UnknownEndpoint": "outbox.webhook.endpoints",
    "UnknownEvent": "outbox.webhook.events",
    "WebhookAdapter": "outbox.webhook.adapter",
    "WebhookEndpoint": "outbox.webhook.endpoints",
    "WebhookEvent": "outbox.webhook.events",
    "WebhookSecretError": "outbox.webhook.endpoints",
    "add_secret_source": "outbox.webhook.endpoints",
    "check_payload": "outbox.webhook.events",
    "classify": "outbox.webhook.adapter",
    "endpoint_named": "outbox.webhook.endpoints",
    "enqueue_webhook": "outbox.webhook.events",
    "enqueue_webhook_async": "outbox.webhook.events",
    "event_named": "outbox.webhook.events",
    "register": "outbox.webhook.events",
    "register_endpoint": "outbox.webhook.endpoints",
    "register_webhook_event": "outbox.webhook.events",
    "webhook_adapters": "outbox.webhook.adapter",
    "webhook_id": "outbox.webhook.message",
}

__all__ = [
    "BODY_LIMIT",
    "InvalidBody",
    "UnknownEndpoint",
    "UnknownEvent",
    "WebhookAdapter",
    "WebhookEndpoint",
    "WebhookEvent",
    "WebhookSecretError",
    "add_secret_source",
    "check_payload",
    "classify",
    "endpoint_named",
    "enqueue_webhook",
    "enqueue_webhook_async",
    "event_named",
    "register",
    "register_endpoint",
    "register_webhook_event",
    "webhook_adapters",
    "webhook_id",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
