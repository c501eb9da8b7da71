"""The physical reference for an effect: the same client making the same calls at the same concurrency, with no
outbox; and the local receivers both talk to.

    python -m bench.bare_loops receiver --port-file F    an HTTP/1.1 keep-alive receiver on a free 127.0.0.1 port:
                                                         every POST read whole, answered 200 {"id": "rcv_<n>"}
    python -m bench.bare_loops smtp-sink --port-file F   an SMTP sink (aiosmtpd) on a free 127.0.0.1 port: every
                                                         message taken whole and answered 250, nothing kept
    python -m bench.bare_loops webhook --url U --count N [--concurrency 64] [--secret S]
        N webhooks as the WEBHOOK kind sends them (compact JSON body, a `msg_` webhook-id, Standard Webhooks
        signature, the same headers), signed by standardwebhooks and posted by one httpx.AsyncClient from
        `concurrency` tasks; prints {"cpu_seconds", "seconds", "count"}: the process's own CPU (utime + stime,
        as /proc counts it) and wall time over the loop alone, after imports and the client's creation
    python -m bench.bare_loops email --port P --count N [--concurrency 64]
        N verify-address emails as examples.accounts writes them (the same sender, recipient, subject, text and
        Message-ID; Date now), each an EmailMessage of the mail library's default policy sent by
        aiosmtplib.send on a connection of its own (connect, EHLO, MAIL, RCPT, DATA, QUIT), as the EMAIL
        adapter sends one, from `concurrency` tasks; prints the same figures
    python -m bench.bare_loops nats --url U --count N [--start S] [--concurrency 64]
        N workspace alerts as examples.accounts.events publishes them (subject accounts.alerts.<id>, the same
        JSON body, Nats-Msg-Id <id> and Nats-Expected-Stream ACCOUNTS), published by one nats-py JetStream
        context from `concurrency` tasks, each awaiting its PubAck; alert ids START+1 to START+N; the same

Every loop prints `started` and `ended` (time.time()) beside its figures, so that loops run as several processes
at once can be taken together; `--at T` (before the command) starts the loop at the wall-clock time T. The
receiver and the sink answer as fast as asyncio parses: what they cost is their own process's, never the client's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import resource
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path


class _Answering(asyncio.Protocol):
    """One keep-alive connection: read a request's head and its Content-Length body, answer 200, repeat."""

    served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = 0
            for line in self._buffer[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self._buffer) < end:
                return
            self._buffer = self._buffer[end:]
            _Answering.served += 1
            answer = b'{"id": "rcv_%d"}' % _Answering.served
            self._transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(answer), answer)
            )


