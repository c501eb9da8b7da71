"""Passwords never shown: where a password stands in a database URL or a driver's message, and the text
with it as ***. Standard library only, so the `outbox` command loads it before anything else.

    a URL ─ passwords_in ─▶ every string that may be its password (as written, decoded, however it parses)
    text + the passwords known ─ hide ─▶ the text with each of them as ***, wherever it stands
    text ─ hide_credentials ─▶ the password of each URL in it (user:password@) and each password=... as ***
    text ─ hide_url_secrets ─▶ each URL in it with its user information's secret and its query as ***

`engines.shown_url` renders a URL through `hide_credentials`, `engines.fault_text` passes a driver's
message through both, and the commands pass every line they print through `hide` with the passwords of
the database URLs they were given. `log_records` passes every log record of a process outbox starts
through `hide_url_secrets` and `hide_credentials`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

MASK = "***"
# shorter passwords are not looked for in free text (replacing them would garble every line)
MIN_SECRET_LENGTH = 4

# the password of user:password@ (up to the last @ before the path: a password may hold an @ as it is), and
# the value of a password parameter (password, sslpassword): in a URL's query up to the next &, in a
# connection string up to a space
_CREDENTIALS = re.compile(
    r"(?P<user>://[^/@:\s]*:)[^/\s]*@|(?P<query>[?&](?:ssl)?password=)[^&#\s]*|(?P<conninfo>password\s*=\s*)\S+",
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


# a URL: its scheme, its authority (user information, host, port), its path, then its query and fragment, up
# to the next white space (a quote or a bracket may stand inside a query, so none ends one) but for the
# punctuation that ends a sentence or a quotation before it (`url: 200`, `'url'.`)
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#\s]*)(?P<path>[^?#\s]*)"
    r"(?P<after>[?#]\S*?)?(?=[,.;:!)\]}'\"]*(?:\s|$))"
)
# the schemes of a database URL: its query holds connection options (host, port, sslmode), of which only the
# password parameters are hidden
_DATABASE_SCHEMES = ("postgresql", "postgres")


def hide_url_secrets(text: str) -> str:
    """`text` with each URL's query and fragment as ***, the password of its user information as *** and
    a user information without a password (a token, as in `nats://TOKEN@host` or `https://TOKEN:@host`) as
    *** whole: `https://h/p?token=x` ─▶ `https://h/p?***`, `smtp://user:pw@h` ─▶ `smtp://user:***@h`. The
    path is kept. A PostgreSQL URL keeps its user name and its query (`?host=/run/pg` says where the
    database is), but for the values of its password and sslpassword parameters. A URL ends at white space
    (a secret written with a space in it unescaped is hidden up to that space); the punctuation that closes
    a sentence or a quotation before that space is kept."""
    return _URL.sub(_url_shown, text)


def _url_shown(match: re.Match[str]) -> str:
    database = match.group("scheme").lower().partition(":")[0].partition("+")[0] in _DATABASE_SCHEMES
    user_info, at, host = match.group("authority").rpartition("@")
    if at:
        user, _, password = user_info.partition(":")
        user_info = f"{user}:{MASK}" if password else user if database else MASK
    after = match.group("after") or ""
    if database:
        after = _CREDENTIALS.sub(_masked, after)
    elif after:
        after = f"{after[0]}{MASK}"
    return f"{match.group('scheme')}{user_info}{at}{host}{match.group('path')}{after}"


def _masked(match: re.Match[str]) -> str:
    kept = match.group("user") or match.group("query") or match.group("conninfo")
    return f"{kept}{MASK}@" if match.group("user") else f"{kept}{MASK}"
