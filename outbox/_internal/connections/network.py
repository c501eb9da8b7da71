"""The HTTP clients' network streams: httpcore's own (anyio), with the idle check read from the socket they hold.

    httpx.AsyncClient or transport (webhooks; GitHub's, under githubkit) ─▶ PoolsInTurn: POOLS pools taken in turn ─▶
        QuickIdleCheck.connect_tcp ─▶ anyio's stream, wrapped once: its socket kept ─▶ every `is_readable` (the
        pool asks it of every idle connection before every request) a poll of that socket, as httpcore's own
        check, without asking anyio for it

Before each request httpcore's pool asks every idle connection whether the peer closed it, and anyio
answers each question by building the stream's whole table of attributes (a `getpeername` call among them):
with 64 attempts in flight that table was a seventh of the webhook executor's CPU. The answer is the same
poll of the same socket; reads, writes, TLS and errors are anyio's, unchanged.
"""

# the methods are httpcore's interface, whose timeouts are arguments
# ruff: noqa: ASYNC109

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx
from httpcore._utils import is_socket_readable


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._socket: socket.socket | None = stream.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return is_socket_readable(self._socket)
        return self._stream.get_extra_info(info)


class QuickIdleCheck(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, its streams answering the pool's idle check from their socket."""

    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


# the connection pools a PoolsInTurn takes in turn
POOLS = 8


class PoolsInTurn(httpx.AsyncBaseTransport):
    """httpx's own transport as POOLS pools that requests take in turn, each checking its idle connections on their
    sockets. httpcore's pool walks its connections and its waiting requests for every request it assigns: with 64
    requests in flight one pool spent an eighth of a GitHub executor's CPU walking; POOLS pools, each with an eighth
    of them, walk a sixty-fourth as much. Each keeps httpx's limits (up to 20 idle connections)."""

    def __init__(self) -> None:
        # httpx's defaults (SSL_CERT_FILE and SSL_CERT_DIR read from the environment), one TLS context for all: a
        # context each would load the certificates eight times (160 ms against 20)
        tls = httpx.create_ssl_context()
        self._pools = [httpx.AsyncHTTPTransport(verify=tls) for _ in range(POOLS)]
        for pool in self._pools:
            use_quick_idle_check(pool)
        self._next = itertools.cycle(self._pools)

    @property
    def pools(self) -> list[httpx.AsyncHTTPTransport]:
        return list(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


def use_quick_idle_check(transport: httpx.AsyncBaseTransport) -> None:
    """`transport`'s pool, when it has one, connects through QuickIdleCheck from now on. httpx names no option
    for it: the pool is reached by its attribute, and a test checks it is."""
    pool = getattr(transport, "_pool", None)
    if pool is not None:
        pool._network_backend = QuickIdleCheck()


def with_quick_idle_check(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """`client` with every transport's pool (the default one and a proxy's) connecting through QuickIdleCheck."""
    for transport in [client._transport, *client._mounts.values()]:
        if transport is not None:
            use_quick_idle_check(transport)
    return client
