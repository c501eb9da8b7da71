"""The README and docs/ stay true: their examples run as written, their links resolve, they stay the user's.

Each named example (`<!-- example: NAME -->` above a Python block) is found in whichever page holds it and
runs against a real database. Every relative link resolves to a file of the repository and, with an
anchor, to a heading of it; no page links outside the repository; every alert's runbook link names a
section of docs/ that exists.
"""

from __future__ import annotations

import email
import email.policy
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo.sink import SmtpSink

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.S)
# the migration examples run in tests/test_migration_history.py, through the alembic and manage.py commands
MIGRATION_EXAMPLES = {"alembic-revision", "django-migration", "kind-declaration", "kind-revision"}
# the tracing set-up runs in tests/test_tracing.py, against an OTLP/HTTP receiver
TRACING_EXAMPLES = {"tracing-setup"}
TESTED_EXAMPLES = {
    "enqueue",
    "adapter",
    "email",
    "retention",
    "readback-adapter",
    "notice",
    "database-url",
    *MIGRATION_EXAMPLES,
    *TRACING_EXAMPLES,
}


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def examples() -> list[tuple[str, str, str]]:
    """Every named example of every page: its name, its code, its page."""
    return [
        (match.group(1), match.group(2), page_name(page))
        for page in PAGES
        for match in EXAMPLE.finditer(page.read_text())
    ]


def example(name: str) -> tuple[str, str]:
    """The code of the example called `name`, and the page that holds it; a name is unique across pages."""
    named = [(code, page) for found, code, page in examples() if found == name]
    assert named, f"no page holds an example named {name}"
    assert len(named) == 1, f"the example {name} appears in {[page for _, page in named]}"
    return named[0]


def run_example(name: str, namespace: dict[str, Any]) -> None:
    code, page = example(name)
    exec(compile(code, page, "exec"), namespace)


def test_every_example_is_named_once_and_run_here() -> None:
    names = [name for name, _, _ in examples()]
    assert sorted(names) == sorted(set(names)), f"an example name appears twice: {names}"
    assert set(names) == TESTED_EXAMPLES


# -- the examples run as written


