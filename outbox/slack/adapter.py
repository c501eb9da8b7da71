"""SlackAdapter: the only adapter of SLACK_MESSAGE; it posts each message once with chat.postMessage.

    payload ─▶ workspace (registered, token found when built) ─▶ note workspace, channel, marker
        ─▶ an earlier attempt's answer lost (or its executor gone after its fence)? read back
           (outbox.slack.readback): found ─▶ Done; cannot prove absence ─▶ Uncertain
        ─▶ the channel's turn (CHANNEL_RATE; a turn more than GATE_WAIT_SECONDS away: Defer)
        ─▶ note since ─▶ fence ─▶ ONE chat.postMessage (slack_sdk's AsyncWebClient, no retry handler), with
           metadata {event_type: outbox_action, event_payload: {key: <marker>}} ─▶ classify

| Slack's answer                                                   | result                                     |
| ok                                                               | Done `channel=<id> ts=<ts>`                 |
| 429 / `ratelimited`, `rate_limited`, `message_limit_exceeded`    | SlowDown: the workspace pauses for the      |
|                                                                  | Retry-After (or a backoff), uncounted       |
| `invalid_auth`, `token_revoked`, `token_expired`,                | CredentialsRefused: the workspace is held,  |
| `account_inactive`, `not_authed`, `missing_scope`,               | one probe every 5 minutes, an alert names   |
| `not_allowed_token_type`, `no_permission`, `ekm_access_denied`,  | it; the attempt does not count              |
| `team_access_not_granted`, HTTP 401                              |                                             |
| `channel_not_found`, `is_archived`, `not_in_channel`,            | Failed PROVIDER_REFUSED: no attempt can     |
| `msg_too_long`, `no_text`, `invalid_blocks`, ... (ENDS)          | succeed                                     |
| `internal_error`, `fatal_error`, `service_unavailable`,          | Retry, answer lost: the next attempt reads  |
| `request_timeout`, any other 5xx                                 | back first; Uncertain at the last attempt   |
| connection refused (nothing sent)                                | Retry                                       |
| timeout, reset, closed after the request was sent                | Retry, answer lost (as a 5xx)               |
| any other error                                                  | Retry                                       |

Read-back runs only on an attempt after one whose answer was lost (`answer_lost` in the trace) or whose
executor stopped after its fence (`attempt.write_started()`), never on a first attempt. The client's own
retries are off (`retry_handlers=[]`; its default re-sends once after a connection error: a second message),
and its logger only warns (its debug lines would show the message). Results carry Slack's error codes and
HTTP statuses, never the text, the token or the response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import tracing
from outbox._internal.config.extras import needs
from outbox._internal.config.rates import Rate
from outbox.errors import InvalidRequest
from outbox.executor import (
    ActionAdapter,
    ActionAttempt,
    CredentialsRefused,
    Defer,
    Done,
    Failed,
    Result,
    Retry,
    Uncertain,
)
from outbox.executor.backoff import slow_down
from outbox.executor.pacing import GATE_WAIT_SECONDS
from outbox.kinds import ActionKind
from outbox.slack.kind import SLACK_MESSAGE
from outbox.slack.messages import check_payload
from outbox.slack.readback import Found, Unprovable, look, message_marker, metadata, since_ts
from outbox.slack.workspaces import SlackWorkspace, registered_workspaces, workspace_token

with needs("slack"):
    import aiohttp
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

# the longest a call may take, unless the write window ends sooner
REQUEST_SECONDS = 15.0
# a Retry-After is clamped to this range of seconds
DEFER_BOUNDS = (1.0, 3600.0)
SLOW = frozenset({"ratelimited", "rate_limited", "message_limit_exceeded"})
CREDENTIALS = frozenset(
    {
        "invalid_auth",
        "token_revoked",
        "token_expired",
        "account_inactive",
        "not_authed",
        "missing_scope",
        "not_allowed_token_type",
        "no_permission",
        "ekm_access_denied",
        "team_access_not_granted",
    }
)
ENDS = frozenset(
    {
        "channel_not_found",
        "is_archived",
        "not_in_channel",
        "msg_too_long",
        "no_text",
        "invalid_blocks",
        "invalid_blocks_format",
        "too_many_attachments",
        "invalid_metadata_format",
        "invalid_metadata_schema",
        "metadata_too_large",
        "restricted_action",
        "restricted_action_read_only_channel",
        "restricted_action_thread_only_channel",
        "restricted_action_non_threadable_channel",
        "cannot_reply_to_message",
        "thread_not_found",
        "invalid_arguments",
        "invalid_form_data",
        "invalid_json",
        "json_not_object",
        "invalid_charset",
        "duplicate_channel_not_found",
        "team_not_found",
        "as_user_not_supported",
    }
)
UNCLEAR = frozenset({"internal_error", "fatal_error", "service_unavailable", "request_timeout"})
# what a Retry's reason says when the message may have been posted
ANSWER_LOST = "the message may have been posted"


class SlackAdapter:
    """Looks up every registered workspace's token when built: a missing or malformed one raises
    SlackTokenError here, before anything runs."""

    def __init__(self, engine: AsyncEngine, *, request_seconds: float = REQUEST_SECONDS) -> None:
        self._engine = engine
        self.request_seconds = request_seconds
        self._tokens = {w.name: (w, workspace_token(w)) for w in registered_workspaces()}
        self._clients: dict[str, AsyncWebClient] = {}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turns = ChannelTurns()
        self._logger = logging.getLogger("outbox.slack.client")
        self._logger.setLevel(logging.WARNING)  # slack_sdk's debug lines show the message sent

    @property
    def kind(self) -> ActionKind:
        return SLACK_MESSAGE

    @property
    def rates(self) -> dict[str, Rate | None]:
        """The destinations this adapter posts to, its workspaces, and their configured rates."""
        return {workspace.destination: workspace.rate for workspace, _ in self._tokens.values()}

    async def aclose(self) -> None:
        """Close the adapter's connections."""
        if self._session is not None:
            await self._session.close()
        self._session, self._clients = None, {}

    def client(self, workspace: SlackWorkspace) -> AsyncWebClient:
        """The workspace's client on this event loop: one connection pool for all, no retry handler."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._session is None:
            self._loop, self._clients = loop, {}
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_seconds))
        found = self._clients.get(workspace.name)
        if found is None:
            _, token = self._tokens[workspace.name]
            found = AsyncWebClient(
                token=token,
                base_url=workspace.base_url,
                timeout=int(self.request_seconds),
                session=self._session,
                retry_handlers=[],
                logger=self._logger,
            )
            self._clients[workspace.name] = found
        return found

    async def execute(self, attempt: ActionAttempt) -> Result:
        action = attempt.action
        try:
            check_payload(action.payload)
        except InvalidRequest as invalid:  # a deploy may bring the workspace back
            return Retry(f"payload: {invalid}")
        payload: dict[str, Any] = action.payload
        found = self._tokens.get(payload["workspace"])
        if found is None:
            return Retry(f"workspace: {payload['workspace']} was registered after the adapter was built; no token")
        workspace, _ = found
        channel, thread_ts = payload["channel"], payload.get("thread_ts")
        marker = message_marker(action.idempotency_key)
        attempt.note(workspace=workspace.name, channel=channel, marker=marker)
        client = self.client(workspace)
        since = attempt.trace.get("since")
        lost = attempt.claimed_before() and (attempt.write_started() or bool(attempt.trace.get("answer_lost")))
        if lost and isinstance(since, str):
            looked = await self._read_back(attempt, client, channel, thread_ts, marker, since)
            if looked is not None:
                return looked
        wait = self._turns.take(workspace, channel)
        if wait > GATE_WAIT_SECONDS:
            return Defer(wait, f"channel {channel}: its turn is {wait:.1f} s away")
        if wait > 0:
            await asyncio.sleep(wait)
        if not isinstance(since, str):
            attempt.note(since=since_ts((action.claimed_at or datetime.now(UTC)).timestamp()))
        window = await attempt.fence().begin_write()
        bound = min(self.request_seconds, window.check())
        result = await self._post(client, payload, marker, bound, attempt.uncounted_claims())
        return self._settled(attempt, result)

    async def _read_back(
        self,
        attempt: ActionAttempt,
        client: AsyncWebClient,
        channel: str,
        thread_ts: str | None,
        marker: str,
        since: str,
    ) -> Result | None:
        """The result when the earlier message is found or its absence cannot be proven; None: post."""
        try:
            async with asyncio.timeout(self.request_seconds):
                found = await look(client, channel, thread_ts, marker, since)
        except SlackApiError as refused:
            status, code = refused.response.status_code, _code(refused.response)
            result = classify(status, code, refused.response.headers.get("Retry-After"), attempt.uncounted_claims())
            if isinstance(result, Failed):  # the channel cannot be read: the message may be there
                return Uncertain(f"read-back: {_said(status, code)}; {ANSWER_LOST}")
            return self._settled(attempt, _prefixed("read-back", result))
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            return self._settled(attempt, Retry(f"read-back: {type(error).__name__}; {ANSWER_LOST}"))
        if isinstance(found, Found):
            return Done(f"channel={channel} ts={found.ts} read back")
        if isinstance(found, Unprovable):
            return Uncertain(found.reason)
        return None

    async def _post(
        self, client: AsyncWebClient, payload: dict[str, Any], marker: str, bound: float, uncounted: int
    ) -> Result:
        args: dict[str, Any] = {"channel": payload["channel"], "text": payload["text"], "metadata": metadata(marker)}
        for optional in ("thread_ts", "blocks"):
            if payload.get(optional) is not None:
                args[optional] = payload[optional]
        with tracing.provider_call("chat.postMessage") as call:
            try:
                async with asyncio.timeout(bound):
                    answer = await client.chat_postMessage(**args)
            except SlackApiError as refused:
                status, code = refused.response.status_code, _code(refused.response)
                if status == 200:
                    call.failed(code or "error")
                else:
                    call.answered(status)
                return classify(status, code, refused.response.headers.get("Retry-After"), uncounted)
            except aiohttp.ClientConnectorError as error:
                call.failed(type(error).__name__)
                return Retry(f"connect: {type(error).__name__}; nothing was sent")
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                call.failed(type(error).__name__)
                what = f"no answer within {bound:g} s" if isinstance(error, TimeoutError) else type(error).__name__
                return Retry(f"response: {what}; {ANSWER_LOST}")
            call.answered(answer.status_code)
        return Done(f"channel={answer.get('channel') or payload['channel']} ts={answer.get('ts')}")

    def _settled(self, attempt: ActionAttempt, result: Result) -> Result:
        """An unclear answer noted (the next attempt reads back); at the last attempt an unclear Retry, or any
        Retry after an earlier unclear one, is Uncertain: the message may exist."""
        if isinstance(result, Retry) and ANSWER_LOST in result.reason:
            attempt.note(answer_lost=True)
        last = attempt.action.attempt >= attempt.action.max_attempts
        if last and isinstance(result, Retry) and attempt.trace.get("answer_lost"):
            return Uncertain(f"{result.reason}; an earlier answer was lost, so the message may exist")
        return result


def classify(status: int, code: str | None, retry_after: str | None, uncounted: int) -> Result:
    """Slack's answer (`status`, the `error` of {"ok": false}), by the table in this module's docstring;
    `uncounted`: the action's earlier claims that did not count (a slow-down's wait grows with them)."""
    said = _said(status, code)
    if status == 429 or code in SLOW:
        after = retry_after_seconds(retry_after)
        if after is not None:
            return slow_down(uncounted, f"{said}: Slack asked to wait {after:g} s", after)
        return slow_down(uncounted, f"{said}: Slack asked to slow down")
    if status == 401 or code in CREDENTIALS:
        return CredentialsRefused(reason=f"{said}: Slack refused the workspace's token")
    if code in ENDS:
        return Failed(f"{said}: Slack refused the message")
    if status >= 500 or code in UNCLEAR:
        return Retry(f"{said}; {ANSWER_LOST}")
    return Retry(f"{said}: Slack did not post the message")


def retry_after_seconds(value: str | None) -> float | None:
    """Slack's Retry-After (whole seconds), clamped to DEFER_BOUNDS; None when absent or unreadable."""
    if value is None or not value.strip().isdigit() or not value.strip().isascii():
        return None
    low, high = DEFER_BOUNDS
    return min(max(float(value.strip()[:12]), low), high)


