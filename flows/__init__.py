"""The Prefect flows: thin wrappers over `outbox` that run its executor and its purge on a schedule."""
