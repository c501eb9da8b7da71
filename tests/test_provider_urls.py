"""The API URL a GitHub account or a GitLab host may be registered with, tried as an attacker would."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox._internal.checks.provider_urls import check_api_url, is_loopback
from outbox.gitlab.hosts import check_url as gitlab_url

PIECES = st.sampled_from(
    ["https://", "http://", "gitlab.example.com", "127.0.0.1", "[::1]", "localhost", "evil.example", ":443",
     ":0", ":99999", "/api", "?token=x", "#x", "@", "user:pw@", " ", "\u00e9", "..", "%2F", "\\", "/"]
)  # fmt: skip


@given(st.lists(PIECES, max_size=8).map("".join) | st.text(max_size=60))
def test_an_accepted_url_never_sends_a_token_in_clear_or_elsewhere(url: str) -> None:
    try:
        check_api_url("GitLab host main", url)
    except ValueError as refused:
        assert str(refused).startswith("url: GitLab host main's url ")
        return
    parts = urlsplit(url)
    assert parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.hostname or ""))
    # no user part (an "@" may stand in the path), no query, no fragment
    assert "@" not in parts.netloc and "?" not in url and "#" not in url and url.isascii()


def test_an_at_sign_in_the_path_is_no_user_part() -> None:
    check_api_url("GitLab host main", "https://https://@")  # host "https", path "//@": nothing sent elsewhere


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://gitlab.example.com", "must be https"),
        ("https://user:pw@gitlab.example.com", "no user or password"),
        ("https://gitlab.example.com/?private_token=x", "no query or fragment"),
        ("https://gitlab.example.com:0", "a port from 1 to 65535"),
        ("gitlab.example.com", "must be absolute"),
        (42, "must be text, not a int"),
    ],
)
def test_a_refused_url_names_the_host_and_the_rule(url: object, why: str) -> None:
    with pytest.raises(ValueError, match=f"^url: GitLab host main's url .*{why}"):
        gitlab_url("main", url)


def test_http_reaches_a_loopback_address_only() -> None:
    for url in ("http://127.0.0.1:8080/api/v4", "http://[::1]:8080", "http://localhost"):
        check_api_url("GitLab host main", url)