class ChannelTurns:
    """When each channel may take its next message from this adapter: Slack allows about one a second per
    channel (the workspace's `channel_rate`). `take` reserves the next turn and says how long until it."""

    LIMIT = 10_000  # channels remembered; past this the oldest turns are forgotten (they are long past)

    def __init__(self) -> None:
        self._next: dict[tuple[str, str], float] = {}

    def take(self, workspace: SlackWorkspace, channel: str) -> float:
        now = time.monotonic()
        key = (workspace.name, channel)
        turn = max(now, self._next.get(key, now))
        if turn - now > GATE_WAIT_SECONDS:
            return turn - now
        if len(self._next) >= self.LIMIT:
            self._next = {k: t for k, t in self._next.items() if t > now}
        self._next[key] = turn + 1.0 / workspace.channel_rate.per_second
        return turn - now


def _code(response: Any) -> str | None:
    data = response.data if isinstance(response.data, dict) else {}
    error = data.get("error")
    return error if isinstance(error, str) and error.isascii() and len(error) <= 100 else None


def _said(status: int, code: str | None) -> str:
    return f"{status} {code}" if code else f"{status}"


def _prefixed(stage: str, result: Result) -> Result:
    if isinstance(result, Retry):
        return Retry(f"{stage}: {result.reason}", result.after)
    return result


def slack_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The SLACK_MESSAGE adapter; the application registers its workspaces first."""
    return [SlackAdapter(engine)]
