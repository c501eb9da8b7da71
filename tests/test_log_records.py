"""A URL's secret never reaches a log line: `hide_url_secrets` over arbitrary URLs in arbitrary text, and the
record factory over the shapes a library's record takes (a URL object as an argument, a URL built from two
arguments, a traceback, a mapping, a `%d`, arguments that do not suit the format).

Properties run derandomized (the `logs-ci` profile, 300 examples); `HYPOTHESIS_PROFILE=long` runs 5,000.
"""

from __future__ import annotations

import io
import logging
import os
import string
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox._internal.redaction.log_records import hide_secrets_in_logs
from outbox._internal.redaction.masking import MASK, hide_url_secrets

_HEALTH = [HealthCheck.too_slow]
settings.register_profile(
    "logs-ci", derandomize=True, max_examples=300, deadline=None, database=None, suppress_health_check=_HEALTH
)
settings.register_profile("logs-long", max_examples=5_000, deadline=None, database=None, suppress_health_check=_HEALTH)
PROFILE = settings.get_profile("logs-long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "logs-ci")

# every secret starts with MARK, which no other part of a generated text can hold (none holds an upper case
# letter), so finding MARK finds a secret
MARK = "ZK"
# RFC 3986: what a query or fragment holds as sent (pct-encoded included: % and hex digits) and what user
# information holds (no @, no /, ? or #)
UNRESERVED = string.ascii_letters + string.digits + "-._~"
SUB_DELIMS = "!$&'()*+,;="
QUERY_CHARS = UNRESERVED + SUB_DELIMS + ":@/?%"
USERINFO_CHARS = UNRESERVED + SUB_DELIMS + "%"
LOWER = string.ascii_lowercase + string.digits


def secret(alphabet: str) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=1, max_size=30).map(lambda rest: MARK + rest)


schemes = st.sampled_from(["http", "https", "nats", "smtp", "redis", "amqp", "Foo.bar+baz"])
database_schemes = st.sampled_from(["postgresql", "postgresql+psycopg", "postgres"])
hosts = st.one_of(
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}", fullmatch=True),
    st.sampled_from(["127.0.0.1", "[::1]", "[2001:db8::1]"]),
)
ports = st.one_of(st.just(""), st.integers(1, 65535).map(lambda port: f":{port}"))
paths = st.lists(st.text(alphabet=LOWER + "-._~!$'()*+,;=:@%", max_size=12), max_size=4).map(
    lambda parts: "".join("/" + part for part in parts)
)
users = st.text(alphabet=LOWER + "-._~", min_size=1, max_size=12)
# the text around a URL: no upper case letter, and white space between it and the URL
around = st.text(alphabet=st.characters(blacklist_categories=["Lu", "Lt", "Cs"]), max_size=30)
# what may close a sentence or a quotation right after a URL
closing = st.text(alphabet=",.;:!)]}'\"", max_size=3)


@st.composite
def urls_with_secrets(draw: st.DrawFn) -> str:
    """A URL holding a secret in its query, its fragment, its user information's password or its token."""
    places = draw(st.sets(st.sampled_from(["query", "fragment", "password", "token"]), min_size=1))
    user_info = ""
    if "password" in places:
        user_info = f"{draw(users)}:{draw(secret(USERINFO_CHARS + ':'))}@"
    elif "token" in places:
        user_info = f"{draw(secret(USERINFO_CHARS))}@"
    query = f"?{draw(st.text(alphabet=LOWER, max_size=8))}={draw(secret(QUERY_CHARS))}" if "query" in places else ""
    fragment = f"#{draw(secret(QUERY_CHARS + '#'))}" if "fragment" in places else ""
    return f"{draw(schemes)}://{user_info}{draw(hosts)}{draw(ports)}{draw(paths)}{query}{fragment}"


@PROFILE
@given(before=around, url=urls_with_secrets(), closed=closing, after=around)
def test_no_secret_of_a_url_is_left_wherever_it_stands(before: str, url: str, closed: str, after: str) -> None:
    text = f"{before} {url}{closed} {after}"
    hidden = hide_url_secrets(text)
    assert MARK not in hidden
    assert MASK in hidden
    assert hidden.endswith(f"{closed} {after}")


