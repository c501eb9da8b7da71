"""The HTTP clients' idle check (PoolsInTurn's pools) against a real keep-alive HTTP server on 127.0.0.1.

A receiver may close a kept-alive connection between two requests (two webhooks, two GitHub posts).
httpcore's pool learns it from the idle check (`is_readable`), now answered from the stream's socket: the
next request must go out on a new connection, never fail on the closed one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from outbox._internal.config.credentials import Sources
from outbox._internal.connections.network import POOLS, QuickIdleCheck, with_quick_idle_check
from outbox.webhook import WebhookAdapter
from outbox.webhook import endpoints as endpoint_registry
from tests.support import until

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class _Server:
    """Answers every request 200; closes each connection after its first answer."""

    def __init__(self) -> None:
        self.connections = 0
        self.closes = 0
        self.url = ""
        self.closed = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ANSWER)
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        self.closes += 1
        self.closed.set()


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[_Server]:
    found = _Server()
    listening = await asyncio.start_server(found._serve, "127.0.0.1", 0)
    found.url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/hooks"
    async with listening:
        yield found


async def test_a_stream_is_readable_once_the_receiver_closed_it() -> None:
    async with serving() as server:
        port = int(server.url.split(":")[2].split("/")[0])
        stream = await QuickIdleCheck().connect_tcp("127.0.0.1", port, timeout=5)
        try:
            assert not stream.get_extra_info("is_readable")
            await stream.write(b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n", timeout=5)
            assert await stream.read(len(ANSWER), timeout=5) == ANSWER
            async with asyncio.timeout(5):
                await server.closed.wait()
            until(lambda: stream.get_extra_info("is_readable"), 5, "the idle check to see the close")
        finally:
            await stream.aclose()


async def test_a_connection_the_receiver_closed_is_never_used_again() -> None:
    async with serving() as server, with_quick_idle_check(httpx.AsyncClient()) as client:
        assert (await client.post(server.url, content=b"{}")).status_code == 200
        async with asyncio.timeout(5):
            await server.closed.wait()
        assert (await client.post(server.url, content=b"{}")).status_code == 200
    assert server.connections == 2


async def test_the_adapter_s_client_checks_idle_connections_on_their_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """The webhook client's pools, taken in turn; fails when an httpx release moves the pool that
    `use_quick_idle_check` reaches."""
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})  # another test's endpoints and their secrets stay out
    monkeypatch.setattr(endpoint_registry, "_SOURCES", Sources("secret"))
    engine = create_async_engine("postgresql+psycopg://outbox@127.0.0.1:1/outbox")  # never connects
    adapter = WebhookAdapter(engine)
    try:
        pools = adapter._client._transport.pools  # type: ignore[attr-defined]
        assert len(pools) == POOLS and all(isinstance(p._pool._network_backend, QuickIdleCheck) for p in pools)
    finally:
        await adapter.aclose()
        await engine.dispose()


async def test_the_github_client_s_shared_pools_check_idle_connections_on_their_socket() -> None:
    """Fails when an httpx release moves the pool `use_quick_idle_check` reaches; then requests through the pools
    in turn each go out on a new connection once the server closed the last one."""
    pytest.importorskip("githubkit")
    from outbox.github.client import SharedTransport

    transport = SharedTransport()
    try:
        assert len(transport.pools) == POOLS
        assert all(isinstance(pool._pool._network_backend, QuickIdleCheck) for pool in transport.pools)
        async with serving() as server, httpx.AsyncClient(transport=transport) as client:
            # every pool once, then the first again: its one connection the server has closed meanwhile
            for sent in range(1, POOLS + 2):
                assert (await client.post(server.url, content=b"{}")).status_code == 200
                await asyncio.to_thread(until, lambda: server.closes >= sent, 5, "the server to close")  # noqa: B023
        assert server.connections == POOLS + 1
    finally:
        await transport.close()
