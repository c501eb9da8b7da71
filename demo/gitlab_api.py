"""A local GitLab for the demo and the tests: GitLab's REST API v4 for notes, diff discussions and issues, on a
free 127.0.0.1 port in a thread of its own, with scripted faults and a rate limit that refuses past its budget.

    request ──PRIVATE-TOKEN──▶ unknown or revoked: 401 {"message": "401 Unauthorized"}
            ──rate budget (per token, a fixed window)──▶ spent: 429 "Retry later", Retry-After, RateLimit-* headers
            ──path──▶ POST   /api/v4/projects/:id/merge_requests/:iid/notes        201 a note
                      POST   /api/v4/projects/:id/issues/:iid/notes                201 a note (403 on a locked issue)
                      POST   /api/v4/projects/:id/merge_requests/:iid/discussions  201 a discussion (a DiffNote;
                             400 for a position outside the diff, as GitLab answers a line code it cannot make)
                      POST   /api/v4/projects/:id/issues                           201 an issue with its web_url
                      GET    the same four listings (paged: page, per_page, Link rel="next", X-Next-Page, X-Total;
                             notes sort=asc|desc order_by=created_at; issues created_after, order_by, sort)
                      GET    /api/v4/user                                          the token's user
                      unknown project or target: 404 {"message": "404 Project Not Found"}
            ──each POST takes the next step of `script` (none left: "ok")
        "ok"          store, 201
        "lose"        store, then close the connection without an answer (the answer is lost)
        "502-after"   store, then 502 (a proxy in front lost the answer)
        "502"         502, nothing stored
        "429"         429 with Retry-After: 1, nothing stored
        "stall"       store, then answer nothing until `released` is set (or the server stops)
        "401"         401, nothing stored (a token that expired)

Also a process of its own for the chaos harness and the benchmark: `python -m demo.gitlab_api --port P --token T
--journal FILE [--project PATH]... [--port-file F] [--script-file S]` keeps every post it stores as a line of FILE
(JSON: kind, project, target, iid, markers, and what was made, when) and starts from the posts FILE holds, as
GitLab's store survives a restart. With `--script-file`, each post takes its step from the first line of S
while S holds one (demo.steps).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from demo import steps

_MARKER = re.compile(r"<!-- outbox:[0-9a-f]{32}(?::[0-9]{1,3})? -->")
_ROUTE = re.compile(
    r"/api/v4/projects/(?P<project>[^/]+)"
    r"(?:/(?P<target>merge_requests|issues)(?:/(?P<iid>[0-9]+)/(?P<what>notes|discussions))?)?"
)
USER = {"id": 77, "username": "outbox-bot", "name": "outbox bot", "state": "active", "web_url": ""}
NOTE_LIMIT = 1_000_000


def now_text(moment: datetime | None = None) -> str:
    """GitLab's timestamps: UTC with milliseconds, 2026-12-04T21:00:00.123Z."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class Noteable:
    """A merge request or an issue: its notes and discussions, in the order made."""

    iid: int
    title: str = ""
    description: str = ""
    labels: list[str] = field(default_factory=list)
    created_at: str = field(default_factory=now_text)
    locked: bool = False
    notes: list[dict[str, Any]] = field(default_factory=list)
    discussions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Project:
    id: int
    path: str
    merge_requests: dict[int, Noteable] = field(default_factory=dict)
    issues: dict[int, Noteable] = field(default_factory=dict)
    # the lines of each file a merge request's diff shows (its new lines; an old line is in the same range)
    diff: dict[str, range] = field(default_factory=dict)


