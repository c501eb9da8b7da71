"""An example application: accounts with verified addresses, workspaces with roles, unsubscriptions,
and the two email notices it sends through outbox. The demo and the email tests use it; outbox's own
package never imports it, as with any application."""

from sqlalchemy.ext.asyncio import AsyncEngine

from examples.accounts import notices
from outbox.email import email_adapters
from outbox.executor import ActionAdapter


def adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters examples.accounts:adapters`: the notices registered, the EMAIL adapter."""
    assert notices.WORKSPACE_ALERT and notices.VERIFY_ADDRESS
    return email_adapters(engine)