async def receive(port_file: Path) -> None:
    server = await asyncio.get_running_loop().create_server(_Answering, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    await asyncio.to_thread(port_file.write_text, str(port))
    async with server:
        await server.serve_forever()


class _Accepting:
    """aiosmtpd's handler: every message taken, none kept."""

    served = 0

    async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
        _Accepting.served += 1
        return f"250 2.0.0 Ok: queued as {_Accepting.served}"


async def sink(port_file: Path) -> None:
    from aiosmtpd.smtp import SMTP

    handler = _Accepting()
    server = await asyncio.get_running_loop().create_server(
        lambda: SMTP(handler, hostname="sink.example.com"), "127.0.0.1", 0, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    await asyncio.to_thread(port_file.write_text, str(port))
    async with server:
        await server.serve_forever()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def post_webhooks(url: str, count: int, concurrency: int, secret: str) -> dict[str, float]:
    import httpx
    from standardwebhooks import Webhook

    signer = Webhook(secret)
    next_n = iter(range(count))
    async with httpx.AsyncClient(
        follow_redirects=False, timeout=15.0, headers={"accept-encoding": "identity"}
    ) as client:

        async def post_some() -> None:
            for n in next_n:
                msg_id = "msg_" + hashlib.sha256(f"bench.pinged:{n}".encode()).hexdigest()[:32]
                now = datetime.now(UTC)
                stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                body = json.dumps(
                    {"type": "bench.pinged", "timestamp": stamp, "data": {"n": n}}, separators=(",", ":")
                ).encode()
                headers = {
                    "webhook-id": msg_id,
                    "webhook-timestamp": str(math.floor(now.timestamp())),
                    "webhook-signature": signer.sign(msg_id, now, body.decode()),
                    "content-type": "application/json",
                    "user-agent": "bare-loop",
                }
                async with client.stream("POST", url, content=body, headers=headers) as response:
                    answer = b""
                    async for chunk in response.aiter_raw():
                        answer += chunk
                    if response.status_code != 200:
                        raise RuntimeError(f"the receiver answered {response.status_code}")
                    json.loads(answer)

        return await timed(count, concurrency, post_some)


# the wall-clock time (time.time()) a loop starts at, when set (`--at`): loops of several processes start together
START_AT = 0.0


async def timed(count: int, concurrency: int, loop: Callable[[], Awaitable[None]]) -> dict[str, float]:
    """`concurrency` tasks of `loop` (which share the work), timed from START_AT (or now): CPU, wall time, start
    and end."""
    await asyncio.sleep(max(START_AT - time.time(), 0.0))
    cpu, start, started = cpu_seconds(), time.perf_counter(), time.time()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    seconds, ended = time.perf_counter() - start, time.time()
    return {"cpu_seconds": cpu_seconds() - cpu, "seconds": seconds, "count": count, "started": started, "ended": ended}


async def send_emails(port: int, count: int, concurrency: int) -> dict[str, float]:
    import aiosmtplib

    next_n = iter(range(count))

    async def send_some() -> None:
        for n in next_n:
            account = n + 1
            message = EmailMessage()
            message["From"] = "outbox <outbox@example.com>"
            message["To"] = f"Account {account} <user{account}@example.com>"
            message["Subject"] = "Verify your address"
            message["Date"] = format_datetime(datetime.now(UTC))
            digest = hashlib.sha256(f"verify_address:{account}:1".encode()).hexdigest()[:40]
            message["Message-ID"] = f"<outbox.{digest}@example.com>"
            message.set_content("Open the link in your account settings to verify this address.\n")
            await aiosmtplib.send(
                message, hostname="127.0.0.1", port=port, start_tls=False, local_hostname="example.com", timeout=30
            )

    return await timed(count, concurrency, send_some)


async def publish_events(url: str, count: int, start: int, concurrency: int) -> dict[str, float]:
    import nats

    client = await nats.connect(url, allow_reconnect=False, name="bare-loop")
    js = client.jetstream(timeout=2.0)
    next_id = iter(range(start + 1, start + count + 1))

    async def publish_some() -> None:
        for alert_id in next_id:
            token = hashlib.sha256(f"alert_event:{alert_id}".encode()).hexdigest()[:32]
            now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            data = {"alert_id": alert_id, "workspace_id": alert_id, "title": f"Alert {alert_id}"}
            body = json.dumps(
                {"type": "workspace.alert.raised", "id": token, "time": now, "data": data},
                separators=(",", ":"),
                ensure_ascii=False,
            ).encode()
            headers = {"Nats-Msg-Id": token, "Nats-Expected-Stream": "ACCOUNTS"}
            ack = await js.publish(f"accounts.alerts.{token}", body, timeout=10.0, headers=headers)
            if ack.duplicate:
                raise RuntimeError(f"alert {alert_id} was published before: ids must be new in every run")

    try:
        return await timed(count, concurrency, publish_some)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--at", type=float, default=0.0, help="start the loop at this time.time()")
    commands = parser.add_subparsers(dest="command", required=True)
    receiver = commands.add_parser("receiver")
    receiver.add_argument("--port-file", type=Path, required=True)
    webhook = commands.add_parser("webhook")
    webhook.add_argument("--url", required=True)
    webhook.add_argument("--count", type=int, required=True)
    webhook.add_argument("--concurrency", type=int, default=64)
    webhook.add_argument("--secret", default=os.environ.get("OUTBOX_BENCH_SECRET", ""))
    smtp_sink = commands.add_parser("smtp-sink")
    smtp_sink.add_argument("--port-file", type=Path, required=True)
    email = commands.add_parser("email")
    email.add_argument("--port", type=int, required=True)
    email.add_argument("--count", type=int, required=True)
    email.add_argument("--concurrency", type=int, default=64)
    events = commands.add_parser("nats")
    events.add_argument("--url", required=True)
    events.add_argument("--count", type=int, required=True)
    events.add_argument("--start", type=int, default=0)
    events.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    global START_AT
    START_AT = args.at
    if args.command == "receiver":
        asyncio.run(receive(args.port_file))
    elif args.command == "smtp-sink":
        asyncio.run(sink(args.port_file))
    elif args.command == "email":
        print(json.dumps(asyncio.run(send_emails(args.port, args.count, args.concurrency))))
    elif args.command == "nats":
        print(json.dumps(asyncio.run(publish_events(args.url, args.count, args.start, args.concurrency))))
    else:
        print(json.dumps(asyncio.run(post_webhooks(args.url, args.count, args.concurrency, args.secret))))


if __name__ == "__main__":
    main()
