"""The adapter contract: one adapter per kind, called only by the executor; and how a process finds its
adapters (`module:factory`, as `outbox run --adapters` and the drain flow name them)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.executor.attempt import ActionAttempt
from outbox.executor.results import Result
from outbox.kinds import ActionKind


class ActionAdapter(Protocol):
    """Carries out actions of one kind. Call `attempt.fence().begin_write()` just before the provider
    call, never call the provider when it refuses (return Abandoned), and end the provider call before
    the window's deadline. Only `Executor` calls `execute`."""

    @property
    def kind(self) -> ActionKind: ...

    async def execute(self, attempt: ActionAttempt) -> Result: ...


AdapterFactory = Callable[[AsyncEngine], Iterable[ActionAdapter]]


async def close_adapters(adapters: Iterable[ActionAdapter]) -> None:
    """Close each adapter that holds connections of its own (an `aclose` coroutine: an HTTP client's pool, a
    thread pool), once its executor has ended; a close that fails is logged and the others still close."""
    for adapter in adapters:
        aclose = getattr(adapter, "aclose", None)
        if aclose is None:
            continue
        try:
            await aclose()
        except Exception as error:
            logging.getLogger("outbox.executor").warning("%s adapter: closing it failed: %r", adapter.kind.name, error)


def load_adapters(spec: str) -> AdapterFactory:
    """`module:factory`, where factory(engine) returns the adapters, one per kind; or several, separated by
    commas (`outbox.email:email_adapters,outbox.webhook:webhook_adapters`), whose adapters are joined.
    Importing each module is where an application registers its kinds, email notices and webhook events.

    The working folder comes first on the module path, as uvicorn, gunicorn and celery put it: `outbox run
    --adapters myapp.outbox:adapters` finds `myapp` in the folder it is started from, with no PYTHONPATH."""
    factories = [_factory(part.strip()) for part in spec.split(",")]
    if len(factories) == 1:
        return factories[0]
    return lambda engine: [adapter for factory in factories for adapter in factory(engine)]


def _factory(spec: str) -> AdapterFactory:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--adapters must look like module:factory[,module:factory...], not {spec!r}")
    working_folder = os.getcwd()
    if working_folder not in sys.path:
        sys.path.insert(0, working_folder)
    try:
        factory: AdapterFactory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--adapters {spec}: {error}") from None
    return factory
