"""The FastAPI example: change an account's address and enqueue "verify your address" in one transaction.

    POST /accounts/{id}/email  {"email": ...}   Idempotency-Key: <the client's id for this change>

    one AsyncSession per request ─▶ async with session.begin():
                                        UPDATE app_account (new address, unverified)
                                        enqueue_email_async(session, VERIFY_ADDRESS, event)
                                        the address taken by another account? raise 409
                                    ─▶ commit: the row and the action together; any exception: neither

outbox never commits: the action exists exactly when this transaction commits. A worker
(`outbox run --adapters examples.accounts:adapters`) sends it afterwards.
"""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the endpoint at runtime.

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from examples.accounts import schema
from examples.accounts.notices import VERIFY_ADDRESS  # importing the notices registers them
from outbox.email import enqueue_email_async

CHANGE_ADDRESS = text("""
    UPDATE app_account SET email = :email, email_verified = false WHERE id = :account_id RETURNING id
""")
ADDRESS_TAKEN = text("""
    SELECT EXISTS (SELECT 1 FROM app_account WHERE email = :email AND id <> :account_id)
""")
DEMO_ACCOUNTS = text("""
    INSERT INTO app_account (id, display_name, email, email_verified)
    VALUES (1, 'Alice', 'alice@example.com', true), (2, 'Bob', 'bob@example.com', true)
    ON CONFLICT (id) DO NOTHING
""")


class NewAddress(BaseModel):
    email: str = Field(max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")


class AddressChanged(BaseModel):
    account_id: int
    email: str
    # the verification email: ADMITTED now, sent by a worker once this transaction has committed
    action_id: int
    action_state: str


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    """One session per request; the endpoint opens and ends its transaction."""
    async with request.app.state.sessions() as session:
        yield session


Session = Annotated[AsyncSession, Depends(session)]
# the client's id for this change: a retry of the same request enqueues nothing more
IdempotencyKey = Annotated[str, Header(min_length=1, max_length=200)]

router = APIRouter()


@router.post("/accounts/{account_id}/email")
async def change_email(
    account_id: int, new: NewAddress, session: Session, idempotency_key: IdempotencyKey
) -> AddressChanged:
    """Give the account a new, unverified address and ask it to verify the address, in one transaction."""
    async with session.begin():  # commits when the block ends, rolls back on any exception
        changed = await session.execute(CHANGE_ADDRESS, {"account_id": account_id, "email": new.email})
        if changed.first() is None:
            raise HTTPException(404, f"no account {account_id}")
        action = await enqueue_email_async(
            session, VERIFY_ADDRESS, {"account_id": account_id, "request": idempotency_key}
        )
        # The last check runs after the enqueue on purpose: whatever fails before the commit, even after
        # enqueue_email_async has returned, takes the email away with the change.
        taken = await session.execute(ADDRESS_TAKEN, {"account_id": account_id, "email": new.email})
        if taken.scalar_one():
            raise HTTPException(409, f"{new.email} belongs to another account")
    return AddressChanged(account_id=account_id, email=new.email, action_id=action.id, action_state=action.state.value)


def create_app(database_url: str) -> FastAPI:
    """The application on the database at `database_url`, migrated by `outbox db upgrade` beforehand."""
    # the async engine needs an async driver: psycopg 3, whichever driver the URL names
    engine = create_async_engine(make_url(database_url).set(drivername="postgresql+psycopg"))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.dispose()

    app = FastAPI(title="outbox example: FastAPI", lifespan=lifespan)
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    app.include_router(router)
    return app


def seed(conn: Connection) -> None:
    """The example's tables and two accounts, Alice (1) and Bob (2), both verified; nothing that exists."""
    schema.create(conn)
    conn.execute(DEMO_ACCOUNTS)
