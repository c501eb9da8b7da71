"""A Slack message as an action: its payload, the check at enqueue, and the helpers that enqueue one.

    slack_message(workspace, channel, text, thread_ts=, blocks=, idempotency_key=) ──▶ ActionRequest
        payload {"workspace", "channel", "text"[, "thread_ts"][, "blocks"]}; lane slack:<workspace>:<channel>
    enqueue ──check_payload──▶ the workspace registered, a channel ID, 1 to 40,000 characters of text,
                              a thread's ts, at most 50 blocks ──▶ destination slack:<workspace>
                              anything else ──▶ InvalidRequest naming the field; nothing written

The message is the payload itself: what is posted is what was enqueued. Messages to one channel share a lane
by default, so they arrive in the order enqueued. No Slack client is imported here: enqueueing needs none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from outbox.action import Action
from outbox.errors import InvalidRequest
from outbox.intake import enqueue, enqueue_async
from outbox.requests import ActionRequest
from outbox.slack.kind import SLACK_MESSAGE
from outbox.slack.workspaces import UnknownWorkspace, destination_name, workspace_named
from outbox.store.caller import AsyncConn, SyncConnection

# Slack's limits on chat.postMessage: text it truncates past 40,000 characters, at most 50 blocks
TEXT_LIMIT = 40_000
BLOCKS_LIMIT = 50
# a conversation's ID: a public channel (C), a private one (G) or a direct message (D); never a name
_CHANNEL = re.compile(r"[CGD][A-Z0-9]{6,20}")
# a message's timestamp, the id of the thread a reply goes to
_TS = re.compile(r"[0-9]{10}\.[0-9]{6}")
_FIELDS = ("workspace", "channel", "text", "thread_ts", "blocks")


def check_payload(payload: Any) -> str:
    """SLACK_MESSAGE's payload check at enqueue, by the rules in this module's docstring; returns the action's
    destination, `slack:<workspace>`."""
    if not isinstance(payload, dict):
        raise InvalidRequest("payload", f"a SLACK_MESSAGE payload is an object, not a {type(payload).__name__}")
    others = sorted(repr(key) for key in payload if key not in _FIELDS)
    if others:
        raise InvalidRequest("payload", f"a SLACK_MESSAGE payload holds {', '.join(_FIELDS)}, not {others[0]}")
    workspace = payload.get("workspace")
    try:
        workspace_named(workspace)
    except UnknownWorkspace as unknown:
        raise InvalidRequest("payload.workspace", str(unknown)) from None
    _check_channel(payload.get("channel"))
    _check_text(payload.get("text"))
    if payload.get("thread_ts") is not None:
        _check_ts(payload["thread_ts"])
    if payload.get("blocks") is not None:
        _check_blocks(payload["blocks"])
    return destination_name(str(workspace))


def slack_message(
    workspace: str,
    channel: str,
    text: str,
    *,
    idempotency_key: str,
    thread_ts: str | None = None,
    blocks: Sequence[Mapping[str, Any]] | None = None,
    lane_key: str | None = None,
    workspace_id: int | None = None,
    subject_account_id: int | None = None,
    max_attempts: int = 5,
    expires_at: datetime | None = None,
) -> ActionRequest:
    """The request of a message to `channel` (an ID such as C0123ABCD), or a reply in the thread `thread_ts`.
    `lane_key`: by default one lane per channel, so its messages arrive in order."""
    payload: dict[str, Any] = {"workspace": workspace, "channel": channel, "text": text}
    if thread_ts is not None:
        payload["thread_ts"] = thread_ts
    if blocks is not None:
        payload["blocks"] = [dict(block) if isinstance(block, Mapping) else block for block in blocks]
    check_payload(payload)
    return ActionRequest(
        kind=SLACK_MESSAGE,
        lane_key=lane_key if lane_key is not None else f"slack:{workspace}:{channel}",
        idempotency_key=idempotency_key,
        payload=payload,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )


def enqueue_slack_message(conn: SyncConnection, workspace: str, channel: str, text: str, **fields: Any) -> Action:
    """Enqueue `slack_message(workspace, channel, text, **fields)` in the caller's transaction (see
    `outbox.enqueue`); InvalidRequest naming the field, and nothing written, when it cannot be posted."""
    return enqueue(conn, slack_message(workspace, channel, text, **fields))


async def enqueue_slack_message_async(
    conn: AsyncConn, workspace: str, channel: str, text: str, **fields: Any
) -> Action:
    """`enqueue_slack_message` for an `AsyncConnection`, an `AsyncSession` or a psycopg `AsyncConnection`."""
    return await enqueue_async(conn, slack_message(workspace, channel, text, **fields))


def _check_channel(channel: object) -> None:
    if not isinstance(channel, str) or not _CHANNEL.fullmatch(channel):
        raise InvalidRequest(
            "payload.channel",
            "a conversation's ID (C, G or D and 6 to 20 upper case letters and digits, such as C0123ABCD), never"
            f" its name, which can change; not {_shown(channel)}",
        )


def _check_text(text: object) -> None:
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("payload.text", f"the message's text (with blocks, its fallback), not {_shown(text)}")
    if len(text) > TEXT_LIMIT:
        raise InvalidRequest("payload.text", f"at most {TEXT_LIMIT:,} characters (Slack's limit), not {len(text):,}")


def _check_ts(ts: object) -> None:
    if not isinstance(ts, str) or not _TS.fullmatch(ts):
        raise InvalidRequest("payload.thread_ts", f"a message's ts such as 1700000000.000100, not {_shown(ts)}")


def _check_blocks(blocks: object) -> None:
    if not isinstance(blocks, list) or not 1 <= len(blocks) <= BLOCKS_LIMIT:
        raise InvalidRequest("payload.blocks", f"a list of 1 to {BLOCKS_LIMIT} Block Kit blocks")
    for number, block in enumerate(blocks, 1):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest("payload.blocks", f"block {number} is not an object with a type")


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:36] + "...'"
