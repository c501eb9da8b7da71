"""The kinds of action: one registry that names each kind and the two facts the database must agree with.

A kind declares whether it is at most once (it cannot read back, so the database refuses to reclaim it
after its write started) and where it may run: in a workspace, at instance level (no workspace), or both.
The database holds the same declaration as a row of `agent_action_kind` (step 2 of "Add a kind"), and
`tests/test_kinds.py` checks that the rows declare exactly what this registry declares. This module names
no kind: each kind registers itself in its own module (`EMAIL` in `outbox.email.kind`, which importing
`outbox` loads).

A kind may declare its own retry schedule, the waits after its first, second, ... retry (`retry_schedule`,
in seconds; the last one repeats); without one, a retry waits the executor's exponential backoff
(`outbox.executor.backoff`). A schedule is the code's alone: the database row does not hold it.

A kind may also name a payload check, `"module:function"`:

    validate(request) --generic checks--> kind.check_payload(payload) --first use--> import module, find function
                                                                     --> function(payload): returns, or raises
                                                                         InvalidRequest naming the field

The check is named by a string, loaded on first use, so a kind stays a frozen, comparable declaration and
the module that holds the check may itself import outbox.

Every action has a destination: where its effect goes (the SMTP relay, the NATS servers, a webhook endpoint),
the unit that a provider's slow-down pauses and a rate paces (outbox.executor.destinations). A kind names its
destination (`destination`, by default its name in lower case); a payload check that returns a name sets the
action's own instead (WEBHOOK's returns its event's endpoint, `webhook:<endpoint>`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from outbox.errors import InvalidRequest

PayloadCheck = Callable[[Any], object]

# A kind's name: upper case ASCII letters, digits and underscores, at least one letter. The table
# agent_action_kind checks the same rule (ck_agent_action_kind_name).
_NAME = re.compile(r"[A-Z0-9_]*[A-Z][A-Z0-9_]*")
# A destination's name; agent_destination and agent_action check the same rule (revision 0017).
_DESTINATION = re.compile(r"[a-z0-9_][a-z0-9_.:-]{0,79}")


def is_destination_name(name: object) -> bool:
    """Whether `name` may name a destination: 1 to 80 lower case letters, digits, `_`, `-`, `.` and `:`,
    not starting with `-`, `.` or `:`."""
    return isinstance(name, str) and _DESTINATION.fullmatch(name) is not None


def is_kind_name(name: str) -> bool:
    """Whether `name` may name a kind: upper case letters A to Z, digits and underscores, at least one letter."""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class ActionKind:
    """One kind of effect. Register it once; every kind has exactly one adapter.

    `instance_level`: the action may have no workspace (such as an email to an account).
    `workspace_level`: the action may belong to a workspace. A kind may allow both.
    `payload_check`: `"module:function"`, called with the payload at enqueue after the generic checks;
    the function raises InvalidRequest to refuse the payload.
    `retry_schedule`: the seconds the first, second, ... retry waits (the last repeats), each up to 10 %
    longer at random; None: the exponential backoff every other kind waits.
    `destination`: where the kind's actions go, unless the payload check returns another name.
    """

    name: str
    at_most_once: bool
    instance_level: bool
    workspace_level: bool = True
    payload_check: str | None = None
    retry_schedule: tuple[float, ...] | None = None
    destination: str = ""

    _registry: ClassVar[dict[str, ActionKind]] = {}
    # the public name of a kind outbox brings, set by the kind's own module (outbox.email.kind)
    EMAIL: ClassVar[ActionKind]
    WEBHOOK: ClassVar[ActionKind]
    NATS_EVENT: ClassVar[ActionKind]
    SLACK_MESSAGE: ClassVar[ActionKind]
    GITHUB_POST: ClassVar[ActionKind]
    GITLAB_POST: ClassVar[ActionKind]

    def __str__(self) -> str:
        return self.name

    def check_payload(self, payload: Any) -> str:
        """Run the kind's payload check, if it declares one; it raises InvalidRequest to refuse. Returns the
        action's destination: the name the check returned, or else the kind's."""
        found = _loaded_check(self.payload_check)(payload) if self.payload_check is not None else None
        if found is None:
            return self.destination
        if not is_destination_name(found):
            raise ValueError(f"kind {self.name}: its payload check returned {found!r}, not a destination name")
        return str(found)

    @classmethod
    def register(
        cls,
        name: str,
        *,
        at_most_once: bool,
        instance_level: bool,
        workspace_level: bool = True,
        payload_check: str | None = None,
        retry_schedule: tuple[float, ...] | None = None,
        destination: str | None = None,
    ) -> ActionKind:
        """Add a kind (step 1 of "Add a kind"). Registering the same declaration again is harmless."""
        if not is_kind_name(name):
            raise ValueError(
                f"kind name {name!r} must be upper case letters (A to Z), digits and underscores, with a letter"
            )
        if not (instance_level or workspace_level):
            raise ValueError(f"kind {name} must allow instance level, workspace level or both")
        if payload_check is not None and not _is_check_path(payload_check):
            raise ValueError(f"kind {name}: payload_check {payload_check!r} must be 'module:function'")
        if retry_schedule is not None and (
            not retry_schedule or not all(isinstance(s, int | float) and 0 <= s < 10**7 for s in retry_schedule)
        ):
            raise ValueError(f"kind {name}: retry_schedule must be one or more waits of 0 to 10^7 seconds")
        destination = name.lower() if destination is None else destination
        if not is_destination_name(destination):
            raise ValueError(
                f"kind {name}: destination {destination!r} must be 1 to 80 lower case letters, digits, _, -, . and :"
            )
        kind = cls(name, at_most_once, instance_level, workspace_level, payload_check, retry_schedule, destination)
        known = cls._registry.get(name)
        if known is not None and known != kind:
            raise ValueError(f"kind {name} is already registered as {known!r}")
        cls._registry[name] = kind
        return kind

    @classmethod
    def get(cls, name: object) -> ActionKind:
        """The registered kind called `name`; InvalidRequest for any other value."""
        kind = cls._registry.get(name) if isinstance(name, str) else None
        if kind is None:
            known = ", ".join(sorted(cls._registry))
            raise InvalidRequest("kind", f"unknown action kind {_shown_name(name)} (known kinds: {known})")
        return kind

    @classmethod
    def all(cls) -> tuple[ActionKind, ...]:
        return tuple(sorted(cls._registry.values(), key=lambda k: k.name))


def _is_check_path(path: object) -> bool:
    if not isinstance(path, str):
        return False
    module, colon, function = path.partition(":")
    return bool(colon) and all(part.isidentifier() for part in module.split(".")) and function.isidentifier()


@cache
def _loaded_check(path: str) -> PayloadCheck:
    module_name, _, function_name = path.partition(":")
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        raise ImportError(f"the payload check {path!r} names nothing callable in {module_name}")
    return function  # type: ignore[no-any-return]


def _shown_name(name: object) -> str:
    if not isinstance(name, str):
        return f"(a {type(name).__name__}, not a name)"
    shown = repr(name)
    return shown if len(shown) <= 80 else shown[:76] + "...'"
