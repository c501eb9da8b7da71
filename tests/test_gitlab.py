"""GITLAB_POST through the real python-gitlab against a local GitLab (demo/gitlab_api.py) and the real PostgreSQL.

    note_request / review_request / issue_request ─▶ enqueue ─▶ drain ─▶ GitlabAdapter ─▶ python-gitlab ─▶ GitlabApi

Each test enqueues, drains (or runs one executor pass), and asserts the action's end and what the local GitLab
holds: one post per action through lost answers, 502s after the write, a review lost part way and a token
refused; each answer classified as docs/gitlab.md's table says.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import gitlab
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from demo.gitlab_api import GitlabApi, Noteable, now_text
from outbox._internal.config.credentials import Sources
from outbox.errors import InvalidRequest
from outbox.executor import Executor
from outbox.gitlab import hosts as host_registry
from outbox.gitlab.adapter import GitlabAdapter, classify
from outbox.gitlab.hosts import GitlabTokenError, add_token_source, host_token, register_host
from outbox.gitlab.posts import (
    NOTE_LIMIT,
    check_payload,
    issue_request,
    marker,
    note_request,
    review_request,
)
from outbox.requests import ActionRequest
from outbox.testing import drain
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "glpat-" + "x" * 20
PROJECT = "acme/shop"
SHAS = {"base_sha": "a" * 40, "start_sha": "b" * 40, "head_sha": "c" * 40}
COMMENTS = [
    {"path": "app.py", "new_line": 3, "body": "this name says too little"},
    {"path": "app.py", "old_line": 7, "body": "why was this removed?"},
    {"path": "app.py", "new_line": 12, "body": "a test for this branch?"},
]


@pytest.fixture(autouse=True)
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers its own hosts and token sources."""
    monkeypatch.setattr(host_registry, "_HOSTS", {})
    monkeypatch.setattr(host_registry, "_SOURCES", Sources("token"))
    for name in [name for name in os.environ if name.startswith("OUTBOX_GITLAB_TOKEN_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def api() -> Iterator[GitlabApi]:
    server = GitlabApi([TOKEN])
    server.add_project(PROJECT, merge_requests=range(1, 101), issues=range(1, 11))
    server.start()
    register_host("main", server.url, token=TOKEN, rate=None)  # drain's rounds do not wait out a rate's turns
    yield server
    server.stop()


@pytest_asyncio.fixture(loop_scope="function")
async def adapter(aengine: AsyncEngine, api: GitlabApi) -> AsyncIterator[GitlabAdapter]:
    made = GitlabAdapter(aengine, request_seconds=3.0)
    yield made
    await made.aclose()


def note(key: str = "mr-summary:1", iid: int = 1, **options: Any) -> ActionRequest:
    return note_request(
        "main", PROJECT, "**Summary**: 3 files changed", merge_request=iid, idempotency_key=key, **options
    )


def review(key: str = "review:1", **options: Any) -> ActionRequest:
    return review_request("main", PROJECT, 1, **SHAS, comments=COMMENTS, idempotency_key=key, **options)


def issue(key: str = "feedback:1", **options: Any) -> ActionRequest:
    return issue_request(
        "main",
        PROJECT,
        "Export fails on large files",
        "Reported by a customer.",
        labels=["feedback", "export"],
        idempotency_key=key,
        **options,
    )


POSTS = {"note": note, "review": review, "issue": issue}


def enqueue(engine: Engine, request: ActionRequest) -> int:
    with engine.begin() as conn:
        return outbox.enqueue(conn, request).id


def row(engine: Engine, action_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT state, stop_reason, attempt, last_error, readback_ref, trace FROM agent_action WHERE id = :id"
            ),
            {"id": action_id},
        )
        return dict(found.mappings().one())


async def attempt_once(aengine: AsyncEngine, adapter: GitlabAdapter) -> None:
    await Executor(aengine, [adapter], listen=False).run(until_idle=True)


def posts_of(api: GitlabApi, kind: str) -> int:
    """How many posts of the kind the local GitLab holds (a review: its discussions)."""
    if kind == "note":
        return len(api.notes(PROJECT, "merge_request", 1))
    if kind == "review":
        return len(api.discussions(PROJECT, 1))
    return len(api.new_issues(PROJECT))


# -- made once


async def test_a_note_is_made_with_its_hidden_marker_and_done_with_its_url(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    action_id = enqueue(engine, note())
    await attempt_once(aengine, adapter)
    made = row(engine, action_id)
    [stored] = api.notes(PROJECT, "merge_request", 1)
    assert made["state"] == "DONE" and made["attempt"] == 1
    assert made["readback_ref"] == f"{api.url}/{PROJECT}/-/merge_requests/1#note_{stored['id']}"
    assert stored["body"] == f"**Summary**: 3 files changed\n\n{marker('mr-summary:1')}"
    assert re.fullmatch(r"<!-- outbox:[0-9a-f]{32} -->", marker("mr-summary:1"))
    assert [verb for verb, _ in api.requests] == ["POST"]  # read-back never on a first attempt


async def test_a_review_makes_one_diff_discussion_per_comment_each_with_its_marker(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    action_id = enqueue(engine, review())
    await attempt_once(aengine, adapter)
    made = row(engine, action_id)
    discussions = api.discussions(PROJECT, 1)
    assert made["state"] == "DONE" and made["readback_ref"].endswith("(3 discussions)")
    assert [d["notes"][0]["body"].rsplit("\n", 1)[1] for d in discussions] == [marker("review:1", n) for n in (1, 2, 3)]
    positions = [d["notes"][0]["position"] for d in discussions]
    assert positions[0]["new_line"] == 3 and positions[1]["old_line"] == 7 and positions[0]["head_sha"] == "c" * 40


async def test_an_issue_is_opened_with_its_labels_and_done_with_its_web_url(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    action_id = enqueue(engine, issue())
    await attempt_once(aengine, adapter)
    [opened] = api.new_issues(PROJECT)
    assert opened.labels == ["feedback", "export"] and opened.description.endswith(marker("feedback:1"))
    assert row(engine, action_id)["readback_ref"] == f"{api.url}/{PROJECT}/-/issues/{opened.iid}"


@pytest.mark.parametrize("kind", sorted(POSTS))
@pytest.mark.parametrize("fault", ["lose", "502-after"])
async def test_a_lost_answer_leaves_exactly_one_post(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter, kind: str, fault: str
) -> None:
    api.script.extend([fault])
    action_id = enqueue(engine, POSTS[kind]())
    await drain(aengine, [adapter])
    made = row(engine, action_id)
    assert (made["state"], made["attempt"]) == ("DONE", 2), made
    # a review's first discussion was lost: read back, then the other two made
    assert made["readback_ref"].endswith("(3 discussions)" if kind == "review" else "read back")
    assert made["trace"]["answer_lost"] is True
    assert posts_of(api, kind) == (3 if kind == "review" else 1)
    assert sorted(api.markers()) == sorted(set(api.markers()))


async def test_a_review_lost_part_way_makes_only_the_discussions_read_back_did_not_find(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    api.script.extend(["ok", "lose"])  # the first made and answered, the second made and its answer lost
    action_id = enqueue(engine, review())
    await drain(aengine, [adapter])
    assert row(engine, action_id)["state"] == "DONE"
    assert sorted(api.markers()) == sorted(marker("review:1", n) for n in (1, 2, 3))
    posts = [verb for verb, path in api.requests if path.endswith("/discussions")]
    assert posts == ["POST", "POST", "GET", "POST"]  # the retry read back, then made only the third


async def test_the_clients_own_retry_would_post_twice(api: GitlabApi) -> None:
    """Why every retry of python-gitlab is off: with its transient retries on, a 502 after the write is a second
    note; outbox's calls (the tests above) leave one."""
    api.script.extend(["502-after"])
    gl = gitlab.Gitlab(api.url, private_token=TOKEN, retry_transient_errors=True)
    gl.projects.get(PROJECT, lazy=True).mergerequests.get(1, lazy=True).notes.create({"body": "hello"})
    assert len(api.notes(PROJECT, "merge_request", 1)) == 2


async def test_a_lost_answer_at_the_last_attempt_is_uncertain_when_read_back_cannot_look(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    action_id = enqueue(engine, note(max_attempts=1))
    api.script.extend(["lose"])
    await drain(aengine, [adapter])
    made = row(engine, action_id)
    assert (made["state"], made["stop_reason"]) == ("UNCERTAIN", "PROVIDER_UNCERTAIN")
    assert len(api.notes(PROJECT, "merge_request", 1)) == 1


async def test_a_marker_quoted_by_a_person_is_not_the_post(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    """A person quotes the action's marker in a note of their own (not as its last line) before the attempt after
    a lost answer reads back: read-back does not take it for the post, and makes it."""
    api.script.extend(["502"])  # nothing stored: the next attempt reads back, then posts
    action_id = enqueue(engine, note())
    await attempt_once(aengine, adapter)
    quoted = {
        "id": 1,
        "type": None,
        "body": f"> {marker('mr-summary:1')}\n\nagreed",
        "created_at": "2099-01-01T00:00:00.000Z",
    }
    api.project(PROJECT).merge_requests[1].notes.append(quoted)  # type: ignore[union-attr]
    await drain(aengine, [adapter])
    made = row(engine, action_id)
    assert made["state"] == "DONE" and not made["readback_ref"].endswith("read back")
    assert len(api.notes(PROJECT, "merge_request", 1)) == 2


def crowd(api: GitlabApi, kind: str, count: int) -> None:
    """`count` posts by others on the target, made after the action's (newer: a page ahead of it newest first)."""
    project = api.project(PROJECT)
    assert project is not None
    for n in range(count):
        note = {"id": 50_000 + n, "type": None, "body": f"a comment {n}", "created_at": now_text(), "notes": []}
        if kind == "note":
            project.merge_requests[1].notes.append(note)
        elif kind == "review":
            project.merge_requests[1].discussions.insert(0, {"id": f"{n:040x}", "notes": [note]})
        else:
            project.issues[1000 + n] = Noteable(1000 + n, f"another {n}", "text")


@pytest.mark.parametrize("kind", sorted(POSTS))
async def test_read_back_pages_through_a_crowded_target(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter, kind: str
) -> None:
    """250 other posts on the target put the action's on the third page of 100 (newest first for notes; before
    it in creation order for discussions); issues are listed oldest first, so ours is on the first page and the
    read stops there, every marker found."""
    api.script.extend(["ok", "ok", "lose"] if kind == "review" else ["lose"])  # a review's last answer lost
    action_id = enqueue(engine, POSTS[kind]())
    await attempt_once(aengine, adapter)
    crowd(api, kind, 250)
    await drain(aengine, [adapter])
    made = row(engine, action_id)
    assert made["state"] == "DONE" and made["readback_ref"].endswith("read back")
    assert sorted(api.markers()) == sorted(set(api.markers()))
    gets = [path for verb, path in api.requests if verb == "GET"]
    assert len(gets) == (1 if kind == "issue" else 3)


# -- each answer


@pytest.mark.parametrize(
    ("step", "state", "reason"),
    [
        ("502", "DONE", None),  # nothing stored: retried, read back finds nothing, made once
        ("429", "DONE", None),
    ],
)
async def test_a_refusal_before_the_write_is_retried_to_one_post(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter, step: str, state: str, reason: Any
) -> None:
    api.script.extend([step])
    action_id = enqueue(engine, note())
    await drain(aengine, [adapter])
    assert row(engine, action_id)["state"] == state and len(api.notes(PROJECT, "merge_request", 1)) == 1


async def test_a_429_pauses_the_host_for_its_retry_after_and_does_not_count(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    api.script.extend(["429"])
    action_id = enqueue(engine, note())
    await attempt_once(aengine, adapter)
    made = row(engine, action_id)
    assert (made["state"], made["attempt"]) == ("ADMITTED", 0)
    assert "429" in made["last_error"] and "rate limit" in made["last_error"]
    with engine.connect() as conn:
        paused = conn.execute(
            text("SELECT paused_until > now() FROM agent_destination WHERE name = 'gitlab:main'")
        ).scalar_one()
    assert paused


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("outside-diff", "400"),
        ("gone", "404"),
        ("locked", "403"),
    ],
)
async def test_a_refused_post_fails_at_once(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter, where: str, expected: str
) -> None:
    if where == "outside-diff":
        request = review_request(
            "main", PROJECT, 1, **SHAS, comments=[{"path": "app.py", "new_line": 900, "body": "x"}], idempotency_key="r"
        )
    elif where == "gone":
        request = note(iid=404)
    else:
        api.project(PROJECT).issues[3].locked = True  # type: ignore[union-attr]
        request = note_request("main", PROJECT, "hello", issue=3, idempotency_key="locked")
    action_id = enqueue(engine, request)
    await drain(aengine, [adapter])
    made = row(engine, action_id)
    assert (made["state"], made["stop_reason"], made["attempt"]) == ("FAILED", "PROVIDER_REFUSED", 1)
    assert made["last_error"].startswith(f"post: {expected}")


async def test_a_revoked_token_holds_the_host_without_spending_attempts(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    api.revoked.add(TOKEN)
    ids = [enqueue(engine, note(f"n{i}", iid=i)) for i in range(1, 4)]
    await attempt_once(aengine, adapter)
    assert [row(engine, i)["attempt"] for i in ids] == [0, 0, 0]
    with engine.connect() as conn:
        refused = conn.execute(
            text("SELECT credentials_reason FROM agent_destination WHERE name = 'gitlab:main'")
        ).scalar_one()
    assert refused.startswith("post: 401") and TOKEN not in refused
    calls = len(api.requests)  # the attempts already running when the first refusal came
    await attempt_once(aengine, adapter)
    assert len(api.requests) == calls and calls <= 3  # held: nothing more is sent until the probe


# the docs' classification table, row by row, through classify
_TABLE = re.compile(r"<!-- classification: evaluated by tests/test_gitlab.py -->\n(.*?)\n\n", re.S)


def test_each_row_of_the_docs_table_is_what_classify_answers() -> None:
    table = _TABLE.search((ROOT / "docs" / "gitlab.md").read_text())
    assert table is not None
    rows = [line.split("|")[1:-1] for line in table.group(1).splitlines()[2:]]
    assert len(rows) >= 9
    for status, message, headers, result in ((c.strip().strip("`") for c in r) for r in rows):
        named = dict(part.split("=", 1) for part in headers.split() if "=" in part)
        found = classify(int(status), message, named.get("Retry-After"), named.get("RateLimit-Reset"), 0)
        assert type(found).__name__ == result, (status, message, found)


_EXAMPLE = re.compile(r"<!-- gitlab example: evaluated by tests/test_gitlab.py -->\n```python\n(.*?)```", re.S)


async def test_the_pages_example_enqueues_the_three_posts_and_they_arrive(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, adapter: GitlabAdapter
) -> None:
    api.add_project("acme/shop-example", merge_requests=[12], issues=[])
    found = _EXAMPLE.search((ROOT / "docs" / "gitlab.md").read_text())
    assert found is not None
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE build (id int PRIMARY KEY, state text)"))
        conn.execute(text("INSERT INTO build VALUES (7, 'running')"))
    code = found.group(1).replace('"acme/shop"', '"acme/shop-example"')
    exec(compile(code, "docs/gitlab.md", "exec"), {"engine": engine, "text": text})
    await drain(aengine, [adapter])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT array_agg(state) FROM agent_action")).scalar_one() == ["DONE"] * 3
    assert len(api.notes("acme/shop-example", "merge_request", 12)) == 2  # the note and the review's discussion
    assert [i.labels for i in api.new_issues("acme/shop-example")] == [["feedback", "export"]]


# -- refused at enqueue


def test_bad_input_is_refused_at_enqueue_naming_the_field(engine: Engine, api: GitlabApi) -> None:
    cases: list[tuple[Callable[[], ActionRequest], str]] = [
        (lambda: note_request("main", "shop", "x", merge_request=1, idempotency_key="k"), "payload.project"),
        (lambda: note_request("other", PROJECT, "x", merge_request=1, idempotency_key="k"), "payload.host"),
        (lambda: note_request("main", PROJECT, "x" * NOTE_LIMIT, merge_request=1, idempotency_key="k"), "payload.body"),
        (lambda: note_request("main", PROJECT, " ", merge_request=1, idempotency_key="k"), "payload.body"),
        (lambda: note_request("main", PROJECT, "x", idempotency_key="k"), "merge_request"),
        (
            lambda: review_request("main", PROJECT, 1, **SHAS, comments=[{"body": "x"}], idempotency_key="k"),
            "payload.comments[0].path",
        ),
        (
            lambda: review_request(
                "main", PROJECT, 1, **SHAS, comments=[{"path": "a", "body": "x"}], idempotency_key="k"
            ),
            "payload.comments[0]",
        ),
        (
            lambda: review_request(
                "main", PROJECT, 1, **{**SHAS, "head_sha": "HEAD"}, comments=COMMENTS, idempotency_key="k"
            ),
            "payload.head_sha",
        ),
        (lambda: issue_request("main", PROJECT, "", "d", idempotency_key="k"), "payload.title"),
        (
            lambda: issue_request("main", PROJECT, "t", f"see {marker('other')}", idempotency_key="k"),
            "payload.description",
        ),
        (lambda: issue_request("main", PROJECT, "t", "d", labels=["a,b"], idempotency_key="k"), "payload.labels"),
    ]
    for build, field in cases:
        with pytest.raises(InvalidRequest) as refused:
            build()
        assert refused.value.field == field, (field, str(refused.value))
    with engine.begin() as conn:
        with pytest.raises(InvalidRequest, match=r"payload\.iid"):
            outbox.enqueue(conn, ActionRequest("GITLAB_POST", "l", "k", {**note().payload, "iid": 0}))
        assert conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one() == 0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)
_FIELDS = ["post", "host", "project", "target", "iid", "body", "title", "description", "labels", "comments", *SHAS]


@given(
    base=st.sampled_from(["note", "review", "issue"]),
    changes=st.dictionaries(st.sampled_from([*_FIELDS, "extra"]), _JSON, min_size=1, max_size=3),
)
def test_a_payload_is_accepted_only_whole_and_well_formed(base: str, changes: dict[str, Any]) -> None:
    """Any change of a valid payload's fields to arbitrary JSON is refused with InvalidRequest, or accepted
    only when the result is itself one of the three posts, well formed (never another error)."""
    host_registry._HOSTS["main"] = host_registry.GitlabHost("main", "https://gitlab.example.com")
    payload = {**POSTS[base]().payload, **changes}
    try:
        destination = check_payload(payload)
    except InvalidRequest:
        return
    assert destination == "gitlab:main" and payload["post"] in POSTS
    assert isinstance(payload["project"], str | int) and "extra" not in payload


# -- the token


def test_the_token_comes_from_the_code_the_environment_then_the_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    host = register_host("ci-host", "https://gitlab.example.com")
    with pytest.raises(GitlabTokenError) as missing:
        host_token(host)
    assert "OUTBOX_GITLAB_TOKEN_CI_HOST" in str(missing.value)
    add_token_source(lambda name: TOKEN if name == "ci-host" else None, label=lambda n: f"the block gitlab-{n}")
    assert host_token(host) == TOKEN
    monkeypatch.setenv("OUTBOX_GITLAB_TOKEN_CI_HOST", "not a token!")
    with pytest.raises(GitlabTokenError) as malformed:
        host_token(host)
    assert "OUTBOX_GITLAB_TOKEN_CI_HOST" in str(malformed.value) and "not a token" not in str(malformed.value)


def test_a_host_url_must_be_https_off_loopback() -> None:
    with pytest.raises(ValueError, match="https"):
        register_host("plain", "http://gitlab.example.com")
    with pytest.raises(ValueError, match="user or password"):
        register_host("userinfo", "https://me:pw@gitlab.example.com")
    assert register_host("local", "http://127.0.0.1:8080/").url == "http://127.0.0.1:8080"


def test_outbox_run_refuses_to_start_without_a_token(database_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_GITLAB_TOKEN_")}
    env.update(OUTBOX_DATABASE_URL=database_url, OUTBOX_TEST_GITLAB_URL="http://127.0.0.1:9", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.gitlab_app:adapters"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("put a personal, project or group access token with the api scope in one of them")
    )
    assert "OUTBOX_GITLAB_TOKEN_MAIN" in done.stderr and "Traceback" not in done.stderr


# -- a killed executor


async def test_an_executor_killed_mid_post_leaves_one_note(
    engine: Engine, aengine: AsyncEngine, api: GitlabApi, database_url: str
) -> None:
    api.script.extend(["stall"])  # the note is stored, the answer never comes
    action_id = enqueue(engine, note())
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_TEST_GITLAB_URL": api.url,
        "OUTBOX_GITLAB_TOKEN_MAIN": TOKEN,
        "PYTHONPATH": str(ROOT),
    }
    executor = start_executor(env)
    try:
        assert api.stalled.wait(60), "the executor never posted"
    finally:
        executor.send_signal(signal.SIGKILL)
        executor.wait(10)
    api.released.set()
    with engine.begin() as conn:  # the lease runs out
        conn.execute(
            text("UPDATE agent_action SET lease_expires_at = now() - interval '1 s' WHERE id = :id"), {"id": action_id}
        )
    host_registry._HOSTS.clear()
    register_host("main", api.url, token=TOKEN, rate=None)
    made_adapter = GitlabAdapter(aengine, request_seconds=3.0)
    try:
        await drain(aengine, [made_adapter])
    finally:
        await made_adapter.aclose()
    made = row(engine, action_id)
    assert made["state"] == "DONE" and made["readback_ref"].endswith("read back")
    assert len(api.notes(PROJECT, "merge_request", 1)) == 1


def start_executor(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`outbox run` with the test application's GitLab adapter, as a replica would run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "run", "--adapters", "tests.gitlab_app:adapters"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_the_local_gitlab_runs_as_a_process_that_keeps_a_journal(tmp_path: Path) -> None:
    journal, port_file = tmp_path / "journal", tmp_path / "port"
    argv = [sys.executable, "-m", "demo.gitlab_api", "--port", "0", "--port-file", str(port_file), "--token", TOKEN]
    server = subprocess.Popen([*argv, "--journal", str(journal)], cwd=ROOT)
    try:
        until(lambda: port_file.exists() and bool(port_file.read_text()), 30, "the server to listen")
        gl = gitlab.Gitlab(f"http://127.0.0.1:{port_file.read_text()}", private_token=TOKEN)
        project = gl.projects.get(PROJECT, lazy=True)
        project.mergerequests.get(7, lazy=True).notes.create({"body": f"hi\n\n{marker('k')}"})
        assert [n.body for n in project.mergerequests.get(7, lazy=True).notes.list(get_all=True)] == [
            f"hi\n\n{marker('k')}"
        ]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    [entry] = [json.loads(line) for line in journal.read_text().splitlines()]
    assert {name: entry[name] for name in ("kind", "project", "target", "iid", "markers")} == {
        "kind": "notes",
        "project": PROJECT,
        "target": "merge_requests",
        "iid": "7",
        "markers": [marker("k")],
    }
    assert entry["made"]["body"] == f"hi\n\n{marker('k')}"
