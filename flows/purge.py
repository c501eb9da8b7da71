"""outbox-purge: the retention purge on a daily schedule, one run at a time.

scheduled run ──▶ (a cell's run: its database, flows.cells) ──▶ outbox.retention.purge_ended (short batches)
              ──▶ INFO line + table artifact (its key per cell)

SIGTERM (its worker stopping) ends the purge after the batch it is in, and the run Completed: every batch
commits on its own, and the next day's run takes up the rest.
"""

from __future__ import annotations

import signal
import threading
from datetime import timedelta
from typing import Any

from prefect import State, flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.states import Failed
from prefect.utilities.asyncutils import run_coro_as_sync

from outbox._internal.config.limits import PURGE_BATCH_SIZE
from outbox._internal.connections.engines import sync_engine
from outbox._internal.redaction.log_records import hide_secrets_in_logs
from outbox.cells import CellsError
from outbox.retention import purge_ended
from outbox.settings import load_settings

from .cells import cell_url


@flow(name="outbox-purge", retries=2, retry_delay_seconds=300, timeout_seconds=3600)
def purge(
    retention_days: float = 30, batch_size: int = PURGE_BATCH_SIZE, cell: str | None = None
) -> dict[str, Any] | State[Any]:
    """Delete the actions that ended more than `retention_days` ago, in `cell`'s database (None: the one of
    OUTBOX_DATABASE_URL); return how many went. A cell the cells file does not name, or no cells file: the
    run fails with one line naming them, no traceback (and is retried as any failed purge)."""
    hide_secrets_in_logs()
    settings = load_settings()
    try:
        url = run_coro_as_sync(cell_url(cell)) if cell is not None else settings.database_url
    except CellsError as wrong:
        return Failed(message=str(wrong))
    if not url:
        raise ValueError("OUTBOX_DATABASE_URL is not set for the purge flow")
    stop = threading.Event()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if in_main_thread else None
    engine = sync_engine(url, pool_size=1, **settings.engine_timeouts())
    try:
        removed = purge_ended(engine, older_than=timedelta(days=retention_days), batch_size=batch_size, stop=stop)
    finally:
        engine.dispose()
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    ending = "stopped early by SIGTERM: " if stop.is_set() else ""
    get_run_logger().info("%spurged %s actions that ended more than %s days ago", ending, removed, retention_days)
    create_table_artifact(
        table=[{"retention_days": retention_days, "removed": removed}],
        key=f"outbox-purge-summary-{cell}" if cell else "outbox-purge-summary",
        description="Actions removed by the retention purge.",
    )
    return {"removed": removed, "retention_days": retention_days}