class GitlabApi:
    def __init__(
        self,
        tokens: Iterable[str] = (),
        script: Iterable[str] = (),
        *,
        port: int = 0,
        journal: Path | None = None,
        script_file: Path | None = None,
        budget: int | None = None,
        window_seconds: float = 60.0,
    ) -> None:
        self.tokens = set(tokens)
        self.revoked: set[str] = set()
        self.script: deque[str] = deque(script)
        self.journal = journal
        self.script_file = script_file
        # the posts a token may make per window; None: no limit
        self.budget = budget
        self.window_seconds = window_seconds
        self.accepted = 0
        self.refused = 0
        self.requests: list[tuple[str, str]] = []
        self.released = threading.Event()
        self.stalled = threading.Event()
        self.projects: dict[int, Project] = {}
        self._windows: dict[str, tuple[float, int]] = {}
        self._ids = 1000
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="gitlab-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> GitlabApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def add_project(
        self,
        path: str,
        *,
        merge_requests: Iterable[int] = (1,),
        issues: Iterable[int] = (1,),
        diff: dict[str, range] | None = None,
    ) -> Project:
        with self._lock:
            project = Project(len(self.projects) + 1, path, diff=diff or {"app.py": range(1, 101)})
            project.merge_requests = {iid: Noteable(iid) for iid in merge_requests}
            project.issues = {iid: Noteable(iid) for iid in issues}
            self.projects[project.id] = project
            return project

    def project(self, ref: str) -> Project | None:
        ref = unquote(ref)
        for project in self.projects.values():
            if ref in (str(project.id), project.path):
                return project
        return None

    # -- what the tests read

    def notes(self, path: str, target: str, iid: int) -> list[dict[str, Any]]:
        project = self.project(path)
        assert project is not None
        return list(getattr(project, target + "s")[iid].notes)

    def discussions(self, path: str, iid: int) -> list[dict[str, Any]]:
        project = self.project(path)
        assert project is not None
        return list(project.merge_requests[iid].discussions)

    def new_issues(self, path: str) -> list[Noteable]:
        project = self.project(path)
        assert project is not None
        return [issue for issue in project.issues.values() if issue.title]

    def markers(self) -> list[str]:
        """Every marker of every stored post, once per post (a review's discussions each count)."""
        with self._lock:
            found: list[str] = []
            for project in self.projects.values():
                for noteable in [*project.merge_requests.values(), *project.issues.values()]:
                    notes = [note for note in noteable.notes if note["type"] != "DiffNote"]  # in discussions
                    found += [m for note in notes for m in _MARKER.findall(note["body"])]
                    found += [m for d in noteable.discussions for m in _MARKER.findall(d["notes"][0]["body"])]
                    found += _MARKER.findall(noteable.description)
            return found

    # -- the server's side

    def next_step(self) -> str:
        with self._lock:
            if self.script:
                return self.script.popleft()
            return steps.take(self.script_file) or "ok"

    def admit(self, token: str) -> float | None:
        """None when the token may post now; else the seconds until its window starts again."""
        with self._lock:
            if self.budget is None:
                self.accepted += 1
                return None
            now = time.monotonic()
            start, used = self._windows.get(token, (now, 0))
            if now - start >= self.window_seconds:
                start, used = now, 0
            if used >= self.budget:
                self.refused += 1
                return self.window_seconds - (now - start)
            self._windows[token] = (start, used + 1)
            self.accepted += 1
            return None

    def next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def keep(self, entry: dict[str, Any]) -> None:
        if self.journal is not None:
            with self._lock, self.journal.open("a") as journal:
                journal.write(json.dumps(entry) + "\n")

    def load(self) -> None:
        """The posts the journal holds, stored again in the projects added (a line cut by a kill is skipped);
        ids go on after them."""
        if self.journal is None or not self.journal.exists():
            return
        with self._lock:
            for line in self.journal.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                project, made = self.project(str(entry["project"])), entry.get("made")
                if project is None or not isinstance(made, dict):
                    continue
                if entry["kind"] == "issue":
                    labels = [str(label) for label in made.get("labels", [])]
                    issue = Noteable(int(made["iid"]), made["title"], made["description"], labels, made["created_at"])
                    project.issues[issue.iid] = issue
                    continue
                noteables = project.merge_requests if entry["target"] == "merge_requests" else project.issues
                noteable = noteables.setdefault(int(entry["iid"]), Noteable(int(entry["iid"])))
                if entry["kind"] == "discussions":
                    noteable.discussions.append(made)
                    made = made["notes"][0]
                noteable.notes.append(made)
                self._ids = max(self._ids, int(made["id"]))


def _note(api: GitlabApi, project: Project, noteable: Noteable, kind: str, body: str) -> dict[str, Any]:
    return {
        "id": api.next_id(),
        "type": None,
        "body": body,
        "attachment": None,
        "author": USER,
        "created_at": now_text(),
        "updated_at": now_text(),
        "system": False,
        "noteable_id": 500 + noteable.iid,
        "noteable_type": kind,
        "project_id": project.id,
        "noteable_iid": noteable.iid,
        "resolvable": False,
        "confidential": False,
        "internal": False,
    }


