"""A local Slack Web API for the demo and the tests: a real HTTP server on a free 127.0.0.1 port, in a thread,
answering as Slack's Web API documents, so that slack_sdk's own client parses every answer.

    POST /api/chat.postMessage (JSON or form, Authorization: Bearer <token>)
         no token ─▶ 200 {"ok": false, "error": "not_authed"}; unknown ─▶ invalid_auth; revoked ─▶ token_revoked
         over the channel's bucket (1 a second, a short burst) or the workspace's ─▶ 429, Retry-After: <s>,
             {"ok": false, "error": "ratelimited"}
         the next step of the script (none left: "ok"):
           "ok"          store the message ─▶ 200 {"ok": true, "channel", "ts", "message"}
           "kept-reset"  store it, then reset the connection (the answer is lost)
           "kept-502"    store it, then 502 with an HTML body (a proxy's answer after the write)
           "kept-stall"  store it, then answer nothing until the server stops
           "reset"       reset the connection, nothing stored
           "500", "502", "503"  that status, an HTML body, nothing stored
           "429 <s>"     429 ratelimited with Retry-After <s>, nothing stored
           "error <code>"  200 {"ok": false, "error": "<code>"}, nothing stored (channel_not_found, ...)
         checked as Slack does: unknown channel ─▶ channel_not_found, archived ─▶ is_archived, not a member ─▶
         not_in_channel, no text nor blocks ─▶ no_text, over 40,000 characters ─▶ msg_too_long
    GET|POST /api/conversations.history (channel, oldest, latest, inclusive, limit, cursor, include_all_metadata)
         the channel's messages (not thread replies), newest first, pages with has_more and next_cursor;
         `metadata` only with include_all_metadata
    GET|POST /api/conversations.replies (channel, ts, ...) the thread's parent and replies, oldest first
         a ts that is no thread's ─▶ thread_not_found

Every chat.postMessage request is kept in `seen`, and every method's requests counted in `calls`. Also a
process of its own, for the chaos harness to kill:
`python -m demo.slack_api --port P --journal FILE --token T --channels C1,C2` keeps its messages in FILE
(JSON, rewritten after every post) and starts from it; without `--journal` it keeps them in memory.
`--script-file F`: each post takes its step from the first line of F while F holds one (demo.steps), so
another process can script the faults.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import signal
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from demo import steps

TEXT_LIMIT = 40_000


@dataclass
class Bucket:
    """A token bucket: `rate` a second, holding at most `burst`."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> float:
        """0 when a token was taken; else the seconds until one is there."""
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass(frozen=True)
class Seen:
    """One chat.postMessage request as it arrived (`at`: time.monotonic() then) and the step it took."""

    body: dict[str, Any]
    step: str
    at: float


