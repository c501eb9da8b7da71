"""WebhookAdapter: the only adapter of WEBHOOK and the only code that sends webhooks over HTTP.

    payload ─▶ event type (registered?) ─▶ note trace: event_type, endpoint, webhook_id
        ─▶ query rows (an engine connection only for a query) ─▶ compose ─ None ─▶ Cancelled NOT_WANTED
                                 ─ raised, not JSON, body > 256 KiB ─▶ Failed (nothing was sent)
        ─▶ body and signature for now ─▶ fence ─▶ ONE POST (no redirect followed), bounded by
           min(request_seconds, the window) ─▶ the response's status and at most 64 KiB of its body ─▶ classify

Every attempt of an action sends the same webhook-id with a fresh webhook-timestamp and signature; the
receiver keeps one effect per webhook-id. So sending again IS the read-back: after a reclaim
(`attempt.write_started()` or `attempt.claimed_before()`) the adapter looks nothing up, it sends again,
and a receiver that already holds the webhook answers 2xx without a second effect. As senders of
webhooks do, every answer but 2xx is retried (a redirect is never followed; it counts as a failure):

| what happened                                                | result                                        |
| 2xx                                                          | Done: `"<status> webhook-id=<id>"`, and        |
|                                                              | ` receiver-id=<id>` for a short printable `id` |
|                                                              | in a JSON answer                               |
| 410 Gone                                                     | Failed PROVIDER_REFUSED, at once               |
| 429 or 503 with Retry-After (seconds or an HTTP date)        | SlowDown: the endpoint pauses for the wait,    |
|                                                              | clamped to 1 s .. 1 h                          |
| 429 or 503 without a readable Retry-After                    | SlowDown: the endpoint pauses, a backoff       |
| 3xx (not followed), any other 4xx, 5xx                       | Retry (the schedule)                           |
| refused, DNS failure, connect timeout, TLS handshake failure | Retry: nothing was sent                        |
| timeout, reset or protocol error once the request was sent   | Retry with the same webhook-id; at the        |
|                                                              | action's last attempt Uncertain               |
|                                                              | PROVIDER_UNCERTAIN (Failed would claim the    |
|                                                              | receiver holds nothing)                       |

429 and 503 ask the sender to slow down: the receiver took nothing, so the attempt does not count, and the
endpoint's destination (`webhook:<endpoint>`) pauses for every executor (outbox.executor.pacing): for the
Retry-After, or else 0.5 s doubling while the receiver keeps refusing, never above 5 minutes; its pace is
lowered too. After 20 such deferrals of one action a slow-down counts as an attempt, so a receiver that
answers 429 for ever still lets the action end.

An attempt whose answer was lost after the request was sent notes `answer_lost` in the trace: at the last
attempt, any answer that would be a Retry (nothing sent this time, a 5xx) ends Uncertain PROVIDER_UNCERTAIN
instead of FAILED, since the receiver may hold the earlier delivery.

With OpenTelemetry (`outbox.tracing`) the POST is a span of its own under the attempt's (named `POST`, with
the HTTP semantic conventions' method, server address and port, response status, and `error.type` and an
error status on a 4xx, a 5xx or a request that failed; never the URL), and its W3C `traceparent` (and
`tracestate`) go with the request, outside the signature: a receiver may continue the trace.

Results carry status codes and stage names only (connect, tls, send, response, body), never the URL's
query, the body or the response's text: the executor keeps each reason as the action's last_error.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import tracing
from outbox._internal.config.extras import needs
from outbox._internal.config.rates import Rate
from outbox.errors import InvalidRequest
from outbox.executor import ActionAdapter, ActionAttempt, Cancelled, Done, Failed, Result, Retry, Uncertain
from outbox.executor.attempt import WriteWindow
from outbox.executor.backoff import slow_down
from outbox.kinds import ActionKind
from outbox.webhook.endpoints import WebhookEndpoint, endpoint_secrets, registered_endpoints
from outbox.webhook.events import UnknownEvent, event_of
from outbox.webhook.kind import WEBHOOK
from outbox.webhook.message import InvalidBody, SignedRequest, body, signed, signers, webhook_id

with needs("webhook"):
    import httpx

    from outbox._internal.connections.network import PoolsInTurn, with_quick_idle_check

# what a Retry's reason says when the request went out and its answer was lost: the receiver may hold it
SENT_UNANSWERED = "after the request was sent"
# the longest a request may take, unless the write window ends sooner
REQUEST_SECONDS = 15.0
# the most of a response's body read
RESPONSE_LIMIT = 64 * 1024
# a Retry-After is clamped to this range of seconds
DEFER_BOUNDS = (1.0, 3600.0)
# a receiver's id kept in readback_ref: short, printable, no spaces
_RECEIVER_ID = re.compile(r"[\x21-\x7e]{1,100}")
# the stage an httpcore trace event starts; before any: connect
_STAGES = {
    "connection.connect_tcp.started": "connect",
    "connection.connect_unix_socket.started": "connect",
    "connection.start_tls.started": "tls",
    "http11.send_request_headers.started": "send",
    "http2.send_request_headers.started": "send",
    "http11.receive_response_headers.started": "response",
    "http2.receive_response_headers.started": "response",
}
_NOTHING_SENT = ("connect", "tls")


class WebhookAdapter:
    """Looks up every registered endpoint's secret when built: a missing or malformed one raises
    WebhookSecretError here, before anything runs."""

    def __init__(self, engine: AsyncEngine, *, request_seconds: float = REQUEST_SECONDS) -> None:
        if not (isinstance(request_seconds, int | float) and 0 < request_seconds <= 60):
            raise ValueError(f"request_seconds must be more than 0 and at most 60, not {request_seconds!r}")
        self._engine = engine
        self.request_seconds = float(request_seconds)
        self._signers = {e.name: (e, signers(endpoint_secrets(e))) for e in registered_endpoints()}
        self._span_attributes = {name: span_attributes(e.url) for name, (e, _) in self._signers.items()}
        # identity: the body read is the body sent, never a small compressed answer that unpacks to megabytes
        # PoolsInTurn: its pools taken in turn, each checking idle connections on their sockets (a proxy's too)
        self._client = with_quick_idle_check(
            httpx.AsyncClient(
                transport=PoolsInTurn(),
                follow_redirects=False,
                timeout=self.request_seconds,
                headers={"accept-encoding": "identity"},
            )
        )

    @property
    def kind(self) -> ActionKind:
        return WEBHOOK

    @property
    def rates(self) -> dict[str, Rate | None]:
        """The destinations this adapter sends to, its endpoints, and their configured rates."""
        return {endpoint.destination: endpoint.rate for endpoint, _ in self._signers.values()}

    async def aclose(self) -> None:
        """Close the adapter's connections."""
        await self._client.aclose()

    async def execute(self, attempt: ActionAttempt) -> Result:
        action = attempt.action
        try:
            definition, event = event_of(action.payload)
        except (UnknownEvent, InvalidRequest) as unknown:  # a deploy may bring the event type back
            return Retry(f"payload: {unknown}")
        msg_id = webhook_id(action.idempotency_key)
        # what traces the webhook once its payload is gone: written with the fence, or with the result
        attempt.note(event_type=definition.name, endpoint=definition.endpoint, webhook_id=msg_id)
        found = self._signers.get(definition.endpoint)
        if found is None:
            return Retry(
                f"endpoint: {definition.endpoint} was registered after the adapter was built; it has no secret"
            )
        endpoint, endpoint_signers = found
        rows = await definition.rows_from(self._engine, event)
        try:
            data = definition.compose(event, rows)
        except Exception as error:  # the application's compose: nothing was sent
            return Failed(f"compose: the {definition.name} event's compose raised {type(error).__name__}")
        if data is None:
            return Cancelled(f"compose: the {definition.name} event has nothing to send now")
        now = datetime.now(UTC)
        try:
            request = signed(msg_id, now, body(definition.name, data, now), endpoint_signers)
        except InvalidBody as invalid:
            return Failed(f"compose: {invalid}")
        window = await attempt.fence().begin_write()
        last = action.attempt >= action.max_attempts
        result = await self._post(window, endpoint, request, last=last, uncounted=attempt.uncounted_claims())
        if isinstance(result, Retry) and SENT_UNANSWERED in result.reason:
            attempt.note(answer_lost=True)  # the receiver may hold it from now on
        if last and isinstance(result, Retry) and attempt.trace.get("answer_lost"):
            return Uncertain(f"{result.reason}; an earlier attempt's answer was lost, so the receiver may hold it")
        return result

    async def _post(
        self, window: WriteWindow, endpoint: WebhookEndpoint, request: SignedRequest, *, last: bool, uncounted: int
    ) -> Result:
        stage = "connect"

        async def trace(name: str, info: Mapping[str, Any]) -> None:
            nonlocal stage
            stage = _STAGES.get(name, stage)

        msg_id = request.headers["webhook-id"]
        status: int | None = None
        head = httpx.Headers()
        answer = b""
        bound = min(self.request_seconds, window.check())
        with tracing.provider_call("POST", attributes=self._span_attributes[endpoint.name]) as call:
            try:
                async with asyncio.timeout(bound):
                    async with self._client.stream(
                        "POST",
                        endpoint.url,
                        content=request.body,
                        headers={**request.headers, **call.headers},
                        timeout=bound,
                        extensions={"trace": trace},
                    ) as response:
                        status, head = response.status_code, response.headers
                        call.answered(status)
                        stage = "body"
                        async for chunk in response.aiter_raw():
                            answer += chunk
                            if len(answer) >= RESPONSE_LIMIT:
                                break
            except (httpx.RequestError, TimeoutError, OSError) as error:
                call.failed(type(error).__name__)
                if status is None:
                    return _unanswered(stage, _what_happened(error, bound), last)
        return classify(status, head.get("retry-after"), answer[:RESPONSE_LIMIT], msg_id, uncounted)


