"""The chaos harness's network relay (tests/chaos/netrelay.py) between psycopg and a real PostgreSQL.

    psycopg ──▶ NetRelay(127.0.0.1:port) ──pass / delay / blackhole / cut──▶ OwnPostgres (127.0.0.1)

Each test opens connections through the relay, switches its mode, and reads what the client and the server
see: answers, their delay, silence (no error, no answer), resets, and the server's own backends.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.chaos.netrelay import NetRelay
from tests.chaos.postgres import OwnPostgres

QUIET = 1.5  # how long a query must stay unanswered to count as silent


@pytest.fixture(scope="module")
def postgres() -> Iterator[OwnPostgres]:
    server = OwnPostgres()
    yield server
    server.stop()


@pytest.fixture
def relay(postgres: OwnPostgres) -> Iterator[NetRelay]:
    relay = NetRelay("127.0.0.1", postgres.port)
    yield relay
    relay.close()


def url(port: int, name: str) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres?application_name={name}&connect_timeout=2"


def backends(postgres: OwnPostgres, name: str) -> int:
    """The server's backends of clients named `name` (asked directly, not through the relay)."""
    with psycopg.connect(url(postgres.port, "netrelay-observer")) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]).fetchone()
        assert row is not None
        return int(row[0])


def wait_until(condition: object, seconds: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.05)


def give_up(conn: psycopg.AsyncConnection[object]) -> None:
    """The client ends its side of the connection (a FIN to the relay) while a query of its waits."""
    fd = conn.pgconn.socket
    with socket.socket(fileno=socket.dup(fd)) as own:
        own.shutdown(socket.SHUT_RDWR)


async def test_pass_forwards_both_ways(relay: NetRelay, postgres: OwnPostgres) -> None:
    async with await psycopg.AsyncConnection.connect(url(relay.port, "nr-pass")) as conn:
        row = await (await conn.execute("SELECT 40 + 2")).fetchone()
        assert row == (42,)
        assert backends(postgres, "nr-pass") == 1
    wait_until(lambda: backends(postgres, "nr-pass") == 0)  # a client's close reaches the server
    assert relay.stats.accepted == 1 and relay.stats.forwarded_bytes > 0 and relay.stats.resets == 0


async def test_delay_holds_every_chunk_both_ways(relay: NetRelay) -> None:
    async with await psycopg.AsyncConnection.connect(url(relay.port, "nr-delay")) as conn:
        relay.delay(0.4)
        started = time.monotonic()
        await conn.execute("SELECT 1")
        delayed = time.monotonic() - started
        relay.pass_()
        started = time.monotonic()
        await conn.execute("SELECT 1")
        passed = time.monotonic() - started
    assert delayed >= 0.8, f"a round trip took {delayed:.2f} s: the delay must apply to the query and its answer"
    assert passed < 0.3, f"a round trip took {passed:.2f} s after the delay ended"


async def test_blackhole_keeps_connections_open_and_silent(relay: NetRelay, postgres: OwnPostgres) -> None:
    old = await psycopg.AsyncConnection.connect(url(relay.port, "nr-old"), autocommit=True)
    relay.blackhole()
    query = asyncio.create_task(old.execute("SELECT 1"))
    done, _ = await asyncio.wait({query}, timeout=QUIET)
    assert not done, "a query through a blackhole was answered or failed (no RST, no FIN may reach the client)"
    assert backends(postgres, "nr-old") == 1  # the server sees no FIN either

    # a new connection is accepted (not refused) and never answered: the client's connect timeout ends it
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        await psycopg.AsyncConnection.connect(url(relay.port, "nr-new"))
    assert time.monotonic() - started >= 1.5
    assert relay.stats.accepted == 2 and relay.stats.discarded_bytes > 0

    relay.pass_()
    async with await psycopg.AsyncConnection.connect(url(relay.port, "nr-after")) as conn:
        assert await (await conn.execute("SELECT 7")).fetchone() == (7,)
    assert not query.done(), "the connection the blackhole broke came back: its bytes were lost"

    # the old client gives up; the server's backend is reset, as its next packet would find it gone
    give_up(old)
    with pytest.raises(psycopg.OperationalError):
        await query
    wait_until(lambda: backends(postgres, "nr-old") == 0)
    await old.close()


async def test_a_client_that_gives_up_during_a_blackhole_is_heard_after_it(
    relay: NetRelay, postgres: OwnPostgres
) -> None:
    conn = await psycopg.AsyncConnection.connect(url(relay.port, "nr-gone"), autocommit=True)
    relay.blackhole()
    query = asyncio.create_task(conn.execute("SELECT 1"))
    give_up(conn)
    with pytest.raises(psycopg.OperationalError):
        await query
    await conn.close()
    wait_until(lambda: relay.open_connections() == 1)  # the relay keeps the server's side until the end
    assert backends(postgres, "nr-gone") == 1
    relay.pass_()
    wait_until(lambda: backends(postgres, "nr-gone") == 0)
    assert relay.open_connections() == 0


async def test_cut_resets_open_connections_and_lets_new_ones_pass(relay: NetRelay, postgres: OwnPostgres) -> None:
    conns = [await psycopg.AsyncConnection.connect(url(relay.port, "nr-cut"), autocommit=True) for _ in range(3)]
    assert backends(postgres, "nr-cut") == 3
    assert relay.cut() == 3
    for conn in conns:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            await conn.execute("SELECT 1")
        assert time.monotonic() - started < 1.0, "a reset connection must fail at once"
        await conn.close()
    wait_until(lambda: backends(postgres, "nr-cut") == 0)  # the server got its RST too
    assert relay.mode == "pass" and relay.stats.resets == 3
    async with await psycopg.AsyncConnection.connect(url(relay.port, "nr-cut-new")) as conn:
        assert await (await conn.execute("SELECT 3")).fetchone() == (3,)


async def test_cut_during_a_blackhole_resets_the_silent_connections(relay: NetRelay) -> None:
    conn = await psycopg.AsyncConnection.connect(url(relay.port, "nr-cut-bh"), autocommit=True)
    relay.blackhole()
    query = asyncio.create_task(conn.execute("SELECT 1"))
    done, _ = await asyncio.wait({query}, timeout=QUIET)
    assert not done
    relay.cut()
    with pytest.raises(psycopg.OperationalError):
        await asyncio.wait_for(query, 5)
    await conn.close()
