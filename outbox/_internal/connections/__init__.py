"""How outbox reaches its database and the providers: engines and URLs (engines), how a database connection
opens (opening), which errors are faults of outbox's own database (faults), the HTTP connection pools (network)."""
