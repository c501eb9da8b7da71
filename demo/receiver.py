"""Webhook receivers for the demo and the tests: real HTTP servers on free 127.0.0.1 ports, each in a thread
of its own. The demo's verifies, deduplicates and fails a share of the first deliveries; the tests script
every answer.

    POST ──▶ the next step of the receiver's script (none left: "ok") ──▶ every request kept in `seen`
             (with `first_deliveries_only`, only a webhook-id's first delivery takes a step: a retry is "ok";
             while `refusing` holds a step, or the `refuse_file` exists, every request takes that step and
             the script waits)
        "ok"         verify the signature (401 if it fails), keep one effect per webhook-id, 200 {"id": "rcv_<n>"}
                     (a duplicate gets the first delivery's id and no second effect)
        "kept-reset" as "ok", then reset the connection instead of answering (the answer is lost)
        "kept-stall" as "ok", then answer nothing until the receiver stops (longer than any request bound)
        "500", "410", "401"   that status, no effect
        "429 <v>", "503 <v>"  that status with `Retry-After: <v>` (no <v>: no Retry-After), no effect
        "302", "307"          a redirect to `redirect_to` (another receiver), no effect
        "reset"      read the body, then reset the connection (SO_LINGER 0, close): no answer, no effect
        "stall"      read the body, answer nothing until the receiver stops: no effect

Also a process of its own, for the chaos harness to kill: `python -m demo.receiver --port P
--secret S --journal FILE [--refuse-file R]` runs an "ok" receiver that starts from FILE when it exists
and rewrites it (JSON: webhook-id -> body, deliveries, receiver id) when it starts and after every delivery;
while R exists, every request takes the step R holds (`429 2`: the harness's receiver that throttles).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from standardwebhooks import Webhook


@dataclass
class Effect:
    """What one webhook-id did at the receiver: its first body, how often it was delivered, the id answered."""

    body: bytes
    deliveries: int
    receiver_id: str


@dataclass(frozen=True)
class Seen:
    """One request as it arrived (`at`: time.monotonic() then), whatever the step did with it."""

    path: str
    headers: dict[str, str]
    body: bytes
    step: str
    at: float


class Receiver:
    def __init__(
        self,
        secret: str,
        script: Iterable[str] = (),
        *,
        redirect_to: str | None = None,
        journal: Path | None = None,
        port: int = 0,
        first_deliveries_only: bool = False,
        refuse_file: Path | None = None,
    ) -> None:
        self.secret = secret
        self.script: deque[str] = deque(script)
        self.refusing: str | None = None
        self.refuse_file = refuse_file
        self.first_deliveries_only = first_deliveries_only
        self._tried: set[str] = set()
        self.redirect_to = redirect_to
        self.journal = journal
        self.effects: dict[str, Effect] = {}
        self.seen: list[Seen] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks?token=query-secret"

    def start(self) -> Receiver:
        if self.journal is not None:
            with self._lock:
                self._write_journal()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()  # the stalled requests end
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def next_step(self, msg_id: str | None) -> str:
        """What to do with a delivery of `msg_id` (its webhook-id header, if it has one)."""
        with self._lock:
            refusing = self.refusing or self._refusal()
            if refusing:
                return refusing
            if self.first_deliveries_only and msg_id is not None:
                if msg_id in self._tried:
                    return "ok"
                self._tried.add(msg_id)
            return self.script.popleft() if self.script else "ok"

    def _refusal(self) -> str | None:
        """The step the refuse file holds, while it exists."""
        if self.refuse_file is None:
            return None
        try:
            return self.refuse_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def deliveries(self) -> dict[str, int]:
        with self._lock:
            return {msg_id: effect.deliveries for msg_id, effect in self.effects.items()}

    def keep(self, msg_id: str, body: bytes) -> str:
        """Keep the delivery's effect once; the receiver's id of it."""
        with self._lock:
            effect = self.effects.get(msg_id)
            if effect is None:
                effect = self.effects[msg_id] = Effect(body, 0, f"rcv_{len(self.effects) + 1}")
            effect.deliveries += 1
            if self.journal is not None:
                self._write_journal()
            return effect.receiver_id

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def _write_journal(self) -> None:
        assert self.journal is not None
        shown = {
            msg_id: {"body": e.body.decode(), "deliveries": e.deliveries, "receiver_id": e.receiver_id}
            for msg_id, e in self.effects.items()
        }
        partial = self.journal.with_name(self.journal.name + ".partial")
        partial.write_text(json.dumps(shown))
        os.replace(partial, self.journal)


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def finish(self) -> None:  # a reset connection cannot be flushed
            with contextlib.suppress(OSError, ValueError):
                super().finish()

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            at = time.monotonic()
            step = receiver.next_step(self.headers.get("webhook-id"))
            headers = {name.lower(): value for name, value in self.headers.items()}
            receiver.record(Seen(self.path, headers, body, step, at))
            code, _, value = step.partition(" ")
            if code in ("ok", "kept-reset", "kept-stall"):
                try:
                    Webhook(receiver.secret).verify(body, headers)
                except Exception:  # any malformed header or signature: refused
                    self._answer(401, b'{"error": "bad signature"}')
                    return
                receiver_id = receiver.keep(headers["webhook-id"], body)
                if code == "ok":
                    self._answer(200, json.dumps({"id": receiver_id}).encode())
                    return
            if code in ("reset", "kept-reset"):
                self._reset()
            elif code in ("stall", "kept-stall"):
                receiver.released.wait(60)
                self.close_connection = True
            elif code in ("302", "307"):
                self._answer(int(code), b"", location=receiver.redirect_to)
            elif code in ("429", "503"):
                self._answer(int(code), b"", retry_after=value or None)
            else:
                self._answer(int(code), b"{}")

        def _answer(
            self, status: int, content: bytes, *, location: str | None = None, retry_after: str | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(content)))
            if location is not None:
                self.send_header("location", location)
            if retry_after is not None:
                self.send_header("retry-after", retry_after)
            self.end_headers()
            self.wfile.write(content)

        def _reset(self) -> None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

    return Handler


def effects_of(journal: Path) -> dict[str, Effect]:
    """The effects a journal holds (none when it does not exist)."""
    if not journal.exists():
        return {}
    kept = json.loads(journal.read_text())
    return {
        msg_id: Effect(entry["body"].encode(), int(entry["deliveries"]), str(entry["receiver_id"]))
        for msg_id, entry in kept.items()
    }


def main() -> None:
    """A receiver process that starts from its journal, as a receiver's store would: a webhook delivered
    before a kill and sent again after it is a second delivery, not a second effect."""
    parser = argparse.ArgumentParser(description="a deduplicating webhook receiver that keeps a journal")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--refuse-file", type=Path, help="while it exists, every request takes the step it holds")
    arguments = parser.parse_args()
    receiver = Receiver(
        arguments.secret, journal=arguments.journal, port=arguments.port, refuse_file=arguments.refuse_file
    )
    receiver.effects.update(effects_of(arguments.journal))
    receiver.start()
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()
    receiver.stop()


if __name__ == "__main__":
    main()
