"""The kinds of action: one registry that names each kind and the two facts the database must agree with.

A kind declares whether it is at most once (it cannot read back, so the database refuses to reclaim it
after its write started) and where it may run: in a workspace, at instance level (no workspace), or both.
The production migration lists `EMAIL`; `tests/test_kinds.py` checks that `ck_agent_action_kind`,
`ck_agent_action_workspace` and `guard_agent_action` list exactly what this registry declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from outbox.errors import InvalidRequest


@dataclass(frozen=True)
class ActionKind:
    """One kind of effect. Register it once; every kind has exactly one adapter.

    `instance_level`: the action may have no workspace (such as an email to an account).
    `workspace_level`: the action may belong to a workspace. EMAIL is both: each notice decides.
    """

    name: str
    at_most_once: bool
    instance_level: bool
    workspace_level: bool = True

    _registry: ClassVar[dict[str, ActionKind]] = {}
    EMAIL: ClassVar[ActionKind]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def register(
        cls, name: str, *, at_most_once: bool, instance_level: bool, workspace_level: bool = True
    ) -> ActionKind:
        """Add a kind (step 1 of "Add a kind"). Registering the same declaration again is harmless."""
        if not name or not name.isupper() or not name.replace("_", "").isalnum():
            raise ValueError(f"kind name {name!r} must be upper case letters, digits and underscores")
        if not (instance_level or workspace_level):
            raise ValueError(f"kind {name} must allow instance level, workspace level or both")
        kind = cls(name, at_most_once, instance_level, workspace_level)
        known = cls._registry.get(name)
        if known is not None and known != kind:
            raise ValueError(f"kind {name} is already registered as {known!r}")
        cls._registry[name] = kind
        return kind

    @classmethod
    def get(cls, name: str) -> ActionKind:
        kind = cls._registry.get(name)
        if kind is None:
            known = ", ".join(sorted(cls._registry))
            raise InvalidRequest("kind", f"unknown action kind {name!r} (known kinds: {known})")
        return kind

    @classmethod
    def all(cls) -> tuple[ActionKind, ...]:
        return tuple(sorted(cls._registry.values(), key=lambda k: k.name))


ActionKind.EMAIL = ActionKind.register("EMAIL", at_most_once=True, instance_level=True)

# The kinds the production migration declares; a test kind is never among them.
PRODUCTION_KINDS = frozenset({"EMAIL"})