@dataclass
class SlackApi:
    """Slack's Web API for the tokens in `tokens`, the channels in `channels` (the bot a member of each)."""

    tokens: Iterable[str] = ("xoxb-local-test-token",)
    channels: Iterable[str] = ("C0000000001",)
    script: Iterable[str] = ()
    # chat.postMessage's pace in one channel (Slack's one a second and a short burst) and in the workspace
    channel_rate: float = 1.0
    channel_burst: float = 3.0
    workspace_rate: float | None = None
    workspace_burst: float = 10.0
    journal: Path | None = None
    script_file: Path | None = None
    port: int = 0
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.valid = set(self.tokens)
        self.revoked: set[str] = set()
        self.archived: set[str] = set()
        self.not_member: set[str] = set()
        self.steps: deque[str] = deque(self.script)
        for channel in self.channels:
            self.messages.setdefault(channel, [])
        self.refused = 0  # 429s answered
        self.calls: Counter[str] = Counter()  # each method's requests
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._buckets: dict[str, Bucket] = {}
        self._workspace = Bucket(self.workspace_rate, self.workspace_burst) if self.workspace_rate else None
        self._last_ts = 0.0
        self._server = _Server(("127.0.0.1", self.port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="slack-api", daemon=True)

    @property
    def url(self) -> str:
        """The base URL a client is given (slack_sdk's `base_url`)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/"

    def start(self) -> SlackApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def posted(self) -> list[dict[str, Any]]:
        """Every message stored, in every channel, in the order posted."""
        with self._lock:
            return sorted((m for found in self.messages.values() for m in found), key=lambda m: m["ts"])

    def next_step(self) -> str:
        with self._lock:
            if self.steps:
                return self.steps.popleft()
            return steps.take(self.script_file) or "ok"

    def refusal(self, token: str | None) -> str | None:
        if token is None:
            return "not_authed"
        if token in self.revoked:
            return "token_revoked"
        return None if token in self.valid else "invalid_auth"

    def wait_for(self, channel: str) -> float:
        """0 when chat.postMessage may post in `channel` now (tokens taken); else the seconds to wait."""
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.setdefault(channel, Bucket(self.channel_rate, self.channel_burst))
            wait = bucket.take(now)
            if wait == 0 and self._workspace is not None:
                wait = self._workspace.take(now)
                if wait > 0:
                    bucket.tokens += 1  # the channel's token is given back
            if wait > 0:
                self.refused += 1
            return wait

    def check(self, body: dict[str, Any]) -> str | None:
        """The error Slack answers for this message, or None."""
        channel = body.get("channel")
        if channel not in self.messages:
            return "channel_not_found"
        if channel in self.archived:
            return "is_archived"
        if channel in self.not_member:
            return "not_in_channel"
        text, blocks = body.get("text"), body.get("blocks")
        if not text and not blocks:
            return "no_text"
        if isinstance(text, str) and len(text) > TEXT_LIMIT:
            return "msg_too_long"
        thread_ts = body.get("thread_ts")
        if thread_ts is not None and not any(m["ts"] == thread_ts for m in self.messages[channel]):
            return "thread_not_found"
        return None

    def store(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            ts = max(time.time(), self._last_ts + 0.000001)
            self._last_ts = ts
            message: dict[str, Any] = {
                "type": "message",
                "bot_id": "B0000000001",
                "text": body.get("text", ""),
                "ts": f"{ts:.6f}",
                "channel": body["channel"],
            }
            if body.get("thread_ts") is not None:
                message["thread_ts"] = str(body["thread_ts"])
            for optional in ("blocks", "metadata"):
                if body.get(optional) is not None:
                    message[optional] = _json_field(body[optional])
            self.messages[body["channel"]].append(message)
            if self.journal is not None:
                partial = self.journal.with_name(self.journal.name + ".partial")
                partial.write_text(json.dumps(self.messages))
                os.replace(partial, self.journal)
            return message

    def listing(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        """conversations.history or conversations.replies, as Slack pages them."""
        channel = args.get("channel")
        with self._lock:
            if channel not in self.messages:
                return {"ok": False, "error": "channel_not_found"}
            found = list(self.messages[channel])
        if method == "conversations.replies":
            parent = args.get("ts")
            found = [m for m in found if m["ts"] == parent or m.get("thread_ts") == parent]
            if not any(m["ts"] == parent for m in found):
                return {"ok": False, "error": "thread_not_found"}
        else:
            found = [m for m in found if m.get("thread_ts") in (None, m["ts"])]
            found.reverse()  # newest first
        oldest, latest = float(args.get("oldest") or 0), float(args.get("latest") or math.inf)
        inclusive = str(args.get("inclusive", "0")) in ("1", "true")
        found = [
            m for m in found
            if (oldest <= float(m["ts"]) if inclusive else oldest < float(m["ts"]))
            and (float(m["ts"]) <= latest if inclusive else float(m["ts"]) < latest)
        ]  # fmt: skip
        if str(args.get("include_all_metadata", "0")) not in ("1", "true"):
            found = [{k: v for k, v in m.items() if k != "metadata"} for m in found]
        start = int(base64.b64decode(args["cursor"]).decode()) if args.get("cursor") else 0
        limit = min(max(int(args.get("limit") or 100), 1), 999)
        page = found[start : start + limit]
        more = start + limit < len(found)
        cursor = base64.b64encode(str(start + limit).encode()).decode() if more else ""
        return {"ok": True, "messages": page, "has_more": more, "response_metadata": {"next_cursor": cursor}}


def _json_field(value: Any) -> Any:
    """A field a form body carries as JSON text (blocks, metadata), as Slack reads it."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


class _Server(ThreadingHTTPServer):
    # the connections a drain opens at once (64 and more) wait to be accepted: with the default backlog of 5
    # the rest lose their SYN and connect seconds later, or time out
    request_queue_size = 128


def _handler(api: SlackApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def finish(self) -> None:  # a reset connection cannot be flushed
            with contextlib.suppress(OSError, ValueError):
                super().finish()

        def do_GET(self) -> None:
            self._call({})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            kind = (self.headers.get("content-type") or "").split(";")[0].strip()
            if kind == "application/json":
                body = json.loads(raw or b"{}")
            else:
                body = {name: value for name, value in parse_qsl(raw.decode())}
            self._call(body if isinstance(body, dict) else {})

        def _call(self, body: dict[str, Any]) -> None:
            parts = urlsplit(self.path)
            args = {**dict(parse_qsl(parts.query)), **body}
            method = parts.path.removeprefix("/api/")
            api.calls[method] += 1
            authorization = self.headers.get("authorization") or ""
            token = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else None
            token = token or args.pop("token", None)
            refused = api.refusal(token)
            if refused is not None:
                self._json(200, {"ok": False, "error": refused})
            elif method == "chat.postMessage":
                self._post(args)
            elif method in ("conversations.history", "conversations.replies"):
                self._json(200, api.listing(method, args))
            else:
                self._json(200, {"ok": False, "error": "unknown_method"})

        def _post(self, body: dict[str, Any]) -> None:
            error = api.check(body)
            if error is not None:
                api.seen.append(Seen(body, f"error {error}", time.monotonic()))
                self._json(200, {"ok": False, "error": error})
                return
            wait = api.wait_for(str(body["channel"]))
            if wait > 0:
                api.seen.append(Seen(body, "ratelimited", time.monotonic()))
                self._json(429, {"ok": False, "error": "ratelimited"}, retry_after=str(max(1, math.ceil(wait))))
                return
            step = api.next_step()
            api.seen.append(Seen(body, step, time.monotonic()))
            code, _, value = step.partition(" ")
            if code in ("ok", "kept-reset", "kept-502", "kept-stall"):
                message = api.store(body)
                if code == "ok":
                    answer = {"ok": True, "channel": message["channel"], "ts": message["ts"], "message": message}
                    self._json(200, answer)
                elif code == "kept-reset":
                    self._reset()
                elif code == "kept-502":
                    self._html(502)
                else:
                    api.released.wait(60)
                    self.close_connection = True
            elif code == "reset":
                self._reset()
            elif code == "429":
                self._json(429, {"ok": False, "error": "ratelimited"}, retry_after=value or "1")
            elif code == "error":
                self._json(200, {"ok": False, "error": value})
            else:
                self._html(int(code))

        def _json(self, status: int, answer: dict[str, Any], *, retry_after: str | None = None) -> None:
            content = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json; charset=utf-8")
            self.send_header("content-length", str(len(content)))
            self.send_header("x-slack-req-id", f"local-{time.monotonic_ns()}")
            if retry_after is not None:
                self.send_header("retry-after", retry_after)
            self.end_headers()
            self.wfile.write(content)

        def _html(self, status: int) -> None:
            content = f"<html><body><h1>{status}</h1></body></html>".encode()
            self.send_response(status)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def _reset(self) -> None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

    return Handler


def messages_of(journal: Path) -> dict[str, list[dict[str, Any]]]:
    """The messages a journal holds, by channel (none when it does not exist)."""
    if not journal.exists():
        return {}
    found: dict[str, list[dict[str, Any]]] = json.loads(journal.read_text())
    return found


def main() -> None:
    """A Slack Web API process that starts from its journal, as Slack's store would."""
    parser = argparse.ArgumentParser(description="a local Slack Web API that keeps a journal")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--journal", type=Path, help="where the messages are kept (none: in memory only)")
    parser.add_argument("--token", action="append", required=True)
    parser.add_argument("--channels", required=True, help="channel IDs, separated by commas")
    parser.add_argument("--channel-rate", type=float, default=1.0, help="chat.postMessage a second per channel")
    parser.add_argument("--port-file", type=Path, help="written with the port once listening (with --port 0)")
    parser.add_argument("--script-file", type=Path, help="each post's step: the first line of this file (taken)")
    arguments = parser.parse_args()
    api = SlackApi(
        tokens=arguments.token,
        channels=arguments.channels.split(","),
        channel_rate=arguments.channel_rate,
        channel_burst=max(3.0, arguments.channel_rate),
        journal=arguments.journal,
        script_file=arguments.script_file,
        port=arguments.port,
        messages=messages_of(arguments.journal) if arguments.journal else {},
    )
    api.start()
    if arguments.port_file is not None:
        arguments.port_file.write_text(api.url.split(":")[2].split("/")[0])
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()
    api.stop()


if __name__ == "__main__":
    main()
