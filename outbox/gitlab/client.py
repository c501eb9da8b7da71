"""The python-gitlab calls of GITLAB_POST, each one HTTP request made once: no retry inside the client.

    GitlabAdapter ──pool thread──▶ create_note / create_discussion / create_issue / the listings (readback)
        ──gitlab.Gitlab(retry_transient_errors=False), every call obey_rate_limit=False, max_retries=0──▶ GitLab
        ◀── the object's attributes, or Answer(status, message, Retry-After, RateLimit-Reset)
            or Unanswered(sent: bool, what) when no answer came

python-gitlab is synchronous: every call runs in a thread of the adapter's bounded pool, never on the event
loop. python-gitlab would otherwise sleep out a 429 and send again (obey_rate_limit, up to 10 times) and, with
retry_transient_errors, send again after a 5xx that followed the write: both are off, so outbox decides every
retry after read-back. A call starts only before `deadline` (time.monotonic(), the event loop's clock): a call
that waited in the pool past its write window never starts.

python-gitlab's errors carry no headers, so a response hook on the host's requests session keeps the last
response's rate-limit headers in the calling thread, and `Answer` carries them.
"""

from __future__ import annotations

import importlib.metadata
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from outbox._internal.config.extras import needs
from outbox.errors import OutboxError
from outbox.gitlab.hosts import GitlabHost

with needs("gitlab"):
    import gitlab
    import gitlab.exceptions
    import requests
    import requests.adapters

T = TypeVar("T")
USER_AGENT = f"outbox-gitlab/{importlib.metadata.version('outbox')}"
# every call: python-gitlab neither sleeps out a 429 nor sends again after one or after a 5xx
NO_RETRY: dict[str, Any] = {"obey_rate_limit": False, "max_retries": 0, "retry_transient_errors": False}
# requests' errors that mean the request never left: the connection was refused or never made
_NOT_SENT = (requests.exceptions.ConnectTimeout, requests.exceptions.InvalidURL)
_last_headers = threading.local()


@dataclass(eq=False)
class Answer(OutboxError):
    """GitLab answered with an error status."""

    status: int
    message: str
    retry_after: str | None = None
    ratelimit_reset: str | None = None


@dataclass(eq=False)
class Unanswered(OutboxError):
    """No answer: `sent` False when the request never left (nothing was written), True when it may have."""

    sent: bool
    what: str


class TooLate(OutboxError):
    """The call waited in the pool until its write window closed: it was never sent."""


def client(host: GitlabHost, token: str, pool_size: int) -> gitlab.Gitlab:
    """One python-gitlab client for the host, its requests session pooling up to `pool_size` connections."""
    session = requests.Session()
    session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=pool_size, max_retries=0))
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=pool_size, max_retries=0))
    session.hooks["response"].append(_keep_headers)
    return gitlab.Gitlab(
        host.url, private_token=token, retry_transient_errors=False, user_agent=USER_AGENT, session=session
    )


def _keep_headers(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    _last_headers.value = response.headers


def called(call: Callable[[], T], deadline: float) -> T:
    """Run one python-gitlab call in this thread if its deadline has not passed; its errors as Answer,
    Unanswered or TooLate."""
    if time.monotonic() >= deadline:
        raise TooLate()
    _last_headers.value = None
    try:
        return call()
    except gitlab.exceptions.GitlabHttpError as error:
        _raise_answer(error)
    except gitlab.exceptions.GitlabError as error:
        if error.response_code is not None:  # a create, list or auth error: an HTTP answer
            _raise_answer(error)
        # RedirectError: the POST was redirected (and requests turned it into a GET): nothing was made
        raise Unanswered(False, type(error).__name__) from None
    except _NOT_SENT as error:
        raise Unanswered(False, type(error).__name__) from None
    except requests.exceptions.ConnectionError as error:
        raise Unanswered(not _refused(error), type(error).__name__) from None
    except (requests.exceptions.RequestException, OSError) as error:  # a read timeout, a reset, a broken body
        raise Unanswered(True, type(error).__name__) from None


def _raise_answer(error: gitlab.exceptions.GitlabError) -> NoReturn:
    headers = getattr(_last_headers, "value", None) or {}
    message = error.error_message if isinstance(error.error_message, str) else ""
    raise Answer(
        int(error.response_code or 0),
        message[:200],
        headers.get("Retry-After"),
        headers.get("RateLimit-Reset"),
    ) from None


def _refused(error: requests.exceptions.ConnectionError) -> bool:
    """The connection was never made (refused, a name that does not resolve): nothing was sent."""
    reason = error.args[0] if error.args else None
    inner = getattr(reason, "reason", None)
    return type(inner).__name__ in ("NewConnectionError", "NameResolutionError")


def project_of(gl: gitlab.Gitlab, project: str | int) -> Any:
    return gl.projects.get(project, lazy=True)


def noteable(gl: gitlab.Gitlab, project: str | int, target: str, iid: int) -> Any:
    owner = project_of(gl, project)
    manager = owner.mergerequests if target == "merge_request" else owner.issues
    return manager.get(iid, lazy=True)


def create_note(gl: gitlab.Gitlab, project: str | int, target: str, iid: int, body: str, timeout: float) -> Any:
    note = noteable(gl, project, target, iid).notes.create({"body": body}, timeout=timeout, **NO_RETRY)
    return dict(note.attributes)


def create_discussion(
    gl: gitlab.Gitlab, project: str | int, iid: int, body: str, position: dict[str, Any], timeout: float
) -> Any:
    merge_request = noteable(gl, project, "merge_request", iid)
    made = merge_request.discussions.create({"body": body, "position": position}, timeout=timeout, **NO_RETRY)
    return dict(made.attributes)


def create_issue(
    gl: gitlab.Gitlab, project: str | int, title: str, description: str, labels: list[str], timeout: float
) -> Any:
    data = {"title": title, "description": description, "labels": labels}
    return dict(project_of(gl, project).issues.create(data, timeout=timeout, **NO_RETRY).attributes)
