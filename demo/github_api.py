"""A local GitHub REST API for the demo and the tests: a real HTTP server on a free 127.0.0.1 port, in a thread,
answering the paths outbox's GitHub posts use with GitHub's JSON shapes, headers and status codes, so that
githubkit's typed models parse every answer.

    POST /app/installations/{id}/access_tokens   (Bearer: a JWT the App's key signed) ─▶ 201 a token, expires_at
    POST /repos/{o}/{r}/issues/{n}/comments       ─▶ 201 IssueComment       GET ─▶ since, per_page, page, Link
    POST /repos/{o}/{r}/pulls/{n}/reviews         ─▶ 200 PullRequestReview  GET ─▶ per_page, page, Link
    POST /repos/{o}/{r}/issues                    ─▶ 201 Issue              GET ─▶ state, sort, direction, since, ...
    every answer: x-ratelimit-limit/-remaining/-used/-reset/-resource, x-github-request-id

Limits as GitHub applies them: the primary limit (`core_limit` requests per token each `core_window` seconds;
past it 403 with `x-ratelimit-remaining: 0` and the reset), and the secondary limit on content creation (a
bucket of `content_rate` posts a second and `content_burst`; past it 403 with `retry-after`). Tokens: the given
ones, and the installation tokens the App's JWT obtains, which expire after `token_lifetime` seconds (401 "Bad
credentials" after, as for a revoked one). Each post a content request makes takes the next step of `script`:
    "ok"         store it, answer as GitHub does
    "lost"       store it, then reset the connection: the answer is lost
    "502-after"  store it, then answer 502 (GitHub's slow write)
    "stall"      store it, answer nothing until `released` is set or the server stops
    "502", "401", "404", "422" and "403-secondary"   that answer, nothing stored ("403-secondary": no retry-after)
    (status, headers, message)   that answer, GitHub's error JSON with that message, nothing stored

Also a process of its own, for the chaos harness, the demo and bench.github_cost: `python -m demo.github_api
--port P --token T --journal FILE [--port-file F] [--script-file S]` serves any repository (pull requests 1 to
10,000), appends each stored post to FILE as a JSON line, and starts from the posts FILE holds (as GitHub's
store survives a restart). With `--script-file`, each post takes its step from the first line of S while S
holds one (demo.steps): a name above, or an answer as a JSON list [status, {headers}, message].
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import re
import secrets
import signal
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt

from demo import steps

DOCS = "https://docs.github.com/rest"
HEAD_SHA = hashlib.sha1(b"head").hexdigest()
_PATHS = {
    "token": re.compile(r"/app/installations/(\d+)/access_tokens"),
    "comments": re.compile(r"/repos/([^/]+)/([^/]+)/issues/(\d+)/comments"),
    "reviews": re.compile(r"/repos/([^/]+)/([^/]+)/pulls/(\d+)/reviews"),
    "issues": re.compile(r"/repos/([^/]+)/([^/]+)/issues"),
}


# a step of the script: a name, or an answer (status, headers, message)
Step = str | tuple[int, dict[str, str], str]


@dataclass
class Target:
    """A pull request or an issue of a repository."""

    number: int
    title: str
    pull: bool
    created_at: str
    locked: bool = False
    head_sha: str = HEAD_SHA
    # a pull request's diff: the lines of each file a review may comment on
    files: dict[str, range] = field(default_factory=dict)
    body: str | None = None
    labels: list[str] = field(default_factory=list)


@dataclass
class Repo:
    owner: str
    name: str
    targets: dict[int, Target] = field(default_factory=dict)
    issues_enabled: bool = True


@dataclass(frozen=True)
class Post:
    """One stored post: `kind` comment, review or issue; `number` its target (an issue's own number)."""

    kind: str
    repo: str
    number: int
    id: int
    body: str
    created_at: str
    html_url: str
    data: dict[str, Any]


@dataclass
class Bucket:
    rate: float
    burst: float
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one is there."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class GithubApi:
    def __init__(
        self,
        *,
        tokens: Iterable[str] = (),
        app: tuple[int, str] | None = None,
        token_lifetime: float = 3600.0,
        core_limit: int = 5000,
        core_window: float = 3600.0,
        content_rate: float | None = None,
        content_burst: float = 1.0,
        script: Iterable[Step] = (),
        any_repo: bool = False,
        journal: Path | None = None,
        script_file: Path | None = None,
        port: int = 0,
    ) -> None:
        self.tokens: dict[str, float] = dict.fromkeys(tokens, math.inf)  # token -> expires (time.time())
        # the App's id and public key (PEM): its JWTs obtain installation tokens
        self.app = app
        self.token_lifetime = token_lifetime
        self.core_limit, self.core_window = core_limit, core_window
        self._core: dict[str, tuple[float, int]] = {}  # token -> (window start, used)
        self._content = None if content_rate is None else Bucket(content_rate, content_burst, content_burst, 0.0)
        self.script: deque[Step] = deque(script)
        self.any_repo = any_repo
        self.journal = journal
        self.script_file = script_file
        self.repos: dict[str, Repo] = {}
        self.posts: list[Post] = []
        self.issued: list[tuple[str, float]] = []  # installation tokens issued, with their expiry
        self.refused_tokens: list[str] = []  # tokens refused as expired or revoked
        self.accepted = 0  # content-creating requests answered 2xx
        self.limited = 0  # content-creating requests refused by a rate limit
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.released = threading.Event()
        self.stored = threading.Event()
        self._ids = itertools.count(1001)
        self._lock = threading.Lock()
        if journal is not None and journal.exists():
            self._load(journal)
        self._server = _Server(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="github-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> GithubApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def add_repo(self, full_name: str, *, pulls: Iterable[int] = (), issues: Iterable[int] = ()) -> Repo:
        owner, name = full_name.split("/")
        repo = self.repos[full_name] = Repo(owner, name)
        for number in pulls:
            repo.targets[number] = Target(number, f"Pull {number}", True, _now(), files={"app.py": range(1, 200)})
        for number in issues:
            repo.targets[number] = Target(number, f"Issue {number}", False, _now())
        return repo

    def revoke(self, token: str) -> None:
        with self._lock:
            self.tokens.pop(token, None)

    def posts_of(self, kind: str) -> list[Post]:
        with self._lock:
            return [post for post in self.posts if post.kind == kind]

    # -- what the handler asks

    def repo(self, owner: str, name: str) -> Repo | None:
        full = f"{owner}/{name}"
        if full not in self.repos and self.any_repo:
            self.add_repo(full, pulls=range(1, 10_001))
        return self.repos.get(full)

    def authorized(self, header: str) -> str | None:
        """The request's token when it is valid now; None (and noted) otherwise."""
        scheme, _, token = header.partition(" ")
        with self._lock:
            expires = self.tokens.get(token) if scheme.lower() in ("token", "bearer") else None
            if expires is not None and time.time() < expires:
                return token
            self.refused_tokens.append(token)
            return None

    def issue_token(self, bearer: str, installation: int) -> dict[str, Any] | None:
        """An installation token for an App JWT GitHub would take (RS256, the App's id as `iss`, not expired)."""
        scheme, _, encoded = bearer.partition(" ")
        if self.app is None or scheme.lower() != "bearer":
            return None
        app_id, public_key = self.app
        try:
            claims = jwt.decode(encoded, public_key, algorithms=["RS256"], options={"require": ["iat", "exp", "iss"]})
        except jwt.PyJWTError:
            return None
        if str(claims["iss"]) != str(app_id):
            return None
        token = "ghs_" + secrets.token_hex(18)
        expires = time.time() + self.token_lifetime
        with self._lock:
            self.tokens[token] = expires
            self.issued.append((token, expires))
        return {
            "token": token,
            "expires_at": _stamp(expires),
            "permissions": {"issues": "write", "pull_requests": "write", "metadata": "read"},
            "repository_selection": "all",
        }

    def core(self, token: str) -> tuple[dict[str, str], bool]:
        """Count a request against the token's primary limit: the x-ratelimit-* headers after it, and whether the
        limit lets it through (a refused request counts nothing)."""
        now = time.time()
        with self._lock:
            start, used = self._core.get(token, (now, 0))
            if now >= start + self.core_window:
                start, used = now, 0
            allowed = used < self.core_limit
            used += allowed
            self._core[token] = (start, used)
        headers = {
            "x-ratelimit-limit": str(self.core_limit),
            "x-ratelimit-remaining": str(self.core_limit - used),
            "x-ratelimit-used": str(used),
            "x-ratelimit-reset": str(math.ceil(start + self.core_window)),
            "x-ratelimit-resource": "core",
        }
        return headers, allowed

    def content_wait(self) -> float:
        """0 when a content-creating request may go now, else the seconds the secondary limit asks to wait."""
        if self._content is None:
            return 0.0
        with self._lock:
            wait = self._content.take(time.monotonic())
            if wait:
                self.limited += 1
            return wait

    def next_step(self) -> Step:
        with self._lock:
            if self.script:
                return self.script.popleft()
            line = steps.take(self.script_file)
        if line is None:
            return "ok"
        if line.startswith("["):
            status, headers, message = json.loads(line)
            return int(status), {str(k): str(v) for k, v in headers.items()}, str(message)
        return line

    def store(self, kind: str, repo: Repo, number: int, body: str, data: dict[str, Any]) -> Post:
        with self._lock:
            post = Post(kind, f"{repo.owner}/{repo.name}", number, next(self._ids), body, _now(), "", data)
            post = _with_url(post)
            self.posts.append(post)
            if self.journal is not None:
                entry = {"kind": kind, "repo": post.repo, "number": number, "body": body, "id": post.id}
                entry |= {"created_at": post.created_at, "at": time.time(), "data": data}
                with self.journal.open("a") as journal:
                    journal.write(json.dumps(entry) + "\n")
        self.stored.set()
        return post

    def _load(self, journal: Path) -> None:
        """The posts a journal holds, stored again (a line cut by a kill is skipped); ids go on after them."""
        last = 1000
        for line in journal.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            repo = self.repo(*entry["repo"].split("/"))
            if repo is None:
                continue
            number, data = int(entry["number"]), dict(entry.get("data") or {})
            post_id = int(entry.get("id") or last + 1)
            created = str(entry.get("created_at") or _now())
            if entry["kind"] == "issue":
                target = Target(number, str(data.get("title", "")), False, created, body=entry["body"])
                target.labels = [str(label) for label in data.get("labels", [])]
                repo.targets[number] = target
            post = Post(entry["kind"], entry["repo"], number, post_id, entry["body"], created, "", data)
            self.posts.append(_with_url(post))
            last = max(last, post_id)
        self._ids = itertools.count(last + 1)


class _Server(ThreadingHTTPServer):
    # the connections a backlog's burst opens at once wait to be accepted, as at GitHub's front door
    request_queue_size = 128


def _with_url(post: Post) -> Post:
    base = f"https://github.com/{post.repo}"
    if post.kind == "comment":
        url = f"{base}/pull/{post.number}#issuecomment-{post.id}"
    elif post.kind == "review":
        url = f"{base}/pull/{post.number}#pullrequestreview-{post.id}"
    else:
        url = f"{base}/issues/{post.number}"
    return Post(post.kind, post.repo, post.number, post.id, post.body, post.created_at, url, post.data)


def _now() -> str:
    return _stamp(time.time())


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user(login: str = "outbox-app[bot]", user_id: int = 41898282) -> dict[str, Any]:
    api = f"https://api.github.com/users/{login}"
    return {
        "login": login,
        "id": user_id,
        "node_id": "MDM6Qm90NDE4OTgyODI=",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{user_id}?v=4",
        "gravatar_id": "",
        "url": api,
        "html_url": f"https://github.com/apps/{login.removesuffix('[bot]')}",
        "followers_url": f"{api}/followers",
        "following_url": f"{api}/following{{/other_user}}",
        "gists_url": f"{api}/gists{{/gist_id}}",
        "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/subscriptions",
        "organizations_url": f"{api}/orgs",
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events{{/privacy}}",
        "received_events_url": f"{api}/received_events",
        "type": "Bot",
        "site_admin": False,
    }


def comment_json(post: Post) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{post.repo}"
    return {
        "id": post.id,
        "node_id": f"IC_{post.id}",
        "url": f"{api}/issues/comments/{post.id}",
        "html_url": post.html_url,
        "body": post.body,
        "user": _user(),
        "created_at": post.created_at,
        "updated_at": post.created_at,
        "issue_url": f"{api}/issues/{post.number}",
        "author_association": "NONE",
    }


def review_json(post: Post) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{post.repo}/pulls/{post.number}"
    return {
        "id": post.id,
        "node_id": f"PRR_{post.id}",
        "user": _user(),
        "body": post.body,
        "state": "COMMENTED",
        "html_url": post.html_url,
        "pull_request_url": api,
        "_links": {"html": {"href": post.html_url}, "pull_request": {"href": api}},
        "submitted_at": post.created_at,
        "commit_id": post.data["commit_id"],
        "author_association": "NONE",
    }


def issue_json(repo: Repo, target: Target) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{repo.owner}/{repo.name}/issues/{target.number}"
    page = f"https://github.com/{repo.owner}/{repo.name}/{'pull' if target.pull else 'issues'}/{target.number}"
    found: dict[str, Any] = {
        "id": 500_000 + target.number,
        "node_id": f"I_{target.number}",
        "url": api,
        "repository_url": f"https://api.github.com/repos/{repo.owner}/{repo.name}",
        "labels_url": f"{api}/labels{{/name}}",
        "comments_url": f"{api}/comments",
        "events_url": f"{api}/events",
        "html_url": page,
        "number": target.number,
        "state": "open",
        "title": target.title,
        "body": target.body,
        "user": _user(),
        "labels": [
            {"id": i + 1, "node_id": f"LA_{i}", "url": f"{api}/labels/{name}", "name": name, "color": "ededed"}
            for i, name in enumerate(target.labels)
        ],
        "assignee": None,
        "milestone": None,
        "locked": target.locked,
        "comments": 0,
        "closed_at": None,
        "created_at": target.created_at,
        "updated_at": target.created_at,
        "author_association": "NONE",
    }
    if target.pull:
        found["pull_request"] = {
            "url": api.replace("/issues/", "/pulls/"),
            "html_url": page,
            "diff_url": page + ".diff",
            "patch_url": page + ".patch",
            "merged_at": None,
        }
    return found


def _handler(api: GithubApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def finish(self) -> None:  # a reset connection cannot be flushed
            with contextlib.suppress(OSError, ValueError):
                super().finish()

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            if len(raw) < length:  # the client went away mid-request: nothing is made of it, as GitHub makes nothing
                self.close_connection = True
                return
            sent = json.loads(raw) if raw else None
            with api._lock:
                api.requests.append((method, parts.path))
            auth = self.headers.get("authorization", "")
            found = _PATHS["token"].fullmatch(parts.path)
            if found and method == "POST":
                issued = api.issue_token(auth, int(found.group(1)))
                if issued is None:
                    self._error(401, "A JSON web token could not be decoded")
                else:
                    self._json(201, issued)
                return
            token = api.authorized(auth)
            if token is None:
                self._error(401, "Bad credentials")
                return
            limits, allowed = api.core(token)
            if not allowed:
                self._error(403, "API rate limit exceeded for installation ID 1.", limits)
                return
            self._route(method, parts.path, query, sent, limits)

        def _route(self, method: str, path: str, query: dict[str, str], sent: Any, limits: dict[str, str]) -> None:
            for name in ("comments", "reviews", "issues"):
                found = _PATHS[name].fullmatch(path)
                if found:
                    repo = api.repo(found.group(1), found.group(2))
                    if repo is None:
                        self._error(404, "Not Found", limits)
                        return
                    number = int(found.group(3)) if name != "issues" else None
                    if method == "GET":
                        self._list(name, repo, number, query, limits)
                    else:
                        self._create(name, repo, number, sent if isinstance(sent, dict) else {}, limits)
                    return
            self._error(404, "Not Found", limits)

        def _list(
            self, name: str, repo: Repo, number: int | None, query: dict[str, str], limits: dict[str, str]
        ) -> None:
            per_page = min(int(query.get("per_page", "30")), 100)
            page = int(query.get("page", "1"))
            since = query.get("since")
            full = f"{repo.owner}/{repo.name}"
            if name == "issues":
                targets = [t for t in repo.targets.values() if not since or t.created_at >= _normal(since)]
                targets.sort(key=lambda t: t.number, reverse=query.get("direction", "desc") == "desc")
                rows: list[dict[str, Any]] = [issue_json(repo, t) for t in targets]
            else:
                if number not in repo.targets or (name == "reviews" and not repo.targets[number].pull):
                    self._error(404, "Not Found", limits)
                    return
                kind = "comment" if name == "comments" else "review"
                posts = [p for p in api.posts_of(kind) if p.repo == full and p.number == number]
                if since and name == "comments":
                    posts = [p for p in posts if p.created_at >= _normal(since)]
                rows = [comment_json(p) if kind == "comment" else review_json(p) for p in posts]
            shown = rows[(page - 1) * per_page : page * per_page]
            headers = dict(limits)
            if page * per_page < len(rows):
                headers["link"] = (
                    f'<{api.url}{self.path.split("?")[0]}?per_page={per_page}&page={page + 1}>; rel="next"'
                )
            self._json(200, shown, headers)

        def _create(
            self, name: str, repo: Repo, number: int | None, sent: dict[str, Any], limits: dict[str, str]
        ) -> None:
            wait = api.content_wait()
            if wait:
                message = (
                    "You have exceeded a secondary rate limit and have been temporarily blocked from content creation."
                )
                self._error(403, message, {**limits, "retry-after": str(max(1, math.ceil(wait)))})
                return
            step = api.next_step()
            if isinstance(step, tuple):
                status, headers, message = step
                self._error(status, message, {**limits, **headers})
                return
            if step in ("502", "401", "404", "422", "403-secondary"):
                self._scripted(step, limits)
                return
            refused = _refusal(name, repo, number, sent)
            if refused is not None:
                status, message, errors = refused
                self._error(status, message, limits, errors)
                return
            body = str(sent.get("body") or "")
            if name == "issues":
                number = max(repo.targets, default=0) + 1
                target = repo.targets[number] = Target(number, str(sent["title"]), False, _now(), body=body)
                target.labels = [str(label) for label in sent.get("labels", [])]
                post = api.store("issue", repo, number, body, {"title": target.title, "labels": target.labels})
                answer: tuple[int, dict[str, Any]] = (201, issue_json(repo, target))
            elif name == "comments":
                assert number is not None
                post = api.store("comment", repo, number, body, {})
                answer = (201, comment_json(post))
            else:
                assert number is not None
                post = api.store(
                    "review", repo, number, body, {"commit_id": sent["commit_id"], "comments": sent.get("comments", [])}
                )
                answer = (200, review_json(post))
            with api._lock:
                api.accepted += 1
            if step == "lost":
                self._reset()
            elif step == "stall":
                api.released.wait(120)
                self.close_connection = True
            elif step == "502-after":
                self._json(502, {"message": "Server Error"}, limits)
            else:
                self._json(*answer, limits)

        def _scripted(self, step: str, limits: dict[str, str]) -> None:
            if step == "403-secondary":
                self._error(403, "You have exceeded a secondary rate limit. Please wait a few minutes.", limits)
            elif step == "502":
                self._json(502, {"message": "Server Error"}, limits)
            else:
                messages = {"401": "Bad credentials", "404": "Not Found", "422": "Unprocessable Entity"}
                self._error(int(step), messages[step], limits)

        def _error(
            self, status: int, message: str, headers: Mapping[str, str] | None = None, errors: Any = None
        ) -> None:
            found: dict[str, Any] = {"message": message, "documentation_url": DOCS, "status": str(status)}
            if errors is not None:
                found["errors"] = errors
            self._json(status, found, headers)

        def _json(self, status: int, content: Any, headers: Mapping[str, str] | None = None) -> None:
            data = json.dumps(content).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.send_header("x-github-api-version-selected", "2022-11-28")
            self.send_header("x-github-request-id", secrets.token_hex(8).upper())
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _reset(self) -> None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

    return Handler


def _refusal(name: str, repo: Repo, number: int | None, sent: dict[str, Any]) -> tuple[int, str, Any] | None:
    """GitHub's refusal of a post, or None when it would take it."""
    if name == "issues":
        if not repo.issues_enabled:
            return 410, "Issues are disabled for this repo", None
        if not isinstance(sent.get("title"), str) or not sent["title"]:
            return 422, "Validation Failed", [{"resource": "Issue", "code": "missing_field", "field": "title"}]
        return None
    target = repo.targets.get(number or 0)
    if target is None or (name == "reviews" and not target.pull):
        return 404, "Not Found", None
    if target.locked:
        return 403, "Unable to create comment because issue is locked.", None
    if name == "reviews":
        if sent.get("commit_id") != target.head_sha:
            return 422, "Unprocessable Entity", ["Commit is not part of the pull request"]
        for comment in sent.get("comments", []):
            lines = target.files.get(comment.get("path"))
            if lines is None or comment.get("line") not in lines:
                return 422, "Unprocessable Entity", ["Pull request review thread line must be part of the diff"]
    return None


def _normal(since: str) -> str:
    """A `since` as GitHub takes it (ISO 8601) in the form the posts' times have, to compare as text."""
    return _stamp(datetime.fromisoformat(since.replace("Z", "+00:00")).timestamp())


def main() -> None:
    parser = argparse.ArgumentParser(description="a local GitHub REST API that journals every post it stores")
    parser.add_argument("--port", type=int, required=True, help="0: a free one, written to --port-file")
    parser.add_argument("--port-file", type=Path, default=None)
    parser.add_argument("--token", action="append", required=True, help="a token the API takes (repeatable)")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--content-rate", type=float, default=None, help="posts a second before the secondary limit")
    parser.add_argument("--core-limit", type=int, default=5000, help="a token's requests an hour (the primary limit)")
    parser.add_argument("--script-file", type=Path, help="each post's step: the first line of this file (taken)")
    options = parser.parse_args()
    api = GithubApi(
        tokens=options.token,
        any_repo=True,
        journal=options.journal,
        script_file=options.script_file,
        port=options.port,
        content_rate=options.content_rate,
        core_limit=options.core_limit,
    ).start()
    if options.port_file is not None:
        options.port_file.write_text(str(api.url.rsplit(":", 1)[1]))
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    api.stop()


if __name__ == "__main__":
    main()
