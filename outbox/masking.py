"""Passwords never shown: where a password stands in a database URL or a driver's message, and the text
with it as ***. Standard library only, so the `outbox` command loads it before anything else.

    a URL ─ passwords_in ─▶ every string that may be its password (as written, decoded, however it parses)
    text + the passwords known ─ hide ─▶ the text with each of them as ***, wherever it stands
    text ─ hide_credentials ─▶ the password of each URL in it (user:password@) and each password=... as ***

`outbox.db.shown_url` renders a URL through `hide_credentials`, `outbox.db.fault_text` passes a driver's
message through both, and the commands pass every line they print through `hide` with the passwords of
the database URLs they were given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

MASK = "***"
# shorter passwords are not looked for in free text (replacing them would garble every line)
MIN_SECRET_LENGTH = 4

# the password of user:password@ (up to the last @ before the path: a password may hold an @ as it is), and
# the value of a password parameter: in a URL's query up to the next &, in a connection string up to a space
_CREDENTIALS = re.compile(
    r"(?P<user>://[^/@:\s]*:)[^/\s]*@|(?P<query>[?&]password=)[^&#\s]*|(?P<conninfo>password\s*=\s*)\S+",
    re.IGNORECASE,
)


def passwords_in(url: str) -> set[str]:
    """Every string of at least MIN_SECRET_LENGTH characters that may be the password of `url`, as written
    and decoded, however it parses."""
    rest = url.partition("://")[2] or url
    found: set[str] = set()
    for end in (rest.find("@"), rest.rfind("@")):
        if end > 0:
            found.add(rest[:end].partition(":")[2])
    _, _, query = rest.partition("?")
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if unquote(name).strip().lower() == "password":
            found.add(value)
    found |= {unquote(secret) for secret in found} | {unquote(secret.replace("+", " ")) for secret in found}
    return {secret for secret in found if len(secret) >= MIN_SECRET_LENGTH}


def hide(text: str, secrets: Iterable[str]) -> str:
    """`text` with each of `secrets` replaced by ***, the longest first (one may hold another)."""
    for secret in sorted({secret for secret in secrets if secret}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def hide_credentials(text: str) -> str:
    """`text` with every password that stands where a URL or a connection string puts one as ***."""
    return _CREDENTIALS.sub(_masked, text)


def _masked(match: re.Match[str]) -> str:
    kept = match.group("user") or match.group("query") or match.group("conninfo")
    return f"{kept}{MASK}@" if match.group("user") else f"{kept}{MASK}"