def test_the_enqueue_example_runs(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE account (id int PRIMARY KEY, email_verified boolean)"))
        conn.execute(text("INSERT INTO account VALUES (42, true)"))
    run_example("enqueue", {"engine": engine})
    with engine.connect() as conn:
        assert conn.execute(text("SELECT kind, state, payload FROM agent_action")).one() == (
            "EMAIL",
            "ADMITTED",
            {"notice": "verify_address", "event": {"account_id": 42}},
        )
        assert conn.execute(text("SELECT email_verified FROM account")).scalar_one() is False


def test_the_adapter_example_runs_as_a_script(database_url: str, engine: Engine, tmp_path: Path) -> None:
    code, _ = example("adapter")
    (tmp_path / "ping.py").write_text(code)
    env = {**os.environ, "OUTBOX_DATABASE_URL": database_url}
    for expected in ("carried out 1", "carried out 0"):  # the second run's enqueue returns the first, ended action
        ran = subprocess.run(
            [sys.executable, "ping.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == expected
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id, state, readback_ref FROM agent_action")).one() == (1, "DONE", "ping-1")
        assert conn.execute(
            text("SELECT at_most_once, instance_level, workspace_level FROM agent_action_kind WHERE name = 'PING'")
        ).one() == (False, True, False)


def test_the_email_example_runs(engine: Engine) -> None:
    from examples.accounts import schema

    with engine.begin() as conn:
        schema.create(conn)
        conn.execute(text("INSERT INTO app_account VALUES (1, 'Alice', 'alice@example.com', true)"))
        conn.execute(text("INSERT INTO app_workspace VALUES (10, 'Research')"))
        conn.execute(text("INSERT INTO app_membership VALUES (10, 1, 'admin')"))
    run_example("email", {"engine": engine})
    with engine.connect() as conn:
        assert conn.execute(text("SELECT kind, payload FROM agent_action")).one() == (
            "EMAIL",
            {"notice": "workspace_alert", "event": {"workspace_id": 10, "alert_id": 101}},
        )


SHOP_TABLES = """
CREATE TABLE shop_customer (id bigint PRIMARY KEY, name text NOT NULL, email text, shipping_emails boolean NOT NULL);
CREATE TABLE shop_order (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES shop_customer,
                         shipped boolean NOT NULL DEFAULT false);
INSERT INTO shop_customer VALUES (3, 'Ann Lee', 'ann@example.com', true);
INSERT INTO shop_order VALUES (7, 3);
"""


async def test_the_notice_example_runs_and_its_email_reaches_the_customer(
    engine: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    from outbox.email import EmailAdapter, SmtpSettings
    from outbox.testing import drain

    with engine.begin() as conn:
        conn.execute(text(SHOP_TABLES))
    namespace: dict[str, Any] = {"engine": engine}
    run_example("notice", namespace)
    action = namespace["action"]
    assert action.created is True
    assert (action.kind, action.lane_key, action.idempotency_key) == (
        "EMAIL",
        "customer:3:email",
        "email:order_shipped:7",
    )
    assert (action.workspace_id, action.subject_account_id) == (None, 3)
    assert action.payload == {"notice": "order_shipped", "event": {"order_id": 7, "customer_id": 3}}
    with engine.begin() as conn:  # a retry of the same event after the customer turned the emails off
        conn.execute(text("UPDATE shop_customer SET shipping_emails = false"))
        again = namespace["enqueue_email"](conn, namespace["ORDER_SHIPPED"], {"order_id": 7, "customer_id": 3})
        assert again.id == action.id and again.created is False
        conn.execute(text("UPDATE shop_customer SET shipping_emails = true"))
    smtp = SmtpSettings(host="127.0.0.1", port=sink.port, sender="shop@example.com", timeout_seconds=2)
    await drain(aengine, [EmailAdapter(aengine, smtp)])
    [received] = sink.received
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert (str(message["To"]), str(message["Subject"])) == ("Ann Lee <ann@example.com>", "Order 7 has shipped")
    assert isinstance(message, EmailMessage)
    assert message.get_content().splitlines() == ["Hello Ann Lee,", "", "your order 7 is on its way."]


def test_the_database_url_example_gives_engines_outbox_enqueues_on(
    engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import outbox
    from tests import kinds

    # the URL an application holds, with the scheme most of them write
    monkeypatch.setenv("DATABASE_URL", database_url.replace("postgresql+psycopg://", "postgres://", 1))
    namespace: dict[str, Any] = {}
    run_example("database-url", namespace)
    made: Engine = namespace["engine"]
    try:
        assert made.url.drivername == namespace["async_engine"].url.drivername == "postgresql+psycopg"
        request = outbox.ActionRequest(kind=kinds.NOOP, workspace_id=1, lane_key="l", idempotency_key="u", payload={})
        with made.begin() as conn:
            assert outbox.enqueue(conn, request).created is True
    finally:
        made.dispose()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT idempotency_key FROM agent_action")).scalars().all() == ["u"]


def test_the_retention_example_runs(engine: Engine) -> None:
    from datetime import timedelta

    import outbox
    from examples.accounts import notices
    from tests.support import insert_ended

    with engine.begin() as conn:
        request = outbox.ActionRequest(
            kind=outbox.ActionKind.EMAIL,
            lane_key="account:42",
            idempotency_key="welcome:42",
            payload={"notice": notices.VERIFY_ADDRESS.name, "event": {"account_id": 42}},
            subject_account_id=42,
        )
        outbox.enqueue(conn, request)
    insert_ended(engine, ended_ago=timedelta(days=31), count=2)
    kept = insert_ended(engine, ended_ago=timedelta(days=29))
    namespace: dict[str, Any] = {"engine": engine}
    run_example("retention", namespace)
    assert (namespace["erased"], namespace["deleted"]) == (1, 2)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM agent_action")).scalars().all() == kept


# -- links and words

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# a link, or an image (`![...](...)`: its path must resolve as well)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def prose(page: Path) -> str:
    """A page without its code blocks and code spans, where no link is written."""
    return INLINE_CODE.sub("", FENCE.sub("", page.read_text()))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped except hyphens, spaces to hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a Markdown file's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading is None:
            continue
        anchor = github_anchor(heading.group(1))
        result.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return result


def relative_links() -> Iterator[tuple[Path, str]]:
    for page in PAGES:
        for match in LINK.finditer(prose(page)):
            target = match.group(1)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                yield page, target


def resolve(page: Path, target: str) -> str | None:
    """Why a link from `page` does not resolve, or None when it does."""
    path_part, _, anchor = target.partition("#")
    path = (page.parent / path_part).resolve() if path_part else page
    if not path.is_relative_to(ROOT):
        return "leaves the repository"
    if not path.exists():
        return f"{path.relative_to(ROOT)} does not exist"
    if anchor:
        if path.suffix != ".md":
            return f"an anchor into {path.relative_to(ROOT)}, which is not Markdown"
        if anchor not in anchors(path):
            return f"{path.relative_to(ROOT)} has no heading #{anchor}"
    return None


def test_the_anchors_are_github_s() -> None:
    assert github_anchor("Runbook: uncertain email") == "runbook-uncertain-email"
    assert github_anchor("Carry it out: an adapter") == "carry-it-out-an-adapter"
    assert github_anchor("Set up (a fresh machine, Python 3.11+)") == "set-up-a-fresh-machine-python-311"
    assert github_anchor("`outbox_alembic_version`") == "outbox_alembic_version"


def test_every_relative_link_resolves() -> None:
    links = list(relative_links())
    assert links, "no page links to another"
    broken = [f"{page_name(page)}: ({target}) {why}" for page, target in links if (why := resolve(page, target))]
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve() for page, target in relative_links() if page == README
    }
    assert set(PAGES[1:]) <= linked, f"not linked from the README: {sorted(map(page_name, set(PAGES[1:]) - linked))}"


# this machine, or a host of one label (a compose service such as `prometheus`): neither is a page outside
LOOPBACK_URL = re.compile(r"https?://(127\.0\.0\.1|localhost|[a-z][a-z0-9-]*)(:\d+)?([/`)\s]|$)")
# an issue by its number is a word about the making; an issue on GitHub or GitLab is a post the product makes
FORBIDDEN = re.compile(r"\bthe seed\b|\bseed-outbox\b|\bissues? ?#?[0-9]+|\bshared/|\bspec\b|decisions\.md", re.I)


def test_no_page_leaves_the_repository_or_speaks_of_its_making() -> None:
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            outside = [url for url in re.findall(r"https?://\S*", line) if not LOOPBACK_URL.match(url)]
            assert not outside, f"{page_name(page)}:{number} links outside the repository: {outside}"
            word = FORBIDDEN.search(line)
            assert word is None, f"{page_name(page)}:{number} says {word.group(0)!r}: {line.strip()}"


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= 200, f"README.md has {lines} lines; move detail to docs/"


# -- the alerts' runbook links


def runbook_urls(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "runbook_url":
                yield value
            else:
                yield from runbook_urls(value)
    elif isinstance(node, list):
        for item in node:
            yield from runbook_urls(item)


def test_every_runbook_link_names_a_section_of_the_docs() -> None:
    source = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Source"].rstrip("/")
    files = [
        *sorted((ROOT / "deploy/grafana/alerting").glob("*.yaml")),
        *sorted((ROOT / "deploy/prometheus").glob("*.yml")),
        *sorted((ROOT / "tests/promtool").glob("*.yml")),
    ]
    checked = 0
    for file in files:
        for url in runbook_urls(yaml.safe_load(file.read_text())):
            where = f"{file.relative_to(ROOT)}: {url}"
            prefix = f"{source}/blob/main/"
            assert url.startswith(prefix), f"{where} is not a page of {source} on main"
            path, _, anchor = url.removeprefix(prefix).partition("#")
            assert path.startswith("docs/") and path.endswith(".md"), f"{where} is not a docs page"
            assert anchor.startswith("runbook-"), f"{where} names no runbook"
            assert (ROOT / path).is_file(), f"{where}: {path} does not exist"
            assert anchor in anchors(ROOT / path), f"{where}: {path} has no heading #{anchor}"
            checked += 1
    assert checked >= 8, f"only {checked} runbook links found in {[str(f.relative_to(ROOT)) for f in files]}"
