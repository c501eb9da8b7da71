"""Nothing outbox starts logs a URL's query or the secret of a URL's user information: every log line of a real
run, read whole.

One alert of the example application becomes an email (through an SMTP relay that wants a password), a
webhook (to a local receiver at a URL whose query holds a token) and a NATS event (to a server named by a URL
whose user information is a token). `outbox nats ensure-stream` and `outbox run` run as subprocesses at
DEBUG and at INFO; a drain flow run, in a subprocess of its own as a worker starts one, runs at DEBUG with
httpx, httpcore, aiosmtplib and nats among the loggers Prefect ships to its server. Each carries the three
actions out (the receiver saw the token in the query it was sent), then every line of its stdout and stderr,
and of the run's logs on the Prefect server, is searched for each secret: none is there, and httpx's line for
the webhook's request is there with its query as ***.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from demo.nats import NatsServer
from demo.receiver import Receiver
from demo.sink import SmtpSink
from examples.accounts import events, notices, schema, webhooks
from outbox.email import enqueue_email
from outbox.nats import enqueue_event
from outbox.webhook import enqueue_webhook
from tests.prefect_server import PrefectServer

ROOT = Path(__file__).resolve().parent.parent
OUTBOX = Path(sys.executable).parent / "outbox"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
QUERY_TOKEN = "qtok-7Hq2Lr9Wm"
SMTP_PASSWORD = "smtp-pw-Vd83Kx"
NATS_TOKEN = "ntok-Jp5Tz1Qc"
SECRETS = (QUERY_TOKEN, SMTP_PASSWORD, NATS_TOKEN)
ALERT = {"workspace_id": 10, "alert_id": 100}


@pytest.fixture
def relay() -> Iterator[SmtpSink]:
    server = SmtpSink(credentials=("outbox", SMTP_PASSWORD)).start()
    yield server
    server.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(WEBHOOK_SECRET).start()
    yield server
    server.stop()


@pytest.fixture
def app(engine: Engine) -> Engine:
    """Workspace 10 with one admin, alert 100 enqueued as an email, a webhook and a NATS event."""
    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(
            text("""
            INSERT INTO app_account VALUES (1, 'Alice', 'alice@example.com', true);
            INSERT INTO app_workspace VALUES (10, 'Research');
            INSERT INTO app_membership VALUES (10, 1, 'admin');
            INSERT INTO app_alert VALUES (100, 10, 'Disk full', 'The disk is full.');
            """)
        )
        enqueue_email(conn, notices.WORKSPACE_ALERT, ALERT)
        enqueue_webhook(conn, webhooks.ALERT_RAISED, ALERT)
        enqueue_event(conn, events.ALERT_EVENT, ALERT)
    return engine


def environment(
    database_url: str, relay: SmtpSink, receiver: Receiver, nats_server: NatsServer, level: str
) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_LOG_LEVEL": level,
        "OUTBOX_SMTP_PORT": str(relay.port),
        "OUTBOX_SMTP_SENDER": "outbox@example.com",
        "OUTBOX_SMTP_USERNAME": "outbox",
        "OUTBOX_SMTP_PASSWORD": SMTP_PASSWORD,
        "OUTBOX_SMTP_TIMEOUT_SECONDS": "10",
        "ACCOUNTS_ALERTS_WEBHOOK_URL": f"http://127.0.0.1:{receiver.port}/hooks?token={QUERY_TOKEN}",
        "OUTBOX_WEBHOOK_SECRET_ALERTS": WEBHOOK_SECRET,
        "OUTBOX_NATS_URL": f"nats://{NATS_TOKEN}@127.0.0.1:{nats_server.port}",
    }


def run(command: list[str], env: dict[str, str]) -> str:
    """`command` to its end: its stdout and stderr, every line of both."""
    ran = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran.stdout + ran.stderr


def ensure_stream(env: dict[str, str]) -> str:
    subjects = [option for subject in events.STREAM_SUBJECTS for option in ("--subject", subject)]
    return run([str(OUTBOX), "nats", "ensure-stream", "--stream", events.STREAM, *subjects], env)


def carried_out(engine: Engine, relay: SmtpSink, receiver: Receiver) -> None:
    """The three actions ended DONE; the relay took the email and the receiver the webhook at the URL with
    its token."""
    with engine.connect() as conn:
        ended = conn.execute(text("SELECT kind, state FROM agent_action ORDER BY kind")).all()
    assert [tuple(row) for row in ended] == [("EMAIL", "DONE"), ("NATS_EVENT", "DONE"), ("WEBHOOK", "DONE")]
    assert len(relay.received) == 1
    assert [seen.path for seen in receiver.seen] == [f"/hooks?token={QUERY_TOKEN}"]


def shows_no_secret(log: str) -> None:
    for secret in SECRETS:
        found = [line for line in log.splitlines() if secret in line]
        assert not found, f"{secret} is written in:\n" + "\n".join(found)


def webhook_request_line(receiver: Receiver) -> str:
    """httpx's own line for the webhook's request, as it reaches a log: the query as ***."""
    return f'HTTP Request: POST http://127.0.0.1:{receiver.port}/hooks?*** "HTTP/1.1 200 OK"'


@pytest.mark.parametrize("level", ["DEBUG", "INFO"])
def test_outbox_run_logs_no_secret_of_a_url(
    app: Engine, database_url: str, relay: SmtpSink, receiver: Receiver, nats_server: NatsServer, level: str
) -> None:
    env = environment(database_url, relay, receiver, nats_server, level)
    log = ensure_stream(env)
    log += run([str(OUTBOX), "run", "--adapters", "examples.accounts:all_adapters", "--max-actions", "3"], env)
    carried_out(app, relay, receiver)
    shows_no_secret(log)
    assert webhook_request_line(receiver) in log, log
    if level == "DEBUG":
        assert "DEBUG httpcore" in log, log  # the libraries' DEBUG lines were there to read


DRAIN_RUN = """
import asyncio, sys
from flows.drain import drain