def _what_happened(error: BaseException, bound: float) -> str:
    """A failed request in a few words: the bound on the whole request ran out ("no answer within 15 s"), or
    the error's class (`ConnectError`, `ReadTimeout`: one of httpx's own bounds, `ConnectionResetError`)."""
    if isinstance(error, TimeoutError):
        return f"no answer within {bound:g} s"
    return type(error).__name__


def span_attributes(url: str) -> dict[str, tracing.AttributeValue]:
    """The POST span's attributes, by the HTTP semantic conventions of a client span, for an endpoint's URL. No
    `url.full`: a webhook URL's path carries a token as often as its query does (`/services/T0/B0/<token>`),
    and the endpoint's name is on the attempt's span (`outbox.trace.endpoint`)."""
    parsed = httpx.URL(url)
    return {
        "http.request.method": "POST",
        "server.address": parsed.host,
        "server.port": parsed.port or (443 if parsed.scheme == "https" else 80),
        "url.scheme": parsed.scheme,
    }


def _unanswered(stage: str, error: str, last: bool) -> Result:
    if stage in _NOTHING_SENT:
        return Retry(f"{stage}: {error}; nothing was sent")
    if last:
        return Uncertain(f"{stage}: {error} after the request was sent, at the last attempt")
    return Retry(f"{stage}: {error} {SENT_UNANSWERED}; the next attempt sends the same webhook-id")