def _issue_json(api: GitlabApi, project: Project, issue: Noteable) -> dict[str, Any]:
    return {
        "id": 9000 + issue.iid,
        "iid": issue.iid,
        "project_id": project.id,
        "title": issue.title,
        "description": issue.description,
        "state": "opened",
        "created_at": issue.created_at,
        "updated_at": issue.created_at,
        "labels": issue.labels,
        "author": USER,
        "discussion_locked": issue.locked,
        "web_url": f"{api.url}/{project.path}/-/issues/{issue.iid}",
    }


class Refusal(Exception):
    def __init__(self, status: int, message: Any) -> None:
        super().__init__(status)
        self.status = status
        self.message = message


def _handler(api: GitlabApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def finish(self) -> None:  # a closed connection cannot be flushed
            with contextlib.suppress(OSError, ValueError):
                super().finish()

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, verb: str) -> None:
            parts = urlsplit(self.path)
            query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            api.requests.append((verb, parts.path))
            token = self.headers.get("private-token", "")
            if token not in api.tokens or token in api.revoked:
                self._json(401, {"message": "401 Unauthorized"})
                return
            try:
                if parts.path == "/api/v4/user":
                    self._json(200, USER)
                    return
                route = _ROUTE.fullmatch(parts.path)
                if route is None:
                    raise Refusal(404, "404 Not Found")
                if verb == "GET":
                    self._list(route, query)
                else:
                    self._post(route, token, json.loads(raw or b"{}"))
            except Refusal as refused:
                self._json(refused.status, {"message": refused.message})

        def _target(self, route: re.Match[str]) -> tuple[Project, Noteable | None]:
            project = api.project(route["project"])
            if project is None:
                raise Refusal(404, "404 Project Not Found")
            if route["iid"] is None:
                return project, None
            noteables = project.merge_requests if route["target"] == "merge_requests" else project.issues
            noteable = noteables.get(int(route["iid"]))
            if noteable is None:
                raise Refusal(404, "404 Not found")
            return project, noteable

        def _list(self, route: re.Match[str], query: dict[str, str]) -> None:
            project, noteable = self._target(route)
            with api._lock:
                if noteable is None and route["target"] == "issues":
                    items = [_issue_json(api, project, issue) for issue in project.issues.values()]
                    after = query.get("created_after")
                    if after is not None:
                        items = [i for i in items if _instant(i["created_at"]) >= _instant(after)]
                    items.sort(key=lambda i: (i[query.get("order_by", "created_at")], i["id"]))
                    if query.get("sort", "desc") == "desc":
                        items.reverse()
                elif noteable is not None and route["what"] == "notes":
                    items = sorted(noteable.notes, key=lambda n: (n[query.get("order_by", "created_at")], n["id"]))
                    if query.get("sort", "desc") == "desc":
                        items.reverse()
                elif noteable is not None and route["what"] == "discussions":
                    items = list(noteable.discussions)
                else:
                    raise Refusal(404, "404 Not Found")
            self._page(items, query)

        def _page(self, items: list[dict[str, Any]], query: dict[str, str]) -> None:
            page = max(1, int(query.get("page", "1")))
            per_page = min(100, max(1, int(query.get("per_page", "20"))))
            pages = max(1, math.ceil(len(items) / per_page))
            shown = items[(page - 1) * per_page : page * per_page]
            headers = {
                "X-Page": str(page),
                "X-Per-Page": str(per_page),
                "X-Total": str(len(items)),
                "X-Total-Pages": str(pages),
                "X-Next-Page": str(page + 1) if page < pages else "",
                "X-Prev-Page": str(page - 1) if page > 1 else "",
            }
            if page < pages:
                rest = {**query, "page": str(page + 1), "per_page": str(per_page)}
                link = urlsplit(self.path)._replace(query="&".join(f"{k}={v}" for k, v in rest.items()))
                headers["Link"] = f'<{api.url}{link.geturl()}>; rel="next"'
            self._json(200, shown, headers)

        def _post(self, route: re.Match[str], token: str, data: dict[str, Any]) -> None:
            wait = api.admit(token)
            if wait is not None:
                self._limited(wait)
                return
            step = api.next_step()
            if step in ("502", "429", "401"):
                if step == "429":
                    self._limited(1.0)
                else:
                    self._json(int(step), {"message": f"{step} Bad Gateway" if step == "502" else "401 Unauthorized"})
                return
            project, noteable = self._target(route)
            made = self._make(route, project, noteable, data)
            api.keep(
                {
                    "kind": route["what"] or "issue",
                    "project": project.path,
                    "target": route["target"],
                    "iid": made.get("iid") or route["iid"],
                    "markers": _MARKER.findall(json.dumps(data).replace("\\u003c", "<")),
                    "made": made,
                    "at": time.time(),
                }
            )
            if step == "lose":
                self.close_connection = True  # the connection closes with no answer
            elif step == "502-after":
                self._json(502, {"message": "502 Bad Gateway"})
            elif step == "stall":
                api.stalled.set()
                api.released.wait(120)
                self.close_connection = True
            else:
                self._json(201, made)

        def _make(
            self, route: re.Match[str], project: Project, noteable: Noteable | None, data: dict[str, Any]
        ) -> dict[str, Any]:
            body = data.get("body")
            if noteable is None:  # a new issue
                title = data.get("title")
                if not isinstance(title, str) or not title.strip():
                    raise Refusal(400, {"title": ["can't be blank"]})
                with api._lock:
                    iid = max([0, *project.issues]) + 1
                    labels = data.get("labels") or []
                    named = labels.split(",") if isinstance(labels, str) else [str(x) for x in labels]
                    issue = Noteable(iid, title, data.get("description") or "", [x for x in named if x])
                    project.issues[iid] = issue
                    return _issue_json(api, project, issue)
            if not isinstance(body, str) or not body.strip():
                raise Refusal(400, '400 Bad request - Note {:note=>["can\'t be blank"]}')
            if len(body) > NOTE_LIMIT:
                raise Refusal(400, '400 Bad request - Note {:note=>["is too long (maximum is 1000000 characters)"]}')
            kind = "MergeRequest" if route["target"] == "merge_requests" else "Issue"
            if noteable.locked:
                raise Refusal(403, "403 Forbidden")
            note = _note(api, project, noteable, kind, body)
            if route["what"] == "notes":
                with api._lock:
                    noteable.notes.append(note)
                return note
            position = data.get("position")
            if not _in_diff(project, position):
                raise Refusal(
                    400,
                    '400 Bad request - Note {:line_code=>["can\'t be blank", "must be a valid line code"],'
                    ' :position=>["is incomplete"]}',
                )
            assert isinstance(position, dict)
            note.update(type="DiffNote", position={**position, "position_type": "text"}, resolvable=True)
            discussion = {"id": f"{note['id']:040x}", "individual_note": False, "notes": [note]}
            with api._lock:
                noteable.discussions.append(discussion)
                noteable.notes.append(note)
            return discussion

        def _limited(self, wait: float) -> None:
            reset = math.ceil(time.time() + wait)
            self._text(
                429,
                b"Retry later\n",
                {
                    "Retry-After": str(max(1, math.ceil(wait))),
                    "RateLimit-Limit": str(api.budget or 0),
                    "RateLimit-Observed": str(api.budget or 0),
                    "RateLimit-Remaining": "0",
                    "RateLimit-Reset": str(reset),
                    "RateLimit-ResetTime": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(reset)),
                },
            )

        def _json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
            self._text(status, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _text(self, status: int, content: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in {"Content-Type": "text/plain", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

    return Handler


def _in_diff(project: Project, position: object) -> bool:
    if not isinstance(position, dict) or not all(position.get(k) for k in ("base_sha", "start_sha", "head_sha")):
        return False
    lines = project.diff.get(str(position.get("new_path")))
    chosen = [position.get("new_line"), position.get("old_line")]
    return lines is not None and any(isinstance(n, int) and n in lines for n in chosen)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def main() -> None:
    parser = argparse.ArgumentParser(description="a local GitLab API (notes, discussions, issues) with a journal")
    parser.add_argument("--port", type=int, required=True, help="0: a free port (see --port-file)")
    parser.add_argument("--port-file", type=Path, help="written with the port once listening")
    parser.add_argument("--token", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--project", action="append", default=[], help="a project's path (100 MRs and issues each)")
    parser.add_argument("--budget", type=int, help="posts a token may make a minute")
    parser.add_argument("--script-file", type=Path, help="each post's step: the first line of this file (taken)")
    arguments = parser.parse_args()
    api = GitlabApi(
        [arguments.token],
        port=arguments.port,
        journal=arguments.journal,
        script_file=arguments.script_file,
        budget=arguments.budget,
    )
    for path in arguments.project or ["acme/shop"]:
        api.add_project(path, merge_requests=range(1, 101), issues=range(1, 101))
    api.load()
    api.start()
    if arguments.port_file is not None:
        arguments.port_file.write_text(api.url.rsplit(":", 1)[1])
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()
    api.stop()


if __name__ == "__main__":
    main()