state = asyncio.run(drain(max_seconds=60, max_actions=3, adapters="examples.accounts:all_adapters", return_state=True))
print("drain-run-ended", state.state_details.flow_run_id, state.type.value)
"""


def run_log_lines(prefect: PrefectServer, flow_run_id: str) -> list[dict[str, Any]]:
    """Every log line of the flow run on the Prefect server."""
    lines: list[dict[str, Any]] = []
    while True:
        page = prefect.post(
            "/logs/filter",
            {
                "logs": {"flow_run_id": {"any_": [flow_run_id]}},
                "offset": len(lines),
                "limit": 200,
                "sort": "TIMESTAMP_ASC",
            },
        )
        lines += page
        if len(page) < 200:
            return lines


def test_a_drain_run_logs_no_secret_of_a_url_here_or_on_the_prefect_server(
    app: Engine,
    database_url: str,
    relay: SmtpSink,
    receiver: Receiver,
    nats_server: NatsServer,
    prefect_server: PrefectServer,
) -> None:
    env = {
        **prefect_server.env(),
        **environment(database_url, relay, receiver, nats_server, "DEBUG"),
        "PREFECT_API_URL": f"{prefect_server.url}/api",
        "PREFECT_HOME": str(prefect_server.home),
        "PREFECT_LOGGING_LEVEL": "DEBUG",
        "PREFECT_LOGGING_ROOT_LEVEL": "DEBUG",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "httpx,httpcore,aiosmtplib,nats",
    }
    log = ensure_stream(env)
    log += run([sys.executable, "-c", DRAIN_RUN], env)
    carried_out(app, relay, receiver)
    flow_run_id, final = log.rsplit("drain-run-ended ", 1)[1].split()[:2]
    assert final == "COMPLETED", log
    shipped = run_log_lines(prefect_server, flow_run_id)
    shown = "\n".join(line["message"] for line in shipped)
    shows_no_secret("\n".join(json.dumps(line) for line in shipped))  # every field of every line
    assert webhook_request_line(receiver) in shown, shown  # httpx's line reached the Prefect server, hidden
    shows_no_secret(log)
