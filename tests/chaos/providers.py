"""The providers of a chaos run's WEBHOOK and NATS_EVENT actions, and what they hold once the run is over.

    executor ─▶ OUTBOX_NATS_URL ───────────────────────▶ nats-server (JetStream, a store of the run's own)
                                                          stream ACCOUNTS: accounts.>, limits, file storage,
                                                          a duplicate window shorter than the lease
    executor ─▶ ACCOUNTS_ALERTS_WEBHOOK_URL ─▶ NetRelay ─▶ receiver process (demo.receiver) ─▶ its journal

The runner kills and restarts the nats-server (same port and store) and the receiver process (same port and
journal), cuts or blackholes the relay, and makes the receiver throttle for a while (it answers every
request with a 429 or a 503 while its refuse file exists); the checks read the whole stream, message by
message, and the receiver's journal (webhook-id -> body, deliveries, receiver id).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from nats.js.errors import NotFoundError

from demo.nats import NatsServer, free_port
from examples.accounts.events import STREAM, STREAM_SUBJECTS
from outbox.nats.client import connect
from outbox.nats.message import MSG_ID_HEADER
from outbox.nats.settings import NatsConfig
from outbox.nats.streams import StreamSpec, ensure_stream
from tests.chaos.netrelay import NetRelay

ROOT = Path(__file__).resolve().parents[2]
READY_SECONDS = 20.0
# nanoseconds, as JetStream writes a message's time, cut to the microseconds Python reads
_FRACTION = re.compile(r"(\.\d{6})\d*")


@dataclass(frozen=True)
class StreamMessage:
    seq: int
    subject: str
    msg_id: str | None
    at: float  # epoch seconds: when the server stored it


class Providers:
    """The run's nats-server and stream, and its webhook receiver behind a relay."""

    def __init__(self, work_dir: Path, seed: int, duplicate_window: float) -> None:
        self.nats = NatsServer()
        self.duplicate_window = duplicate_window
        spec = StreamSpec(STREAM, STREAM_SUBJECTS, duplicate_window_seconds=duplicate_window)
        asyncio.run(ensure_stream(self._config(), spec))
        key = random.Random(seed * 31 + 5).randbytes(32)
        self.secret = "whsec_" + base64.b64encode(key).decode()
        self.receiver_port = free_port()
        self.journal = work_dir / "receiver.json"
        self.refuse_file = work_dir / "receiver-refuses"
        self._log = work_dir / "receiver.log"
        self.receiver: subprocess.Popen[bytes] | None = None
        self.start_receiver()
        self.relay = NetRelay("127.0.0.1", self.receiver_port)

    def env(self) -> dict[str, str]:
        """What an executor process needs to reach both providers."""
        return {
            "OUTBOX_NATS_URL": self.nats.url,
            "ACCOUNTS_ALERTS_WEBHOOK_URL": f"http://127.0.0.1:{self.relay.port}/outbox/alerts",
            "OUTBOX_WEBHOOK_SECRET_ALERTS": self.secret,
        }

    def _config(self) -> NatsConfig:
        return NatsConfig(servers=(self.nats.url,))

    # ---- the receiver process ----

    def receiver_running(self) -> bool:
        return self.receiver is not None and self.receiver.poll() is None

    def start_receiver(self) -> None:
        """Start the receiver (same port, same journal) and wait until it accepts connections."""
        args = ["--port", str(self.receiver_port), "--secret", self.secret, "--journal", str(self.journal)]
        args += ["--refuse-file", str(self.refuse_file)]
        with open(self._log, "ab") as log:
            self.receiver = subprocess.Popen(
                [sys.executable, "-m", "demo.receiver", *args], cwd=ROOT, stdout=log, stderr=log
            )
        deadline = time.monotonic() + READY_SECONDS
        while not _accepts(self.receiver_port):
            if self.receiver.poll() is not None:
                raise RuntimeError(f"the webhook receiver exited with {self.receiver.returncode}: see {self._log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the webhook receiver did not listen within {READY_SECONDS:g} s")
            time.sleep(0.02)

    def kill_receiver(self) -> None:
        """SIGKILL by PID: what it had journaled stays, what it was answering is lost."""
        if self.receiver is not None and self.receiver.poll() is None:
            self.receiver.send_signal(signal.SIGKILL)
            self.receiver.wait(10)

    def throttling(self) -> bool:
        return self.refuse_file.exists()

    def throttle(self, step: str) -> None:
        """From now on the receiver answers every request with `step` (`429 2`, `503`), taking nothing."""
        partial = self.refuse_file.with_name(self.refuse_file.name + ".partial")
        partial.write_text(step)
        os.replace(partial, self.refuse_file)

    def end_throttling(self) -> None:
        self.refuse_file.unlink(missing_ok=True)

    def close(self) -> None:
        self.relay.close()
        if self.receiver is not None and self.receiver.poll() is None:
            self.receiver.send_signal(signal.SIGTERM)
            try:
                self.receiver.wait(10)
            except subprocess.TimeoutExpired:
                self.kill_receiver()
        self.nats.stop()

    # ---- what they hold ----

    def effects(self) -> dict[str, dict[str, Any]]:
        """The receiver's journal: webhook-id -> body, deliveries, receiver id."""
        if not self.journal.exists():
            return {}
        kept: dict[str, dict[str, Any]] = json.loads(self.journal.read_text())
        return kept

    def stream_messages(self) -> list[StreamMessage]:
        """Every message the stream holds, read one sequence at a time from its first to its last."""
        return asyncio.run(self._read_stream())

    async def _read_stream(self) -> list[StreamMessage]:
        client = await connect(self._config())
        try:
            state = (await client.js.stream_info(STREAM)).state
            messages = []
            for seq in range(state.first_seq, state.last_seq + 1):
                try:
                    raw = await client.js.get_msg(STREAM, seq)
                except NotFoundError:  # deleted: a limits stream without limits deletes nothing
                    continue
                msg_id = (raw.headers or {}).get(MSG_ID_HEADER)
                messages.append(StreamMessage(seq, raw.subject or "", msg_id, _stored_at(raw.time)))
            return messages
        finally:
            await client.drop()


def _stored_at(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    text = _FRACTION.sub(r"\1", str(value)).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
