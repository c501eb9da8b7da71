"""The stack of `outbox demo`, run from a clone of the repository and never shipped in the wheel.

    outbox demo (its options checked) ─▶ python -m demo ─▶ run.run_demo
        ─▶ postgres (the embedded PostgreSQL) ─ stack (SMTP sink of sink, the local Slack, GitHub and GitLab
           APIs of apis, Prefect server, deployments, exporter, workers) ─▶ the workload and the posts of
           posts ─▶ its summary

The tests and the benchmarks use its parts too: the SMTP sink with its faults, the embedded PostgreSQL
and the process supervisor.
"""
