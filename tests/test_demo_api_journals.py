"""The local Slack, GitHub and GitLab APIs as processes of their own keep what they stored across a SIGKILL
(their journal) and take their faults from a script file, as the chaos harness uses them.

Each: a post through the provider's own client library; SIGKILL; a new process on the same port and journal
lists the post, and makes a new one beside it with another id; a `502` line in the script file refuses the next
post and stores nothing, the post after it is stored.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import gitlab
import pytest
from githubkit import GitHub, TokenAuthStrategy
from githubkit.exception import RequestFailed
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from demo import steps
from demo.nats import free_port
from tests.support import until

ROOT = Path(__file__).resolve().parents[1]
SLACK_TOKEN = "xoxb-1111-2222-localtesttoken"
GITHUB_TOKEN = "ghp_" + "a1" * 18
GITLAB_TOKEN = "glpat-" + "x" * 20
CHANNEL = "C0000000001"


class Server:
    """One API process: started again on the same port, journal and script file."""

    def __init__(self, tmp_path: Path, module: str, *args: str) -> None:
        self.port = free_port()
        self.journal, self.script = tmp_path / f"{module}.journal", tmp_path / f"{module}.script"
        self.port_file = tmp_path / f"{module}.port"
        self.argv = [sys.executable, "-m", module, "--port", str(self.port), "--journal", str(self.journal)]
        self.argv += ["--script-file", str(self.script), "--port-file", str(self.port_file), *args]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)
        self.process = subprocess.Popen(self.argv, cwd=ROOT)
        until(lambda: self.port_file.exists() and bool(self.port_file.read_text()), 30, "the server to listen")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def server(module: str, *args: str) -> Server:
        made.append(Server(tmp_path, module, *args))
        made[-1].start()
        return made[-1]

    yield server
    for found in made:
        found.stop()


def test_slack_keeps_its_messages_across_a_kill_and_takes_scripted_faults(servers: Callable[..., Server]) -> None:
    server = servers("demo.slack_api", "--token", SLACK_TOKEN, "--channels", CHANNEL, "--channel-rate", "50")
    client = WebClient(token=SLACK_TOKEN, base_url=f"http://127.0.0.1:{server.port}/api/", retry_handlers=[])
    first = client.chat_postMessage(channel=CHANNEL, text="before")["ts"]
    server.kill()
    server.start()
    steps.write(server.script, ["502"])
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel=CHANNEL, text="refused")
    assert refused.value.response.status_code == 502
    second = client.chat_postMessage(channel=CHANNEL, text="after")["ts"]
    listed = client.conversations_history(channel=CHANNEL)["messages"]
    assert [(m["text"], m["ts"]) for m in listed] == [("after", second), ("before", first)]
    assert first != second


def test_github_keeps_its_posts_across_a_kill_and_takes_scripted_faults(servers: Callable[..., Server]) -> None:
    server = servers("demo.github_api", "--token", GITHUB_TOKEN)
    github = GitHub(TokenAuthStrategy(GITHUB_TOKEN), base_url=f"http://127.0.0.1:{server.port}", auto_retry=False)
    first = github.rest.issues.create_comment("acme", "shop", 7, body="before").parsed_data.id
    issue = github.rest.issues.create("acme", "shop", title="an issue", body="its body").parsed_data.number
    server.kill()
    server.start()
    steps.write(server.script, ["502"])
    with pytest.raises(RequestFailed) as refused:
        github.rest.issues.create_comment("acme", "shop", 7, body="refused")
    assert refused.value.response.status_code == 502
    second = github.rest.issues.create_comment("acme", "shop", 7, body="after").parsed_data.id
    listed = github.rest.issues.list_comments("acme", "shop", 7).parsed_data
    assert [(c.body, c.id) for c in listed] == [("before", first), ("after", second)]
    assert first != second
    issues = github.rest.issues.list_for_repo("acme", "shop", state="all", since="2000-01-01T00:00:00Z").parsed_data
    assert [(i.number, i.title) for i in issues if not i.pull_request] == [(issue, "an issue")]
    assert github.rest.issues.create("acme", "shop", title="next", body="b").parsed_data.number == issue + 1


def test_gitlab_keeps_its_posts_across_a_kill_and_takes_scripted_faults(servers: Callable[..., Server]) -> None:
    server = servers("demo.gitlab_api", "--token", GITLAB_TOKEN, "--project", "acme/shop")
    project = gitlab.Gitlab(f"http://127.0.0.1:{server.port}", private_token=GITLAB_TOKEN, retry_transient_errors=False)
    project = project.projects.get("acme/shop", lazy=True)
    first = project.mergerequests.get(7, lazy=True).notes.create({"body": "before"}).id
    issue = project.issues.create({"title": "an issue", "description": "its body"}).iid
    server.kill()
    server.start()
    steps.write(server.script, ["502"])
    with pytest.raises(gitlab.exceptions.GitlabCreateError) as refused:
        project.mergerequests.get(7, lazy=True).notes.create({"body": "refused"})
    assert refused.value.response_code == 502
    second = project.mergerequests.get(7, lazy=True).notes.create({"body": "after"}).id
    listed = project.mergerequests.get(7, lazy=True).notes.list(get_all=True, sort="asc")
    assert [(n.body, n.id) for n in listed] == [("before", first), ("after", second)]
    assert first != second
    assert [(i.iid, i.title) for i in project.issues.list(get_all=True) if i.title] == [(issue, "an issue")]
