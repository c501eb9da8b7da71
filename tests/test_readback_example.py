"""The read-back adapter of docs/executor.md, as written, against a real partner API over HTTP.

The receiver keeps every POST it reads and the deliveries it stored, and can lose its answer (the delivery
stored or not) or fail its read-back. The adapter runs in a process of its own, as an application's would
(its kind registered there), through `outbox.testing.drain`. Each case checks the action's end and how many
deliveries the receiver holds: never two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from tests.test_docs import example

DRIVER = """
import asyncio
import os
import sys

import outbox
from sqlalchemy import text

from outbox.db import async_engine, sync_engine
from outbox.testing import drain, install_kinds
from partner_example import PARTNER_DELIVERY, adapters

url = os.environ["OUTBOX_DATABASE_URL"]
engine = sync_engine(url)
with engine.begin() as conn:
    install_kinds(conn, [PARTNER_DELIVERY])
    outbox.enqueue(
        conn,
        outbox.ActionRequest(kind=PARTNER_DELIVERY, lane_key="hook", idempotency_key=sys.argv[1], payload={"n": 1}),
    )
    if sys.argv[2] == "written-before":  # an earlier attempt fenced, then its process died
        conn.execute(
            text("UPDATE agent_action SET write_started_at = now() WHERE idempotency_key = :k"),
            {"k": sys.argv[1]},
        )
engine.dispose()


async def main() -> None:
    aengine = async_engine(url)
    await drain(aengine, adapters(aengine))
    await aengine.dispose()


asyncio.run(main())
"""


@dataclass
class Receiver:
    """What the receiver holds, and the faults it plays next."""

    url: str = ""
    posts: list[str] = field(default_factory=list)
    stored: dict[str, int] = field(default_factory=dict)
    # answers to lose: "stored" keeps the delivery and drops the answer, "not-stored" drops both
    lose_answers: list[str] = field(default_factory=list)
    read_back_fails: bool = False


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    held = Receiver()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                held.posts.append(body["key"])
                lost = held.lose_answers.pop(0) if held.lose_answers else None
                if lost != "not-stored":
                    held.stored.setdefault(body["key"], len(held.stored) + 1)
                delivery = held.stored.get(body["key"])
            if lost is not None:
                self.close_connection = True  # no answer: the client cannot tell what happened
                return
            self.reply(201, {"id": delivery})

        def do_GET(self) -> None:
            key = self.path.rsplit("/", 1)[-1]
            with lock:
                fails, delivery = held.read_back_fails, held.stored.get(key)
            if fails:
                self.reply(503, {"error": "unavailable"})
            elif delivery is None:
                self.reply(404, {"error": "no such delivery"})
            else:
                self.reply(200, {"id": delivery})

        def reply(self, status: int, body: dict[str, object]) -> None:
            encoded = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(encoded)))
            self.end_headers()
            self.wfile.write(encoded)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    held.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield held
    server.shutdown()
    server.server_close()


@pytest.fixture
def app_folder(tmp_path: Path) -> Path:
    code, _ = example("readback-adapter")
    (tmp_path / "partner_example.py").write_text(code)
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    return tmp_path


def deliver(folder: Path, database_url: str, receiver: Receiver, key: str, history: str = "fresh") -> None:
    env = {**os.environ, "OUTBOX_DATABASE_URL": database_url, "PARTNER_API_URL": receiver.url}
    done = subprocess.run(
        [sys.executable, "driver.py", key, history], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def ended(engine: Engine, key: str) -> tuple[str, str | None, int, str | None]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, stop_reason, attempt, readback_ref FROM agent_action WHERE idempotency_key = :k"),
            {"k": key},
        ).one()
    return row.state, row.stop_reason, row.attempt, row.readback_ref


def test_an_answer_lost_after_the_delivery_is_read_back_and_not_sent_again(
    app_folder: Path, database_url: str, engine: Engine, receiver: Receiver
) -> None:
    receiver.lose_answers = ["stored"]
    deliver(app_folder, database_url, receiver, "lost-answer")
    assert receiver.posts == ["lost-answer"]
    assert ended(engine, "lost-answer") == ("DONE", "CONFIRMED", 1, "1")


def test_an_answer_lost_before_the_delivery_is_proved_absent_then_sent_once_more(
    app_folder: Path, database_url: str, engine: Engine, receiver: Receiver
) -> None:
    receiver.lose_answers = ["not-stored"]
    deliver(app_folder, database_url, receiver, "lost-request")
    assert receiver.posts == ["lost-request", "lost-request"]
    assert list(receiver.stored) == ["lost-request"]
    assert ended(engine, "lost-request") == ("DONE", "CONFIRMED", 2, "1")


def test_a_receiver_that_cannot_tell_ends_the_action_uncertain(
    app_folder: Path, database_url: str, engine: Engine, receiver: Receiver
) -> None:
    receiver.lose_answers = ["stored"]
    receiver.read_back_fails = True
    deliver(app_folder, database_url, receiver, "cannot-tell")
    assert receiver.posts == ["cannot-tell"]
    state, reason, attempt, _ = ended(engine, "cannot-tell")
    assert (state, reason, attempt) == ("UNCERTAIN", "PROVIDER_UNCERTAIN", 1)


def test_an_earlier_attempts_delivery_is_found_before_anything_is_sent(
    app_folder: Path, database_url: str, engine: Engine, receiver: Receiver
) -> None:
    receiver.stored["written-before"] = 7  # the earlier attempt's POST arrived before its process died
    deliver(app_folder, database_url, receiver, "written-before", history="written-before")
    assert receiver.posts == []
    assert ended(engine, "written-before") == ("DONE", "CONFIRMED", 1, "7")
