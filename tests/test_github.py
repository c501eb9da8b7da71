"""The GITHUB_POST kind through githubkit against the local GitHub API (demo/github_api.py) and the real database.

Each test registers the `acme` account at a server of its own (a fresh registry per test), enqueues through
`enqueue_comment`, `enqueue_review` or `enqueue_issue`, attempts once or drains, and asserts the action's row
and exactly what the server stored: one post per action, whatever the network did in between.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from githubkit.exception import RequestFailed
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.github_api import HEAD_SHA, GithubApi
from outbox import InvalidRequest
from outbox._internal.config.credentials import Sources
from outbox.executor import ActionAdapter, CredentialsRefused, Executor, Failed, Result, Retry, SlowDown
from outbox.github import (
    BODY_LIMIT,
    GithubAdapter,
    GithubSecretError,
    add_secret_source,
    check_payload,
    enqueue_comment,
    enqueue_issue,
    enqueue_review,
    github_adapters,
    marker,
    register_account,
)
from outbox.github import accounts as account_registry
from outbox.github.accounts import account_secret
from outbox.github.adapter import answer_of
from outbox.github.posts import check_repo
from outbox.github.replies import RULES, Answer, Rule, classify, markdown_rows
from outbox.testing import drain
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "ghp_" + "a1" * 18
REPO = "acme/web"


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers its own accounts and secret sources."""
    monkeypatch.setattr(account_registry, "_ACCOUNTS", {})
    monkeypatch.setattr(account_registry, "_SOURCES", Sources("secret"))
    for name in [name for name in os.environ if name.startswith("OUTBOX_GITHUB_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def api() -> Iterator[GithubApi]:
    server = GithubApi(tokens=[TOKEN]).start()
    server.add_repo(REPO, pulls=range(1, 4), issues=[10])
    yield server
    server.stop()


@pytest.fixture
def acme(api: GithubApi) -> GithubApi:
    register_account("acme", url=api.url, token=TOKEN, rate="50/s")  # the pace is not what these tests test
    return api


@pytest_asyncio.fixture(loop_scope="function")
async def adapters(aengine: AsyncEngine) -> AsyncIterator[Callable[..., GithubAdapter]]:
    """`make(request_seconds=2)`: an adapter on the test's database, closed after the test."""
    made: list[GithubAdapter] = []

    def make(request_seconds: float = 2.0) -> GithubAdapter:
        made.append(GithubAdapter(aengine, request_seconds=request_seconds))
        return made[-1]

    yield make
    for adapter in made:
        await adapter.aclose()


def comment(engine: Engine, key: str = "summary:1", number: int = 1, max_attempts: int = 8) -> int:
    with engine.begin() as conn:
        return enqueue_comment(
            conn, "acme", REPO, number, "Build passed.", idempotency_key=key, max_attempts=max_attempts
        ).id


def review(engine: Engine, key: str = "review:1", line: int = 12, commit_id: str = HEAD_SHA) -> int:
    with engine.begin() as conn:
        return enqueue_review(
            conn,
            "acme",
            REPO,
            2,
            commit_id=commit_id,
            body="Two notes.",
            comments=[{"path": "app.py", "line": line, "body": "Name this."}],
            idempotency_key=key,
        ).id


def issue(engine: Engine, key: str = "feedback:1") -> int:
    with engine.begin() as conn:
        return enqueue_issue(
            conn, "acme", REPO, "Export is slow", "Seen by three users.", labels=["feedback"], idempotency_key=key
        ).id


POSTS: dict[str, Callable[[Engine], int]] = {"comment": comment, "review": review, "issue": issue}


def row(engine: Engine, action_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT state, stop_reason, attempt, last_error, readback_ref, trace,"
                " extract(epoch FROM due_at - now()) AS due_in FROM agent_action WHERE id = :id"
            ),
            {"id": action_id},
        )
        return dict(found.mappings().one())


async def attempt_once(aengine: AsyncEngine, adapter: GithubAdapter) -> None:
    await Executor(aengine, [adapter], listen=False).run(until_idle=True)


async def drained(aengine: AsyncEngine, adapter: GithubAdapter, rounds: int = 20) -> None:
    """`drain` until no GITHUB_POST action waits: an account has a rate, and an executor that found its
    destination without a token looks again only a poll later, so one drain may end before a retry's turn."""
    for _ in range(rounds):
        await drain(aengine, [adapter])
        async with aengine.connect() as conn:
            waiting = await conn.scalar(text("SELECT count(*) FROM agent_action WHERE state = 'ADMITTED'"))
        if not waiting:
            return


# -- posted


async def test_a_comment_is_posted_once_with_its_marker_and_its_url_kept(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    action_id = comment(engine)
    await attempt_once(aengine, adapters())
    found = row(engine, action_id)
    [post] = acme.posts
    assert (found["state"], found["stop_reason"], found["attempt"]) == ("DONE", "CONFIRMED", 1)
    assert found["readback_ref"] == post.html_url == f"https://github.com/{REPO}/pull/1#issuecomment-{post.id}"
    assert post.body == "Build passed.\n\n" + marker("summary:1")
    assert found["trace"]["post"] == "comment" and found["trace"]["repo"] == REPO and found["trace"]["number"] == 1
    assert found["trace"]["marker"] == marker("summary:1")
    assert [method for method, _ in acme.requests] == ["POST"]  # a first attempt never reads back


async def test_a_review_with_an_inline_comment_is_posted_as_one(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    action_id = review(engine)
    await attempt_once(aengine, adapters())
    [post] = acme.posts
    assert row(engine, action_id)["readback_ref"] == post.html_url
    assert post.kind == "review" and post.data["commit_id"] == HEAD_SHA
    assert post.data["comments"] == [{"path": "app.py", "line": 12, "body": "Name this."}]
    assert post.body.endswith(marker("review:1"))


async def test_an_issue_is_opened_with_its_title_body_and_labels(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    action_id = issue(engine)
    await attempt_once(aengine, adapters())
    [post] = acme.posts
    assert row(engine, action_id)["readback_ref"] == f"https://github.com/{REPO}/issues/11" == post.html_url
    target = acme.repos[REPO].targets[11]
    assert (target.title, target.labels) == ("Export is slow", ["feedback"])


# -- exactly once


@pytest.mark.parametrize("kind", sorted(POSTS))
@pytest.mark.parametrize("fault", ["lost", "502-after"])
async def test_a_post_whose_answer_was_lost_is_read_back_not_made_again(
    engine: Engine,
    aengine: AsyncEngine,
    acme: GithubApi,
    adapters: Callable[..., GithubAdapter],
    kind: str,
    fault: str,
) -> None:
    acme.script.append(fault)
    action_id = POSTS[kind](engine)
    await drained(aengine, adapters())
    found = row(engine, action_id)
    [post] = acme.posts
    assert (found["state"], found["attempt"]) == ("DONE", 2), found["last_error"]
    assert found["readback_ref"] == f"{post.html_url} read back"
    assert found["trace"]["answer_lost"] is True
    assert [method for method, _ in acme.requests] == ["POST", "GET"]


async def test_a_502_before_the_write_is_read_back_then_posted(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    acme.script.append("502")
    action_id = comment(engine)
    await drained(aengine, adapters())
    found = row(engine, action_id)
    [post] = acme.posts
    assert (found["state"], found["attempt"], found["readback_ref"]) == ("DONE", 2, post.html_url)
    assert [method for method, _ in acme.requests] == ["POST", "GET", "POST"]


async def test_at_the_last_attempt_after_a_lost_answer_a_502_is_uncertain(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    acme.script.extend(["lost", "502"])
    action_id = comment(engine, max_attempts=2)
    await attempt_once(aengine, adapters())
    acme.posts.clear()  # the read-back finds nothing: the server forgets the post the lost answer made
    await drained(aengine, adapters())
    found = row(engine, action_id)
    assert (found["state"], found["stop_reason"], found["attempt"]) == ("UNCERTAIN", "PROVIDER_UNCERTAIN", 2)
    assert "GitHub may hold the post" in found["last_error"]


# -- GitHub's answers


RESULT_TYPES: dict[str, type[Result]] = {
    "Credentials refused": CredentialsRefused,
    "Slow down": SlowDown,
    "Failed": Failed,
    "Retry, read back first": Retry,
}


def test_the_docs_table_is_the_rules_in_code() -> None:
    lines = (ROOT / "docs" / "github.md").read_text().splitlines()
    start = lines.index("<!-- answers: generated from outbox.github.replies.markdown_rows -->")
    table = []
    for line in lines[start + 3 :]:
        if not line.startswith("|"):
            break
        table.append(line)
    assert lines[start + 1] == "| answer | result | why |"
    assert table == markdown_rows()


@pytest.mark.parametrize("rule", RULES, ids=[rule.answer for rule in RULES])
async def test_each_rule_of_the_table_takes_its_example_as_githubkit_reports_it(
    acme: GithubApi, adapters: Callable[..., GithubAdapter], rule: Rule
) -> None:
    example = rule.example
    acme.script.append((example.status, dict(example.headers), example.message))
    github = adapters()._client("acme")
    assert github is not None
    with pytest.raises(RequestFailed) as refused:
        await github.rest.issues.async_create_comment("acme", "web", 1, body="x")
    answer = answer_of(refused.value)
    assert (answer.status, answer.message) == (example.status, example.message)
    assert all(answer.headers[name] == value for name, value in example.headers.items())
    result = classify(answer, uncounted=0)
    assert type(result) is RESULT_TYPES[rule.result]
    assert classify(example, uncounted=0) == result or isinstance(result, SlowDown)
    assert acme.posts == []


def test_a_rate_limit_waits_what_github_names_and_a_minute_when_it_names_nothing() -> None:
    in_two_minutes = str(int(datetime.now(UTC).timestamp()) + 120)
    primary = classify(Answer(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": in_two_minutes}), 0)
    assert isinstance(primary, SlowDown) and primary.named and 118 <= primary.after <= 121
    secondary = classify(Answer(429, {"retry-after": "7"}), 0)
    assert isinstance(secondary, SlowDown) and secondary.named and secondary.after == 7
    bare = classify(Answer(429), 0)
    assert isinstance(bare, SlowDown) and bare.after == 60
    clamped = classify(Answer(403, {"retry-after": "999999"}), 0)
    assert isinstance(clamped, SlowDown) and clamped.after == 3600
    past = classify(Answer(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1"}), 0)
    assert isinstance(past, SlowDown) and past.after == 1.0
    # a limit that never lifts still lets the action end: past 20 deferrals it counts as an attempt
    assert isinstance(classify(Answer(429), 20), Retry)


async def test_a_secondary_limit_defers_uncounted_and_pauses_the_account(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    acme.script.append((403, {"retry-after": "30"}, "You have exceeded a secondary rate limit."))
    action_id = comment(engine)
    await attempt_once(aengine, adapters())
    found = row(engine, action_id)
    assert (found["state"], found["attempt"]) == ("ADMITTED", 0)
    assert 25 < found["due_in"] <= 31
    with engine.connect() as conn:
        paused = conn.execute(
            text("SELECT extract(epoch FROM paused_until - now()) FROM agent_destination WHERE name = 'github:acme'")
        ).scalar_one()
    assert 25 < paused <= 31
    assert acme.posts == []


async def test_the_primary_limit_pauses_the_account_until_its_reset(
    engine: Engine, aengine: AsyncEngine, adapters: Callable[..., GithubAdapter]
) -> None:
    api = GithubApi(tokens=[TOKEN], core_limit=1, core_window=90).start()
    try:
        api.add_repo(REPO, pulls=[1, 2])
        register_account("acme", url=api.url, token=TOKEN, rate="50/s")
        first, second = comment(engine, "a", 1), comment(engine, "b", 2)
        await attempt_once(aengine, adapters())
        done, found = sorted((row(engine, first), row(engine, second)), key=lambda r: r["state"] != "DONE")
        assert done["state"] == "DONE"  # the one whose request came first; the other met the limit
        assert (found["state"], found["attempt"]) == ("ADMITTED", 0), found["last_error"]
        assert 80 < found["due_in"] <= 92
        assert "API rate limit exceeded" in found["last_error"]
        assert len(api.posts) == 1
    finally:
        api.stop()


async def test_a_401_holds_the_account_for_every_executor_without_spending_the_attempt(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    acme.revoke(TOKEN)
    action_id = comment(engine)
    await attempt_once(aengine, adapters())
    found = row(engine, action_id)
    assert (found["state"], found["attempt"]) == ("ADMITTED", 0)
    with engine.connect() as conn:
        reason = conn.execute(
            text("SELECT credentials_reason FROM agent_destination WHERE name = 'github:acme'")
        ).scalar_one()
    assert reason == "401: GitHub said 'Bad credentials'"
    assert TOKEN not in str(found) and acme.posts == []


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda engine: comment(engine, number=99), "404: GitHub said 'Not Found'"),
        (lambda engine: review(engine, line=500), "422: GitHub said 'Unprocessable Entity'"),
        (lambda engine: review(engine, commit_id="b" * 40), "422: GitHub said 'Unprocessable Entity'"),
    ],
)
async def test_a_refused_post_fails_at_once(
    engine: Engine,
    aengine: AsyncEngine,
    acme: GithubApi,
    adapters: Callable[..., GithubAdapter],
    make: Callable[[Engine], int],
    why: str,
) -> None:
    action_id = make(engine)
    await attempt_once(aengine, adapters())
    found = row(engine, action_id)
    assert (found["state"], found["stop_reason"], found["attempt"], found["last_error"]) == (
        "FAILED",
        "PROVIDER_REFUSED",
        1,
        why,
    )
    assert acme.posts == []


async def test_a_comment_on_a_locked_issue_fails(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, adapters: Callable[..., GithubAdapter]
) -> None:
    acme.repos[REPO].targets[10].locked = True
    action_id = comment(engine, number=10)
    await attempt_once(aengine, adapters())
    found = row(engine, action_id)
    assert found["state"] == "FAILED" and "locked" in found["last_error"]


# -- a GitHub App's installation tokens


@pytest.fixture(scope="module")
def app_key() -> tuple[str, str]:
    """An RSA key pair as GitHub gives an App's: the private key (PEM) and its public key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


async def test_an_apps_installation_token_is_refreshed_before_it_expires(
    engine: Engine, aengine: AsyncEngine, adapters: Callable[..., GithubAdapter], app_key: tuple[str, str]
) -> None:
    private, public = app_key
    # tokens live 62 s: githubkit keeps one until a minute before its expires_at, so 1 to 2 s here
    api = GithubApi(app=(123456, public), token_lifetime=62).start()
    try:
        api.add_repo(REPO, pulls=[1, 2])
        register_account("acme", url=api.url, app_id=123456, installation_id=77, rate="50/s")
        os.environ["OUTBOX_GITHUB_PRIVATE_KEY_ACME"] = private
        adapter = adapters()
        first = comment(engine, "a", 1)
        await attempt_once(aengine, adapter)
        [(token, expires)] = api.issued
        refresh_at = expires - 60  # githubkit's margin: a minute before expires_at (GitHub's time, whole seconds)
        await asyncio.to_thread(until, lambda: time.time() > refresh_at + 1, 5, "the first token's refresh time")
        second = comment(engine, "b", 2)
        await attempt_once(aengine, adapter)
        assert row(engine, first)["state"] == row(engine, second)["state"] == "DONE"
        assert len(api.issued) == 2 and api.issued[1][0] != token  # asked again before the first expired
        assert time.time() < expires and api.refused_tokens == []  # never refused: no token was used too late
        assert [path.rsplit("/", 1)[-1] for _, path in api.requests] == [
            "access_tokens",
            "comments",
            "access_tokens",
            "comments",
        ]
    finally:
        api.stop()
        os.environ.pop("OUTBOX_GITHUB_PRIVATE_KEY_ACME", None)


async def test_an_expired_token_is_refused_as_github_refuses_it(
    engine: Engine, aengine: AsyncEngine, adapters: Callable[..., GithubAdapter]
) -> None:
    api = GithubApi(tokens=[TOKEN]).start()
    try:
        api.add_repo(REPO, pulls=[1])
        api.tokens[TOKEN] = time.time() - 1  # expired a second ago
        register_account("acme", url=api.url, token=TOKEN, rate="50/s")
        action_id = comment(engine)
        await attempt_once(aengine, adapters())
        assert (row(engine, action_id)["state"], api.refused_tokens) == ("ADMITTED", [TOKEN])
    finally:
        api.stop()


def test_an_app_key_that_cannot_sign_refuses_to_build_the_adapter(
    aengine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, app_key: tuple[str, str]
) -> None:
    register_account("acme", app_id=1, installation_id=2)
    lines = app_key[0].splitlines()
    garbled = "\n".join([lines[0], lines[1][::-1], *lines[2:]])  # a PEM still, its key's bytes wrong
    monkeypatch.setenv("OUTBOX_GITHUB_PRIVATE_KEY_ACME", garbled)
    with pytest.raises(GithubSecretError, match="cannot sign") as refused:
        GithubAdapter(aengine)
    assert lines[1][::-1][:20] not in str(refused.value)


# -- secrets


def test_a_missing_token_names_every_place_asked_never_a_secret(aengine: AsyncEngine) -> None:
    register_account("acme")
    add_secret_source(lambda name: None, label=lambda name: f"the Prefect Secret block outbox-github-{name}")
    with pytest.raises(GithubSecretError) as refused:
        GithubAdapter(aengine)
    assert str(refused.value) == (
        "GitHub account acme has no token: neither the code (register_account's token=), OUTBOX_GITHUB_TOKEN_ACME"
        " nor the Prefect Secret block outbox-github-acme holds one; put a token with write access to issues and"
        " pulls in one of them"
    )


def test_the_token_comes_from_the_code_the_environment_then_the_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    account = register_account("acme")
    add_secret_source({"acme": "ghs_" + "c" * 36}.get)
    assert account_secret(account) == "ghs_" + "c" * 36
    monkeypatch.setenv("OUTBOX_GITHUB_TOKEN_ACME", TOKEN)
    assert account_secret(account) == TOKEN
    assert account_secret(register_account("other", token="ghp_" + "d" * 36)) == "ghp_" + "d" * 36


@pytest.mark.parametrize("value", ["short", "ghp_ with spaces and more than twenty", "ghp_" + "é" * 30])
def test_a_malformed_token_is_named_never_shown(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    account = register_account("acme")
    monkeypatch.setenv("OUTBOX_GITHUB_TOKEN_ACME", value)
    with pytest.raises(GithubSecretError, match="OUTBOX_GITHUB_TOKEN_ACME is not a GitHub token") as refused:
        account_secret(account)
    assert value not in str(refused.value)


def test_outbox_run_refuses_to_start_without_a_token_in_one_line(cli: Callable[..., Any]) -> None:
    ran = cli("run", "--adapters", "tests.test_github:unregistered_adapters", "--max-seconds", "5")
    assert ran.code != 0
    assert ran.err == (
        "error: GitHub account acme has no token: neither the code (register_account's token=) nor"
        " OUTBOX_GITHUB_TOKEN_ACME holds one; put a token with write access to issues and pulls in one of them\n"
    ), "one line, no traceback, and it never started claiming"


def unregistered_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """`acme` registered with no token anywhere."""
    register_account("acme")
    return github_adapters(engine)


def test_an_account_is_paced_at_80_a_minute_unless_told_otherwise(aengine: AsyncEngine) -> None:
    register_account("acme", token=TOKEN)
    register_account("fast", token=TOKEN, rate="5/s")
    register_account("open", token=TOKEN, rate=None)
    rates = GithubAdapter(aengine).rates
    assert {name: rate.per_second if rate else None for name, rate in rates.items()} == {
        "github:acme": 80 / 60,
        "github:fast": 5.0,
        "github:open": None,
    }


def test_accounts_refuse_a_bad_declaration_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^url: .* must be https"):
        register_account("acme", url="http://api.example.com")
    with pytest.raises(ValueError, match=r"^app_id: "):
        register_account("acme", installation_id=3)
    with pytest.raises(ValueError, match=r"^installation_id: "):
        register_account("acme", app_id=3)
    with pytest.raises(ValueError, match=r"^name: "):
        register_account("Acme")
    register_account("acme-1")
    with pytest.raises(ValueError, match="would read the same OUTBOX_GITHUB_TOKEN_ACME_1"):
        register_account("acme_1")


# -- bad input at enqueue


def count_actions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one())


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda c: enqueue_comment(c, "nobody", REPO, 1, "x", idempotency_key="k"), "payload.account"),
        (lambda c: enqueue_comment(c, "acme", "acme", 1, "x", idempotency_key="k"), "payload.repo"),
        (lambda c: enqueue_comment(c, "acme", "-acme/web", 1, "x", idempotency_key="k"), "payload.repo"),
        (lambda c: enqueue_comment(c, "acme", "acme/..", 1, "x", idempotency_key="k"), "payload.repo"),
        (lambda c: enqueue_comment(c, "acme", REPO, 0, "x", idempotency_key="k"), "payload.number"),
        (lambda c: enqueue_comment(c, "acme", REPO, 1, " ", idempotency_key="k"), "payload.body"),
        # outbox's payload holds at most 16 KiB of JSON: a longer body is refused before GitHub's limit is asked
        (lambda c: enqueue_comment(c, "acme", REPO, 1, "x" * 20_000, idempotency_key="k"), "payload"),
        (lambda c: enqueue_issue(c, "acme", REPO, "a\nb", "x", idempotency_key="k"), "payload.title"),
        (lambda c: enqueue_issue(c, "acme", REPO, "t", "x", labels=["x" * 51], idempotency_key="k"), "payload.labels"),
        (
            lambda c: enqueue_review(c, "acme", REPO, 1, commit_id="HEAD", body="b", idempotency_key="k"),
            "payload.commit_id",
        ),
        (
            lambda c: enqueue_review(
                c,
                "acme",
                REPO,
                1,
                commit_id=HEAD_SHA,
                body="b",
                comments=[{"line": 3, "body": "x"}],
                idempotency_key="k",
            ),
            "payload.comments[0].path",
        ),
        (
            lambda c: enqueue_review(
                c,
                "acme",
                REPO,
                1,
                commit_id=HEAD_SHA,
                body="b",
                comments=[{"path": "a.py", "body": "x"}],
                idempotency_key="k",
            ),
            "payload.comments[0].line",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_written(
    engine: Engine, acme: GithubApi, make: Callable[[Any], Any], field: str
) -> None:
    with engine.begin() as conn:
        with pytest.raises(InvalidRequest) as refused:
            make(conn)
        assert refused.value.field == field
    assert count_actions(engine) == 0


def test_githubs_body_limit_counts_the_marker(acme: GithubApi) -> None:
    mark = len(marker("k")) + 2
    payload = {"post": "comment", "account": "acme", "repo": REPO, "number": 1, "body": "x" * (BODY_LIMIT - mark)}
    assert check_payload(payload) == "github:acme"
    with pytest.raises(InvalidRequest, match="GitHub takes 65486 \\(with the marker, 65536\\)") as refused:
        check_payload({**payload, "body": payload["body"] + "x"})
    assert refused.value.field == "payload.body"


OWNER = st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})", fullmatch=True).filter(lambda o: "--" not in o)
NAME = st.from_regex(r"[A-Za-z0-9._-]{1,100}", fullmatch=True).filter(lambda n: n not in (".", ".."))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=150), st.builds(lambda o, n: f"{o}/{n}", OWNER, NAME)))
def test_a_repository_is_taken_exactly_when_it_is_owner_slash_name(repo: str) -> None:
    owner, _, name = repo.partition("/")
    valid = (
        repo.count("/") == 1
        and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}", owner) is not None
        and "--" not in owner
        and re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name) is not None
        and name not in (".", "..")
    )
    try:
        check_repo(repo)
    except InvalidRequest as refused:
        assert not valid and refused.field == "payload.repo"
    else:
        assert valid


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["path", "line", "side", "start_line", "start_side", "body", "x"]),
        st.one_of(
            st.integers(-2, 300), st.sampled_from(["a.py", "", "LEFT", "RIGHT", "note", "/etc/passwd"]), st.none()
        ),
    )
)
def test_an_inline_comment_is_checked_field_by_field(comment: dict[str, Any]) -> None:
    """Whatever the comment holds, the check either takes it (and then GitHub's rules hold) or names a field."""
    payload = {
        "post": "review",
        "account": "acme",
        "repo": REPO,
        "number": 1,
        "commit_id": HEAD_SHA,
        "body": "b",
        "comments": [comment],
    }
    account_registry._ACCOUNTS["acme"] = account_registry.GithubAccount("acme", secret=TOKEN)
    try:
        check_payload(payload)
    except InvalidRequest as refused:
        assert refused.field.startswith("payload.comments[0]")
        return
    assert isinstance(comment["path"], str) and comment["path"] and not comment["path"].startswith("/")
    assert isinstance(comment["line"], int) and comment["line"] > 0 and isinstance(comment["body"], str)
    assert comment.get("side", "RIGHT") in ("LEFT", "RIGHT") and "x" not in comment
    assert comment.get("start_line", 0) < comment["line"]


# -- an executor killed mid-post


def process_adapters(engine: AsyncEngine) -> list[ActionAdapter]:
    """What `outbox run` in a process of its own runs: `acme` at OUTBOX_TEST_GITHUB_URL."""
    register_account("acme", url=os.environ["OUTBOX_TEST_GITHUB_URL"], rate="50/s")
    return github_adapters(engine)


def start_outbox_run(database_url: str, github_url: str) -> subprocess.Popen[bytes]:
    """`outbox run` with the GitHub adapter, as a replica would run it."""
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_TEST_GITHUB_URL": github_url,
        "OUTBOX_GITHUB_TOKEN_ACME": TOKEN,
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.test_github:process_adapters"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_an_executor_killed_after_its_post_was_stored_leaves_one_post(
    engine: Engine, aengine: AsyncEngine, acme: GithubApi, database_url: str, adapters: Callable[..., GithubAdapter]
) -> None:
    acme.script.append("stall")  # the post is stored; its answer never comes
    action_id = comment(engine)
    executor = start_outbox_run(database_url, acme.url)
    try:
        assert await asyncio.to_thread(acme.stored.wait, 60), "the executor never posted"
    finally:
        executor.send_signal(signal.SIGKILL)
        executor.wait(10)
    with engine.begin() as conn:
        held = conn.execute(
            text("SELECT state, write_started_at IS NOT NULL FROM agent_action WHERE id = :id"), {"id": action_id}
        ).one()
        assert tuple(held) == ("EXECUTING", True)
        conn.execute(  # the lease runs out
            text("UPDATE agent_action SET lease_expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )
    await drained(aengine, adapters())  # the server now answers every post: a second one would be stored
    found = row(engine, action_id)
    [post] = acme.posts
    assert (found["state"], found["readback_ref"]) == ("DONE", f"{post.html_url} read back")
    assert [method for method, _ in acme.requests] == ["POST", "GET"]
