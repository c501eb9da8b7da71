"""Read-back: does the channel (or the thread) hold the message an earlier attempt posted?

    a message in a channel ──conversations.history(oldest=since, include_all_metadata)──┐
    a reply in a thread    ──conversations.replies(ts=thread_ts, oldest=since, ...)──────┴─▶ pages, newest first
        a message whose metadata is {event_type: outbox_action, event_payload: {key: <marker>}} ──▶ Found(ts)
        every page read (at most READBACK_PAGES), none holds it                              ──▶ Absent
        more pages than that                                                                 ──▶ Unprovable

The marker is a digest of the action's idempotency key (`message_marker`): every attempt of an action posts
the same one, and no payload data shows in it. `since` is a Slack timestamp noted in the trace before the
first attempt's fence, two minutes before it (clocks differ): a message that attempt posted is newer. These
are the conversation's own listings, read from the store that chat.postMessage wrote before it answered,
not Slack's search index (search.messages), which lags. A call that fails raises SlackApiError or the
client's connection error: the caller classifies it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outbox._internal.config.extras import needs

with needs("slack"):
    from slack_sdk.web.async_client import AsyncWebClient

METADATA_EVENT = "outbox_action"
# a page of a listing, and the most pages read: 2,000 messages since the first attempt
PAGE_SIZE = 200
READBACK_PAGES = 10
# how far before the first write's claim (on the database's clock, never the executor's) `since` starts: the
# database's clock and Slack's differ
SINCE_MARGIN_SECONDS = 120.0


def message_marker(idempotency_key: str) -> str:
    """The marker every attempt of the action with `idempotency_key` puts in its message's metadata."""
    return "ob_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def metadata(marker: str) -> dict[str, Any]:
    """chat.postMessage's `metadata` for `marker`."""
    return {"event_type": METADATA_EVENT, "event_payload": {"key": marker}}


def since_ts(unix_seconds: float) -> str:
    """The Slack timestamp `SINCE_MARGIN_SECONDS` before `unix_seconds`."""
    return f"{max(0.0, unix_seconds - SINCE_MARGIN_SECONDS):.6f}"


@dataclass(frozen=True)
class Found:
    ts: str


@dataclass(frozen=True)
class Absent:
    """Proven: the listing since `since` holds no message with the marker."""


@dataclass(frozen=True)
class Unprovable:
    reason: str


Look = Found | Absent | Unprovable


async def look(client: AsyncWebClient, channel: str, thread_ts: str | None, marker: str, since: str) -> Look:
    """Whether `channel` (the thread `thread_ts` when given) holds a message with `marker`, posted since `since`."""
    cursor: str | None = None
    for _ in range(READBACK_PAGES):
        args: dict[str, Any] = {"channel": channel, "oldest": since, "inclusive": True, "limit": PAGE_SIZE}
        if cursor:
            args["cursor"] = cursor
        if thread_ts is None:
            page = await client.conversations_history(include_all_metadata=True, **args)
        else:
            page = await client.conversations_replies(ts=thread_ts, include_all_metadata=True, **args)
        for message in page.get("messages") or []:
            if _marked(message, marker):
                return Found(str(message.get("ts")))
        cursor = (page.get("response_metadata") or {}).get("next_cursor")
        if not page.get("has_more") or not cursor:
            return Absent()
    return Unprovable(
        f"read-back: more than {READBACK_PAGES * PAGE_SIZE:,} messages in {channel} since the first attempt;"
        " the message may be among the older ones"
    )


def _marked(message: object, marker: str) -> bool:
    if not isinstance(message, Mapping):
        return False
    found = message.get("metadata")
    if not isinstance(found, Mapping) or found.get("event_type") != METADATA_EVENT:
        return False
    payload = found.get("event_payload")
    return isinstance(payload, Mapping) and payload.get("key") == marker
