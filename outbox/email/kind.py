"""The EMAIL kind: its declaration, registered when `outbox` is imported (this module imports nothing more
than the kinds' registry, so it loads neither SMTP nor the database layer).

    import outbox ──▶ outbox.email.kind ──ActionKind.register("EMAIL", ...)──▶ ActionKind.EMAIL

EMAIL is at most once (a relay cannot be asked whether it already took a message) and may run at instance
level or in a workspace: each notice decides. Its payload check is the notices' (`outbox.email.notice`),
loaded on the first enqueue of an email. Migration 0007 writes the same declaration as EMAIL's row of
`agent_action_kind`. Its destination is `smtp`: the relay the executor's settings name.
"""

from __future__ import annotations

from outbox.kinds import ActionKind

EMAIL = ActionKind.register(
    "EMAIL",
    at_most_once=True,
    instance_level=True,
    payload_check="outbox.email.notice:check_payload",
    destination="smtp",
)
ActionKind.EMAIL = EMAIL