@PROFILE
@given(
    scheme=database_schemes,
    user=users,
    password=secret(USERINFO_CHARS + ":"),
    host=hosts,
    parameter=st.sampled_from(["password", "sslpassword", "PASSWORD"]),
    value=secret(UNRESERVED + "%"),
)
def test_a_database_url_keeps_its_user_and_options_but_never_its_password(
    scheme: str, user: str, password: str, host: str, parameter: str, value: str
) -> None:
    url = f"{scheme}://{user}:{password}@{host}/outbox?host=%2Frun%2Fpg&{parameter}={value}&sslmode=require"
    hidden = hide_url_secrets(f"connecting to {url}: ok")
    assert MARK not in hidden
    assert f"{scheme}://{user}:{MASK}@{host}/outbox?host=%2Frun%2Fpg&{parameter}={MASK}&sslmode=require: ok" in hidden


@PROFILE
@given(
    before=around,
    scheme=schemes,
    host=hosts,
    port=ports,
    path=paths,
    after=around,
)
def test_a_url_without_a_secret_is_left_as_it_is(
    before: str, scheme: str, host: str, port: str, path: str, after: str
) -> None:
    text = f"{before} {scheme}://{host}{port}{path} {after}"
    assert hide_url_secrets(text) == text


def test_what_is_kept_of_a_url() -> None:
    assert (
        hide_url_secrets("POST https://hooks.example.com/a/b?token=x&y=1 ok")
        == "POST https://hooks.example.com/a/b?*** ok"
    )
    assert hide_url_secrets("smtp://mailer:pw@relay:587") == f"smtp://mailer:{MASK}@relay:587"
    assert hide_url_secrets("nats://s3cret@nats:4222,nats://other") == f"nats://{MASK}@nats:4222,nats://other"
    assert hide_url_secrets("https://apikey:@api.example.com/") == f"https://{MASK}@api.example.com/"
    assert hide_url_secrets("GET 'https://h/x?q=1'.") == f"GET 'https://h/x?{MASK}'."
    assert hide_url_secrets("postgresql://outbox@db/outbox?host=%2Frun") == "postgresql://outbox@db/outbox?host=%2Frun"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """A logger `t` at DEBUG writing to a buffer, with the hiding record factory; both set back after."""
    factory = logging.getLogRecordFactory()
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("t")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    hide_secrets_in_logs()
    hide_secrets_in_logs()  # a second call changes nothing
    yield written
    logging.setLogRecordFactory(factory)
    logger.removeHandler(handler)


def test_every_shape_of_a_record_is_hidden(lines: io.StringIO) -> None:
    log = logging.getLogger("t")
    url = httpx.URL("https://user:ZKpassword@hooks.example.com/in?token=ZKtoken")
    log.info('HTTP Request: %s %s "%s %d %s"', "POST", url, "HTTP/1.1", 200, "OK")
    log.debug("%r", url)
    log.info("%s%s", "https://hooks.example.com/in?tok", "en=ZKsplit")
    log.info("%(url)s answered", {"url": "nats://ZKtoken@127.0.0.1:4222"})
    log.warning(f"an f-string holding https://h/?ZKinline and %d{''}", 3)
    try:
        raise httpx.HTTPStatusError("failed for url 'https://h/x?key=ZKtraceback'", request=None, response=None)  # type: ignore[arg-type]
    except httpx.HTTPStatusError:
        log.exception("the call failed")
    log.info("nothing to hide: %d attempts at %s", 2, "https://hooks.example.com/in")
    written = lines.getvalue()
    assert MARK not in written, written
    assert 'HTTP Request: POST https://user:***@hooks.example.com/in?*** "HTTP/1.1 200 OK"' in written
    assert "nothing to hide: 2 attempts at https://hooks.example.com/in" in written
    assert "Traceback (most recent call last)" in written and "the call failed" in written


def test_a_record_without_a_secret_keeps_its_format_and_arguments(lines: io.StringIO) -> None:
    made: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = made.append  # type: ignore[method-assign]
    logger = logging.getLogger("t")
    logger.addHandler(handler)
    try:
        logger.info("%s %d", "https://h/p", 4)
        logger.info("%s %d", "https://h/p?q=1", 4)
        logger.info("%d attempts", "https://h/p?q=ZKwrong")  # arguments that do not suit the format
    finally:
        logger.removeHandler(handler)
    assert (made[0].msg, made[0].args) == ("%s %d", ("https://h/p", 4))
    assert (made[1].msg, made[1].args) == ("https://h/p?*** 4", ())
    assert (made[2].msg, made[2].args) == ("%d attempts (arguments that do not suit it: ('https://h/p?***',))", ())
