"""Where a credential comes from when the code gives none: its environment variable, then the sources the
application added, in order. One rule for the webhook endpoints' secrets, the Slack workspaces' and GitLab hosts'
tokens and the GitHub accounts' secrets, so that each looks, and says where it looked, the same way.

    the owner's lookup (given in code? it checks that first) ─▶ Sources.find(name, variable, owner, error)
        the variable set ─▶ (its value, the variable's name)
        else each source added, in order: source(name) ─▶ (its value, its label), or None: the next one;
             a source that raises ─▶ error("<owner>: <its label> failed (<the exception's type>)"), never
             the exception's message, which may hold the credential
        else None ─▶ the owner's error names every place asked: the code, the variable, asked(name)
"""

from __future__ import annotations

import os
from collections.abc import Callable

# a function of an owner's name (an endpoint's, a workspace's, ...): its credential, or None
Source = Callable[[str], str | None]
# a function of an owner's name: where a source looks, as an error names it
SourceLabel = Callable[[str], str]


class Sources:
    """The sources of one credential of a kind (`what`: "secret", "token"), asked in the order added."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._added: list[tuple[Source, SourceLabel]] = []

    def add(self, source: Source, label: SourceLabel | None = None) -> None:
        """Ask `source` after those added before it; a source added again is asked once. Without a label, an
        error names it `the <what> source <its name>`."""
        if all(source is not known for known, _ in self._added):
            self._added.append((source, label or self._named(source)))

    def find(
        self, name: str, variable: str, *, owner: str, error: Callable[[str], Exception]
    ) -> tuple[str, str] | None:
        """The credential of `name` and where it was found: the variable, else the first source that gives one. A
        source that raises is `error`, its line naming the `owner` (`Slack workspace acme`) and the source."""
        found = os.environ.get(variable)
        if found is not None:
            return found, variable
        for source, label in self._added:
            where = label(name)
            try:
                found = source(name)
            except Exception as failed:
                raise error(f"{owner}: {where} failed ({type(failed).__name__})") from None
            if found is not None:
                return found, where
        return None

    def asked(self, name: str) -> list[str]:
        """Where the sources look for `name`'s credential, in the order they are asked."""
        return [label(name) for _, label in self._added]

    def _named(self, source: Source) -> SourceLabel:
        shown = f"the {self._what} source {getattr(source, '__qualname__', type(source).__name__)}"
        return lambda _name: shown
