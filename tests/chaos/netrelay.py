"""A TCP relay whose network can fail on demand: a partition between a client and its server, in one process.

    client ──▶ 127.0.0.1:relay.port ──(mode)──▶ target host:port (or a PostgreSQL socket directory and port)

    pass        every chunk forwarded as it comes, both directions
    delay(s)    every chunk forwarded s seconds after it came (order kept), both directions; a new
                connection reaches the target s seconds after it was accepted
    blackhole   packets dropped: every open connection stays open and silent, new ones are accepted and
                never reach the target; bytes read from either side are discarded; no RST, no FIN
    cut         every open connection reset (SO_LINGER 0, then close: an RST to both ends); then `pass`

Leaving a blackhole (any other mode) does not mend the connections it broke: their bytes were lost, so
they stay silent until one end gives up; then the other end is reset, as its next packet would find the
connection gone. Connections opened after the blackhole work.

The relay runs an asyncio loop in a thread of its own; the mode methods may be called from any thread
and return once the mode is in force. One limit of a relay in user space: the relay's kernel still
acknowledges the bytes it discards, so a client's TCP keepalives and tcp_user_timeout do not see a
blackhole; only a client that bounds how long it waits for an answer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")
CHUNK = 65_536


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    broken: bool = False  # a blackhole lost its bytes: silent for good
    ended: bool = False  # one end of a broken connection gave up during the blackhole
    closed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class RelayStats:
    accepted: int = 0
    open: int = 0
    forwarded_bytes: int = 0
    discarded_bytes: int = 0
    resets: int = 0


class NetRelay:
    """Listens on a free 127.0.0.1 port and forwards to `target`; `pass_`, `delay`, `blackhole` and `cut`
    switch what its network does."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "pass"
        self._delay = 0.0
        self._connections: set[_Connection] = set()
        self.stats = RelayStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"netrelay->{target_port}", daemon=True)
        self._thread.start()
        self._server = self._await(self._listen())
        self.port: int = self._server.sockets[0].getsockname()[1]

    # ---- the modes, from any thread ----

    def pass_(self) -> None:
        """Forward as it comes (ends a delay or a blackhole)."""
        self._call(lambda: self._set("pass", 0.0))

    def delay(self, seconds: float) -> None:
        """Forward every chunk `seconds` after it came, both directions."""
        self._call(lambda: self._set(f"delay {seconds:g} s", seconds))

    def blackhole(self) -> None:
        """Drop everything: open connections go silent for good, new ones reach nothing."""
        self._call(lambda: self._set("blackhole", 0.0))

    def cut(self) -> int:
        """Reset every open connection (both ends get an RST); new connections pass. Returns how many."""
        return self._call(self._cut)

    def close(self) -> None:
        """Stop listening, reset every connection, end the thread."""
        if not self._thread.is_alive():
            return
        self._call(self._shut)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def open_connections(self) -> int:
        return self._call(lambda: sum(1 for c in self._connections if not c.closed))

    # ---- in the relay's thread ----

    def _call(self, function: Callable[[], _T]) -> _T:
        """`function()` in the relay's thread, once it ran."""

        async def run() -> _T:
            return function()

        return self._await(run())

    def _await(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0, limit=CHUNK)

    def _set(self, mode: str, delay: float) -> None:
        was = self.mode
        self.mode, self._delay = mode, delay
        if mode == "blackhole":
            for conn in self._connections:
                conn.broken = True
        elif was == "blackhole":
            # the blackhole is over: a broken connection one end of which gave up is now reset
            for conn in list(self._connections):
                if conn.ended:
                    self._reset(conn)

    def _cut(self) -> int:
        count = 0
        for conn in list(self._connections):
            if not conn.closed:
                count += 1
                self._reset(conn)
        self.mode, self._delay = "pass", 0.0
        return count

    def _shut(self) -> None:
        self._server.close()
        for conn in list(self._connections):
            self._reset(conn)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a reset cancels the connection's tasks: the end of this one, not an error (streams would log it)
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay(reader, writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer, broken=self.mode == "blackhole")
        self._connections.add(conn)
        self.stats.accepted += 1
        self.stats.open += 1
        task = asyncio.current_task()
        assert task is not None
        conn.tasks.append(task)
        if conn.broken:
            await self._discard(conn, reader)
            return
        if self._delay:
            await asyncio.sleep(self._delay)
        try:
            up_reader, conn.upstream = await self._connect()
        except OSError:
            self._reset(conn)
            return
        if conn.broken or conn.closed:  # a blackhole (or a cut) came while connecting
            if conn.closed:
                self._abort(conn.upstream)
                return
            await asyncio.gather(self._discard(conn, reader), self._discard(conn, up_reader))
            return
        await asyncio.gather(self._pump(conn, reader, conn.upstream), self._pump(conn, up_reader, writer))

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self.target
        if host.startswith("/"):  # a PostgreSQL socket directory
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}", limit=CHUNK)
        return await asyncio.open_connection(host, port, limit=CHUNK)

    async def _discard(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        """Read and drop until this end gives up."""
        with contextlib.suppress(OSError):
            while data := await reader.read(CHUNK):
                self.stats.discarded_bytes += len(data)
        self._end_broken(conn)

    async def _pump(self, conn: _Connection, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """One direction: each chunk read is delivered after the delay of the mode it came in."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        deliver = asyncio.create_task(self._deliver(conn, queue, sink))
        conn.tasks.append(deliver)
        with contextlib.suppress(OSError):
            while data := await source.read(CHUNK):
                if conn.broken:
                    self.stats.discarded_bytes += len(data)
                else:
                    queue.put_nowait((loop.time() + self._delay, data))
        if conn.broken:
            self._end_broken(conn)
            return
        queue.put_nowait(None)  # this end closed: the other is closed once what came before is delivered
        await deliver

    async def _deliver(
        self, conn: _Connection, queue: asyncio.Queue[tuple[float, bytes] | None], sink: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            due, data = item
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            if conn.broken or conn.closed:
                self.stats.discarded_bytes += len(data)
                continue
            try:
                sink.write(data)
                await sink.drain()
            except OSError:
                break
            self.stats.forwarded_bytes += len(data)
        if not conn.broken:
            self._close(conn)

    def _end_broken(self, conn: _Connection) -> None:
        """One end of a broken connection gave up: the other end hears of it once the blackhole is over."""
        if self.mode == "blackhole":
            conn.ended = True
        else:
            self._reset(conn)

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.stats.open -= 1
        self._connections.discard(conn)
        for writer in (conn.client, conn.upstream):
            if writer is not None:
                writer.close()

    def _reset(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.stats.open -= 1
        self.stats.resets += 1
        self._connections.discard(conn)
        self._abort(conn.client)
        if conn.upstream is not None:
            self._abort(conn.upstream)
        current = asyncio.current_task()
        for task in conn.tasks:
            if task is not current:
                task.cancel()

    @staticmethod
    def _abort(writer: asyncio.StreamWriter) -> None:
        """Close with an RST: SO_LINGER on, 0 seconds."""
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