def classify(status: int, retry_after: str | None, answer: bytes, msg_id: str, uncounted: int) -> Result:
    """The receiver's answer, by the table in this module's docstring; `uncounted`: the action's earlier claims
    that did not count (the slow-down's wait grows with them)."""
    if 200 <= status < 300:
        ref = f"{status} webhook-id={msg_id}"
        receiver = receiver_id(answer)
        return Done(ref if receiver is None else f"{ref} receiver-id={receiver}")
    if status == 410:
        return Failed("410: the receiver says the endpoint is gone")
    if status in (429, 503):
        after = retry_after_seconds(retry_after, datetime.now(UTC))
        if after is not None:
            return slow_down(uncounted, f"{status}: the receiver asked to wait {after:g} s", after)
        return slow_down(uncounted, f"{status}: the receiver asks to slow down; it took nothing")
    if 300 <= status < 400:
        return Retry(f"{status}: a redirect, not followed")
    return Retry(f"{status}: the receiver did not take the webhook")


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A Retry-After header's wait (delay seconds or an HTTP date), clamped to DEFER_BOUNDS; None if unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit() and text.isascii():
        seconds = float(text) if len(text) <= 12 else DEFER_BOUNDS[1]
    else:
        try:
            seconds = (parsedate_to_datetime(text) - now).total_seconds()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    low, high = DEFER_BOUNDS
    return min(max(seconds, low), high)


def receiver_id(answer: bytes) -> str | None:
    """The `id` of a JSON object answer when it is short and printable (no spaces), else None."""
    try:
        found = json.loads(answer)
    except (ValueError, RecursionError):
        return None
    value = found.get("id") if isinstance(found, dict) else None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and _RECEIVER_ID.fullmatch(value) else None


def webhook_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """The WEBHOOK adapter; the application registers its endpoints and events first."""
    return [WebhookAdapter(engine)]
