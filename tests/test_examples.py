"""The example applications (examples/fastapi_app, examples/django_app) end to end on a real PostgreSQL.

Each app changes an account's address and enqueues "verify your address" in one transaction. For each:
a request that commits leaves the row changed and exactly one ADMITTED email; a request that rolls back
after its enqueue (the address belongs to another account) leaves neither; the same request twice (one
Idempotency-Key) leaves one email.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import django
import httpx
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import Client
from sqlalchemy import Engine, text

from examples.django_app import settings as project_settings
from examples.fastapi_app import create_app, seed

ALICE = 1
NEW = "alice@new.example.com"
BOBS = "bob@example.com"  # taken: Bob's address
VERIFY_EVENT = {"account_id": ALICE, "request": "change-1"}


def account(engine: Engine, account_id: int) -> tuple[str, bool]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT email, email_verified FROM app_account WHERE id = :id"), {"id": account_id}
        ).one()
    return row.email, row.email_verified


def actions(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, kind, state, idempotency_key, payload FROM agent_action ORDER BY id"))
        return [dict(row) for row in rows.mappings()]


def last_action_id_drawn(engine: Engine) -> int | None:
    """The identity sequence of agent_action: an INSERT draws from it even when its transaction rolls back."""
    with engine.connect() as conn:
        drawn: int | None = conn.execute(
            text("SELECT pg_sequence_last_value(pg_get_serial_sequence('agent_action', 'id')::regclass)")
        ).scalar_one()
    return drawn


def assert_one_verify_email(engine: Engine, response: dict[str, Any]) -> None:
    [action] = actions(engine)
    assert (action["kind"], action["state"]) == ("EMAIL", "ADMITTED")
    assert action["idempotency_key"] == "verify_address:1:change-1"
    assert action["payload"] == {"notice": "verify_address", "event": VERIFY_EVENT}
    assert response == {"account_id": ALICE, "email": NEW, "action_id": action["id"], "action_state": "ADMITTED"}
    assert account(engine, ALICE) == (NEW, False)


# ---- FastAPI ------------------------------------------------------------------------------------


@pytest.fixture
def fastapi_db(engine: Engine) -> Engine:
    with engine.begin() as conn:
        seed(conn)
    return engine


@asynccontextmanager
async def fastapi_client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app as a server runs it: its lifespan entered (the engine disposed at the end)."""
    app = create_app(database_url)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        yield c


async def change_email_fastapi(client: httpx.AsyncClient, email: str, key: str = "change-1") -> httpx.Response:
    return await client.post(f"/accounts/{ALICE}/email", json={"email": email}, headers={"Idempotency-Key": key})


async def test_fastapi_a_committed_change_leaves_one_email(fastapi_db: Engine, database_url: str) -> None:
    async with fastapi_client(database_url) as client:
        response = await change_email_fastapi(client, NEW)
    assert response.status_code == 200, response.text
    assert_one_verify_email(fastapi_db, response.json())


async def test_fastapi_a_rollback_after_the_enqueue_leaves_nothing(fastapi_db: Engine, database_url: str) -> None:
    drawn = last_action_id_drawn(fastapi_db)
    async with fastapi_client(database_url) as client:
        response = await change_email_fastapi(client, BOBS)
    assert response.status_code == 409, response.text
    assert last_action_id_drawn(fastapi_db) != drawn  # the action was inserted, then rolled back
    assert actions(fastapi_db) == []
    assert account(fastapi_db, ALICE) == ("alice@example.com", True)


async def test_fastapi_the_same_request_twice_leaves_one_email(fastapi_db: Engine, database_url: str) -> None:
    async with fastapi_client(database_url) as client:
        first = await change_email_fastapi(client, NEW)
        again = await change_email_fastapi(client, NEW)
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert again.json() == first.json()
    assert_one_verify_email(fastapi_db, again.json())


async def test_fastapi_an_unknown_account_is_404_and_enqueues_nothing(fastapi_db: Engine, database_url: str) -> None:
    async with fastapi_client(database_url) as client:
        response = await client.post("/accounts/99/email", json={"email": NEW}, headers={"Idempotency-Key": "k"})
    assert response.status_code == 404, response.text
    assert actions(fastapi_db) == []


# ---- Django -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def django_project() -> None:
    """The example project's settings, configured once; each test points the connection at its database."""
    if not settings.configured:
        project = {name: getattr(project_settings, name) for name in dir(project_settings) if name.isupper()}
        settings.configure(**{**project, "ALLOWED_HOSTS": ["testserver"]})  # the host django.test.Client sends
        django.setup()


@pytest.fixture
def django_client(django_project: None, database_url: str, engine: Engine) -> Iterator[Client]:
    connections.close_all()
    connections["default"].settings_dict.update(project_settings.database(database_url))
    call_command("seed_accounts", stdout=io.StringIO())
    yield Client()
    connections.close_all()  # or the fixture cannot drop the database


def change_email_django(client: Client, email: str, key: str = "change-1") -> Any:
    return client.post(
        f"/accounts/{ALICE}/email", {"email": email}, content_type="application/json", headers={"Idempotency-Key": key}
    )


def test_django_a_committed_change_leaves_one_email(django_client: Client, engine: Engine) -> None:
    response = change_email_django(django_client, NEW)
    assert response.status_code == 200, response.content
    assert_one_verify_email(engine, response.json())


def test_django_a_rollback_after_the_enqueue_leaves_nothing(django_client: Client, engine: Engine) -> None:
    drawn = last_action_id_drawn(engine)
    response = change_email_django(django_client, BOBS)
    assert response.status_code == 409, response.content
    assert last_action_id_drawn(engine) != drawn  # the action was inserted, then rolled back
    assert actions(engine) == []
    assert account(engine, ALICE) == ("alice@example.com", True)


def test_django_the_same_request_twice_leaves_one_email(django_client: Client, engine: Engine) -> None:
    first = change_email_django(django_client, NEW)
    again = change_email_django(django_client, NEW)
    assert (first.status_code, again.status_code) == (200, 200), again.content
    assert again.json() == first.json()
    assert_one_verify_email(engine, again.json())


def test_django_an_unknown_account_is_404_and_enqueues_nothing(django_client: Client, engine: Engine) -> None:
    response = django_client.post(
        "/accounts/99/email", {"email": NEW}, content_type="application/json", headers={"Idempotency-Key": "k"}
    )
    assert response.status_code == 404, response.content
    assert actions(engine) == []
