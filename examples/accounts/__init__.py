"""An example application: accounts with verified addresses, workspaces with roles, unsubscriptions,
the two email notices it sends through outbox, and one webhook and one domain event for each workspace
alert. The demo, the chaos harness and the tests use it; outbox's own package never imports it, as with
any application."""

import os

from sqlalchemy.ext.asyncio import AsyncEngine

from examples.accounts import notices
from outbox.email import email_adapters
from outbox.executor import ActionAdapter


def adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters examples.accounts:adapters`: the notices registered, the EMAIL adapter."""
    assert notices.WORKSPACE_ALERT and notices.VERIFY_ADDRESS
    return email_adapters(engine)


def all_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`outbox run --adapters examples.accounts:all_adapters`: EMAIL, WEBHOOK (to ACCOUNTS_ALERTS_WEBHOOK_URL,
    signed with OUTBOX_WEBHOOK_SECRET_ALERTS) and, when OUTBOX_NATS_URL is set, NATS_EVENT."""
    from examples.accounts import events, webhooks
    from outbox.nats import nats_adapters
    from outbox.webhook import webhook_adapters

    assert webhooks.ALERT_RAISED and events.ALERT_EVENT
    chosen = [*adapters(engine), *webhook_adapters(engine)]
    if os.environ.get("OUTBOX_NATS_URL"):
        chosen += nats_adapters(engine)
    return chosen
