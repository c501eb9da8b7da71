"""EventDefinition: what every kind's event definition shares (EmailNotice, WebhookEvent, NatsEvent).

    event (identifiers) ──params──▶ the kind's query ──rows / rows_async──▶ rows ──the kind's compose──▶ what goes
    event ──lane_key, idempotency_key, workspace_id, subject_account_id──▶ request ──▶ ActionRequest
                                                        payload: {<the kind's key>: name, "event": event}

A kind's class subclasses it, sets `_kind` (its ActionKind) and `_name_key` (the payload's key that names the
definition: "notice" or "event_type"), and says which query its rows come from (`_rows_query`); it adds only
what is its own: its query attribute, `compose`, what it sends and how it is registered. An application
subclasses the kind's class, never this one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import TextClause

from outbox._internal.connections.engines import answered_connection
from outbox.kinds import ActionKind
from outbox.requests import ActionRequest
from outbox.store.caller import AsyncConn, SyncConnection, fetch, fetch_async

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


class EventDefinition(ABC):
    """One type of effect of one kind, declared by its identifiers. `event` is always the JSON object of
    identifiers the action's payload holds."""

    # the kind's: the action's kind, and the payload's key that holds `name`
    _kind: ClassVar[ActionKind]
    _name_key: ClassVar[str]

    # stored in every payload and the trace; never change it while actions of it may be pending
    name: ClassVar[str]
    # True: the action belongs to a workspace (workspace_id from the event); False: to none
    workspace_scoped: ClassVar[bool]

    @abstractmethod
    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        """The query's parameters from the event; raise InvalidRequest for an event that is malformed. Also the
        kind's check of the event at enqueue, so check here every identifier the other methods read."""

    @abstractmethod
    def idempotency_key(self, event: dict[str, Any]) -> str:
        """The action's idempotency key: one per effect (the id a receiver deduplicates by derives from it)."""

    @abstractmethod
    def lane_key(self, event: dict[str, Any]) -> str:
        """The action's lane: the actions of one lane are carried out one at a time, in the order enqueued."""

    @abstractmethod
    def _rows_query(self) -> TextClause | None:
        """The kind's query for the rows compose reads; None: no rows."""

    def workspace_id(self, event: dict[str, Any]) -> int | None:
        """The action's workspace: `event["workspace_id"]` when the definition is workspace-scoped, else None."""
        return int(event["workspace_id"]) if self.workspace_scoped else None

    def subject_account_id(self, event: dict[str, Any]) -> int | None:
        """The account the action is about (erasing it deletes the action); None by default, as for a group."""
        return None

    def rows(self, conn: SyncConnection, event: dict[str, Any]) -> Sequence[Mapping[str, Any]]:
        """The rows the query finds now on the caller's connection (none without a query); `params` runs
        either way, as the check of the event."""
        params, query = self.params(event), self._rows_query()
        return [] if query is None else fetch(conn, query, params)

    async def rows_async(self, conn: AsyncConn, event: dict[str, Any]) -> Sequence[Mapping[str, Any]]:
        """`rows` on an async connection (as the adapter runs it before every attempt)."""
        params, query = self.params(event), self._rows_query()
        return [] if query is None else await fetch_async(conn, query, params)

    async def rows_from(self, engine: AsyncEngine, event: dict[str, Any]) -> Sequence[Mapping[str, Any]]:
        """`rows_async` on a connection of `engine` taken for the query alone: without a query, none is taken
        (an adapter calls it before every attempt, and a connection is a pool's checkout and return)."""
        params, query = self.params(event), self._rows_query()
        if query is None:
            return []
        async with answered_connection(engine) as conn:
            return await fetch_async(conn, query, params)

    def request(self, event: dict[str, Any], *, max_attempts: int = 5) -> ActionRequest:
        """The action's request for `event`, from the methods above."""
        return ActionRequest(
            kind=self._kind,
            lane_key=self.lane_key(event),
            idempotency_key=self.idempotency_key(event),
            payload={self._name_key: self.name, "event": event},
            workspace_id=self.workspace_id(event),
            subject_account_id=self.subject_account_id(event),
            max_attempts=max_attempts,
        )
