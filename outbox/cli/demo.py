"""`outbox demo`: migrate a database (embedded by default), enqueue a sample email action, show it.

Until the demo stack lands (Prefect, SMTP sink, workers), this shows the action store end to end.
"""

from __future__ import annotations

import uuid

from rich.console import Console
from rich.table import Table

import outbox
from outbox import migrate
from outbox.cli.database import database_url
from outbox.db import sync_engine

console = Console()


def demo() -> None:
    """Run outbox locally: migrate, enqueue a sample action inside a transaction, print it."""
    engine = sync_engine(database_url(console))
    with engine.begin() as conn:
        migrate.upgrade(conn)
    with engine.begin() as conn:
        action = outbox.enqueue(
            conn,
            outbox.ActionRequest(
                kind=outbox.ActionKind.EMAIL,
                lane_key="account:42",
                idempotency_key=f"verify-address:42:{uuid.uuid4()}",
                payload={"notice": "verify_address", "account_id": 42},
                subject_account_id=42,
            ),
        )
    engine.dispose()
    table = Table(title=f"enqueued action {action.id}", show_header=False)
    for field in ("kind", "state", "lane_key", "idempotency_key", "payload", "attempt", "epoch", "due_at"):
        table.add_row(field, str(getattr(action, field)))
    console.print(table)
