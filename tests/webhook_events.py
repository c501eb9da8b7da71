"""A webhook event for tests and benchmarks that need webhooks but nothing to look up: event `{"n": n}`, one lane
and one idempotency key per number (`<name>:<n>`), its body `{"n": n}`. Subclass it with `name` and `endpoint`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outbox.webhook import WebhookEvent


class NumberedHook(WebhookEvent):
    workspace_scoped = False

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {}

    def compose(self, event: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        return {"n": event["n"]}

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"{self.name}:{event['n']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"{self.name}:{event['n']}"
