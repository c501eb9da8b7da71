"""The executor's calls when the path to the database goes silent: a relay that drops every byte (no RST,
no FIN) between the executor's store and a real PostgreSQL.

    ExecutorStore ──▶ NetRelay (pass │ blackhole) ──▶ the test's PostgreSQL

The relay's kernel keeps acknowledging, as a proxy or a pooler would, so TCP keepalives see nothing: only
the store's own bound on each call (CALL_SECONDS) ends the wait. After the blackhole the next call opens a
new connection and is answered; the silent one is never used again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from outbox._internal.connections.engines import url_conninfo
from outbox.executor import store as executor_store
from outbox.executor.store import ExecutorStore
from tests.chaos.netrelay import NetRelay


@pytest.fixture
def relayed(database_url: str) -> Iterator[tuple[NetRelay, str]]:
    """A relay in front of the test server, and the test database's URL through it."""
    target = make_url(database_url)
    socket_dir = target.query.get("host")
    host = socket_dir if isinstance(socket_dir, str) else target.host or "127.0.0.1"
    relay = NetRelay(host, target.port or 5432)
    url = f"postgresql://{target.username}@127.0.0.1:{relay.port}/{target.database}"
    yield relay, url
    relay.close()


async def test_a_blackholed_call_fails_within_its_bound_and_the_next_one_reconnects(
    relayed: tuple[NetRelay, str], engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay, url = relayed
    monkeypatch.setattr(executor_store, "CALL_SECONDS", 2.0)  # the bound itself, shortened for the test
    store = ExecutorStore(url_conninfo(url))
    try:
        await store.sweep("bounded-1", 0, 60, ["EMAIL"], ["EMAIL"])  # connected and answered
        relay.blackhole()
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="did not answer within 2 s"):
            await store.sweep("bounded-1", 0, 60, ["EMAIL"], ["EMAIL"])
        waited = time.monotonic() - started
        relay.pass_()
        await store.sweep("bounded-2", 0, 60, ["EMAIL"], ["EMAIL"])  # a new connection, answered
    finally:
        await store.close()
    assert 2.0 <= waited < 4.0, waited
    with engine.connect() as conn:
        beaten = conn.execute(text("SELECT executor_id FROM agent_executor ORDER BY 1")).scalars().all()
    assert beaten == ["bounded-1", "bounded-2"]
