"""Every statement outbox runs, and the runner of the caller's connection. No kind is named here.

    application.py   the application's: enqueue (one INSERT for a batch), decisions on proposals, cancel,
                     erasure, the trace note, the retention purge's batch, the kinds' rows
    executor.py      the executor's: the claim of lane heads, the sweep, the group commit, the histogram bounds
    operator.py      the operator commands' read-only statements (`outbox status`, `lanes`, `show`, `list`)
    metrics.py       the collector's snapshot, the tally merges, heartbeats and maintenance marks
    migrations.py    the migrations' lock and checks (the schema itself is in `migrations/versions/`)
    caller.py        runs a `Query` on whichever connection the caller holds (SQLAlchemy or psycopg, sync or
                     async), inside the caller's transaction

The executor runs its statements on connections of its own (`outbox.executor.store.ExecutorStore`); the
operator commands and the collector on their SQLAlchemy connections. A statement changes here, in one place,
whoever runs it.
"""
