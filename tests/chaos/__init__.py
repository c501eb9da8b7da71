"""Proof under faults: executor processes, a real relay and PostgreSQL, faults at random moments, invariants.

    python -m tests.chaos --seed 7 --minutes 30          # a long run (its figures go to bench/RESULTS.md)
    python -m tests.chaos --seed 7 --minutes 1 --json out.json

One run:
  1. its own PostgreSQL (the embedded binaries, 127.0.0.1, restartable; or OUTBOX_CHAOS_DATABASE_URL's server,
     which this run cannot restart), a fresh database, the example application, an SmtpSink on 127.0.0.1
     in this process, a nats-server with the stream ACCOUNTS (a duplicate window shorter than the lease), a
     webhook receiver process behind a relay, the local Slack, GitHub and GitLab APIs (each a process that
     keeps a journal), and 4 executor processes (`outbox run --adapters
     tests.chaos.adapters:adapters --lease-seconds 65`), two of them with their wall clock hours off;
  2. a mixed workload enqueued at a steady rate: EMAIL (at most once, the example notices), TEST_READBACK
     (at least once, reads back), WEBHOOK and NATS_EVENT (the example's alert webhook and event),
     SLACK_MESSAGE, GITHUB_POST and GITLAB_POST (a few channels, pull requests and merge requests), many
     lanes, some hot, some shared by several kinds, some with expires_at, some proposals admitted or
     refused later (and a few parked on purpose), accounts erased while their actions wait;
  3. faults at random moments (seeded): SIGKILL (restarted after a pause, often with another clock skew),
     SIGSTOP/SIGCONT (short, or past the lease), relay faults (4xx, 5xx, drop or stall after DATA, a flaky
     relay), a relay that throttles for a while (421 at connect, 450 or 454 at MAIL: the smtp destination
     pauses), pg_terminate_backend, a PostgreSQL restart (fast or immediate), the nats-server and the
     webhook receiver SIGKILLed and restarted, the receiver throttling for a while (429 or 503, with or
     without Retry-After), the webhook relay cut or blackholed, the Slack, GitHub and GitLab APIs storing
     posts and losing their answers (a reset, a 502), SIGKILLed and restarted, or rate limiting for a
     while; on purpose the one case no fence can stop (a holder frozen right after its window check, woken
     past its lease), and WEBHOOK, NATS_EVENT, SLACK_MESSAGE, GITHUB_POST and GITLAB_POST holders frozen
     right after their provider accepted, SIGKILLed or woken past the lease;
  4. settle, stop the executors with SIGTERM, and check every invariant (see `tests.chaos.checks`).

Cells (`--cells 3`): the same run against three cells (eu, us, ap), each its own PostgreSQL server with the
example application's data, its own read-back provider and its own range of action ids; each lane lives in one
cell (by its key's CRC-32), an erasure erases in every cell, and the executors run `outbox run --all-cells` (one
executor per cell in each process, a relay per cell between a process and each server). The database faults hit
one cell at a time, and a cell's primary is also SIGKILLed (its postmaster: no shutdown) and started again after
a few seconds (crash recovery). The report adds each cell's actions, faults, duplicates, overlaps and losses.

The seed fixes the workload and the fault schedule (kinds, order, gaps, targets); process timing does not
repeat exactly, so two runs with one seed inject the same faults at nearly the same moments.
"""

# The modules, one job each:
#  runner    the run: set-up, workload, faults, watching the executors, settling, stopping, tear-down
#  adapters  the executor processes' adapters (EMAIL, TEST_READBACK, WEBHOOK, NATS_EVENT, SLACK_MESSAGE,
#            GITHUB_POST, GITLAB_POST, journaled; the brinks)
#  journal   reading those journals: what a killed process held, where a process froze itself
#  checks    the invariants, checked once the executors stopped
#  report    what a run did and found, as a Markdown table or JSON
#  records   the configuration and what the runner keeps track of (slots, kills, brinks, actions, erasures)
#  postgres  a PostgreSQL of the run's own, which it may restart
#  providers the WEBHOOK and NATS_EVENT providers of the run's own (nats-server, receiver, its relay)
#  posts     the SLACK_MESSAGE, GITHUB_POST and GITLAB_POST providers (the local APIs' processes, their stores)
#  receiver  the webhook receiver's process, which starts again from its journal
#
# Nothing is imported here: executor processes import `tests.chaos.adapters` alone.
