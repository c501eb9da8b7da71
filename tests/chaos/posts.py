"""The providers of a chaos run's SLACK_MESSAGE, GITHUB_POST and GITLAB_POST actions: the local Slack, GitHub and
GitLab APIs, each a process of its own, and what their stores hold once the run is over.

    executor ─▶ OUTBOX_CHAOS_SLACK_URL  ─▶ demo.slack_api  (channels C…1-4)      ─▶ its journal (every message)
    executor ─▶ OUTBOX_CHAOS_GITHUB_URL ─▶ demo.github_api (acme/shop, any PR)  ─▶ its journal (every post)
    executor ─▶ OUTBOX_CHAOS_GITLAB_URL ─▶ demo.gitlab_api (acme/shop, acme/api) ─▶ its journal (every post)
    the runner ─▶ each one's script file (demo.steps): the next posts' answers (stored and the answer lost by a
                  reset or a 502; refused by a rate limit for a while); SIGKILL and a restart (same port, same
                  journal: the store survives, as the provider's does)

Each process starts from its journal, so a killed server comes back with what it had stored. The checks read
every journal: each stored post's marker (Slack: the message's metadata; GitHub and GitLab: the body's last
line), when it was stored (this machine's clock) and where (channel, pull request, merge request or issue).
The workspace, account and host of a run share one name, `chaos<pid>n<run>` (registered names last as long
as their process: the next run in one process is at other ports); `register` declares them in the runner (to
enqueue) and in each executor process (to post), from the name and URLs `env` gives.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from demo import steps
from demo.nats import free_port

ROOT = Path(__file__).resolve().parents[2]
READY_SECONDS = 20.0
KINDS = ("SLACK_MESSAGE", "GITHUB_POST", "GITLAB_POST")
NAME_VARIABLE = "OUTBOX_CHAOS_POST_NAME"  # the Slack workspace's, the GitHub account's and the GitLab host's
_RUNS = itertools.count(1)
SLACK_TOKEN = "xoxb-1111-2222-chaostesttoken"
GITHUB_TOKEN = "ghp_" + "c4" * 18
GITLAB_TOKEN = "glpat-" + "c" * 20
CHANNELS = ("C0000000001", "C0000000002", "C0000000003", "C0000000004")
REPO = "acme/shop"
PULLS = (1, 2, 3, 4, 5, 6)
PROJECTS = ("acme/shop", "acme/api")
MERGE_REQUESTS = (1, 2, 3)
URL_VARIABLES = {
    "SLACK_MESSAGE": "OUTBOX_CHAOS_SLACK_URL",
    "GITHUB_POST": "OUTBOX_CHAOS_GITHUB_URL",
    "GITLAB_POST": "OUTBOX_CHAOS_GITLAB_URL",
}
# each API's script steps: the post stored and its answer lost (a reset, a 502), and a rate limit's refusal
LOST = {
    "SLACK_MESSAGE": ("kept-reset", "kept-502"),
    "GITHUB_POST": ("lost", "502-after"),
    "GITLAB_POST": ("lose", "502-after"),
}
SECONDARY = "You have exceeded a secondary rate limit and have been temporarily blocked from content creation."
LIMITED = {
    "SLACK_MESSAGE": ("429 1", "429 2"),
    "GITHUB_POST": tuple(json.dumps([code, {"retry-after": s}, SECONDARY]) for code, s in ((403, "2"), (429, "1"))),
    "GITLAB_POST": ("429",),
}
# what a fault's name calls each API
LABELS = {"SLACK_MESSAGE": "Slack API", "GITHUB_POST": "GitHub API", "GITLAB_POST": "GitLab API"}


def register(name: str, urls: dict[str, str]) -> None:
    """Declare the workspace, account and host `name` at the URLs by kind (tokens: from the environment)."""
    from outbox.github import register_account
    from outbox.gitlab.hosts import register_host
    from outbox.slack import register_workspace

    register_workspace(name, base_url=urls["SLACK_MESSAGE"] + "/api/", channel_rate="2/s")
    register_account(name, url=urls["GITHUB_POST"], rate="240/min")
    register_host(name, urls["GITLAB_POST"], rate="600/min")


@dataclass(frozen=True)
class Stored:
    """One post a provider's store holds: its marker, when it was stored (epoch seconds) and where."""

    marker: str
    at: float
    where: str


