"""The optional parts of outbox and the extra that installs each.

A module of an optional part imports its third-party packages inside `needs(extra)`. When one of them is
missing, the import fails with one line that names the extra and the command that installs it, instead
of `No module named 'httpx'`:

    import outbox.webhook.adapter ──▶ with needs("webhook"): import httpx ──missing──▶ MissingExtra
    outbox run --adapters outbox.webhook:webhook_adapters ──▶ the same line, exit 2
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from outbox.errors import OutboxError

# each extra's part of outbox and the top-level modules it installs (pyproject.toml's optional dependencies)
EXTRAS = {
    "webhook": ("outbox.webhook", ("httpx", "standardwebhooks")),
    "nats": ("outbox.nats", ("nats",)),
    "slack": ("outbox.slack", ("slack_sdk", "aiohttp")),
    "github": ("outbox.github", ("githubkit", "hishel")),
    "gitlab": ("outbox.gitlab", ("gitlab",)),
}


class MissingExtra(OutboxError, ImportError):
    """A module of an optional part of outbox is imported without the extra that part needs."""

    def __init__(self, extra: str, module: str) -> None:
        part, _ = EXTRAS[extra]
        super().__init__(f"{part} needs the {extra} extra ({module} missing): pip install 'outbox[{extra}]'")
        self.extra = extra
        self.name = module


@contextmanager
def needs(extra: str) -> Iterator[None]:
    """Imports of the packages `extra` installs: a missing one raises MissingExtra; any other error as is."""
    _, modules = EXTRAS[extra]
    try:
        yield
    except ModuleNotFoundError as missing:
        top = (missing.name or "").partition(".")[0]
        if top not in modules:
            raise
        raise MissingExtra(extra, top) from None