class ApiProcess:
    """One local API as a process: started again on the same port, journal and script file."""

    def __init__(self, kind: str, work_dir: Path) -> None:
        self.kind = kind
        self.port = free_port()
        stem = kind.split("_")[0].lower()
        self.journal = work_dir / f"{stem}-api.journal"
        self.script = work_dir / f"{stem}-api.script"
        self._log = work_dir / f"{stem}-api.log"
        module, args = {
            "SLACK_MESSAGE": ("demo.slack_api", ["--token", SLACK_TOKEN, "--channels", ",".join(CHANNELS)]),
            "GITHUB_POST": ("demo.github_api", ["--token", GITHUB_TOKEN, "--core-limit", "100000000"]),
            "GITLAB_POST": ("demo.gitlab_api", ["--token", GITLAB_TOKEN, *(f"--project={p}" for p in PROJECTS)]),
        }[kind]
        if kind == "SLACK_MESSAGE":
            args += ["--channel-rate", "2"]
        self._argv = [sys.executable, "-m", module, "--port", str(self.port), "--journal", str(self.journal)]
        self._argv += ["--script-file", str(self.script), *args]
        self.process: subprocess.Popen[bytes] | None = None
        self.limited_until = 0.0  # a rate limit's steps are taken out of the script then (time.monotonic())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start it (same port, same journal) and wait until it accepts connections."""
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(self._argv, cwd=ROOT, stdout=log, stderr=log)
        deadline = time.monotonic() + READY_SECONDS
        while not _accepts(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.kind}'s API exited with {self.process.returncode}: see {self._log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind}'s API did not listen within {READY_SECONDS:g} s")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL by PID: what it had stored stays in its journal, what it was answering is lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def script_steps(self, lines: list[str]) -> None:
        steps.write(self.script, lines)

    def scripted(self) -> bool:
        """Steps are left in its script: the last fault is not over."""
        return self.script.exists() and bool(self.script.read_text().strip())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def stored(self) -> list[Stored]:
        """Every post its journal holds, in the order stored."""
        if not self.journal.exists():
            return []
        if self.kind == "SLACK_MESSAGE":
            channels: dict[str, list[dict[str, object]]] = json.loads(self.journal.read_text())
            found = []
            for channel, messages in channels.items():
                for message in messages:
                    payload = message.get("metadata") or {}
                    key = payload.get("event_payload", {}).get("key", "") if isinstance(payload, dict) else ""
                    found.append(Stored(str(key), float(str(message["ts"])), channel))
            return sorted(found, key=lambda s: s.at)
        found = []
        for line in self.journal.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut by SIGKILL: the server did not keep it either
                continue
            if self.kind == "GITHUB_POST":
                last = str(entry["body"]).rstrip().rpartition("\n")[2]
                where = f"{entry['repo']}#{entry['number']}" if entry["kind"] != "issue" else f"{entry['repo']}:issues"
                found.append(Stored(last, float(entry["at"]), where))
            else:
                where = f"{entry['project']}:{entry['target']}:{entry['iid']}"
                marks = entry["markers"] or [""]
                found += [Stored(str(mark), float(entry["at"]), where) for mark in marks]
        return found


class PostProviders:
    """The run's three local APIs."""

    def __init__(self, work_dir: Path) -> None:
        self.name = f"chaos{os.getpid()}n{next(_RUNS)}"
        self.apis = {kind: ApiProcess(kind, work_dir) for kind in KINDS}
        for api in self.apis.values():
            api.start()

    def urls(self) -> dict[str, str]:
        return {kind: api.url for kind, api in self.apis.items()}

    def env(self) -> dict[str, str]:
        """What an executor process needs to reach and sign in to all three."""
        found = {URL_VARIABLES[kind]: url for kind, url in self.urls().items()}
        upper = self.name.upper()
        return {
            **found,
            NAME_VARIABLE: self.name,
            f"OUTBOX_SLACK_TOKEN_{upper}": SLACK_TOKEN,
            f"OUTBOX_GITHUB_TOKEN_{upper}": GITHUB_TOKEN,
            f"OUTBOX_GITLAB_TOKEN_{upper}": GITLAB_TOKEN,
        }

    def close(self) -> None:
        for api in self.apis.values():
            api.stop()

    def stored(self) -> dict[str, list[Stored]]:
        return {kind: api.stored() for kind, api in self.apis.items()}


def urls_from_environment() -> dict[str, str]:
    return {kind: os.environ[variable] for kind, variable in URL_VARIABLES.items()}


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
