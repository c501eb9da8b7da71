"""No URL's secret in a log line, whoever logs it: each log record of the process is hidden as it is made.

    any logger (outbox's, httpx, httpcore, aiosmtplib, nats, Prefect's, ...) ─ makes a record ─▶
      the record factory installed by `hide_secrets_in_logs`:
        the message as formatted, showing a URL's secret ─▶ that message with it as ***, no arguments
        (`masking.hide_url_secrets`: a URL's query and fragment, its user information's password or
        token; `hide_credentials`: a password=... parameter)
        a traceback or stack that shows one ─▶ its text hidden, the exception itself dropped from the record
        a record that shows none ─▶ left as it is (one search for "://" or "password" tells most of them)
    ─▶ every handler (a console, a file, Prefect's API log handler shipping to the Prefect server)

A record factory, not a handler's filter or formatter, because it holds for every handler whoever added
it and whenever: a library's own, Prefect's, one the application adds later. Standard library only.
Installed once per process by `outbox`'s commands, `outbox worker`'s supervisor and outbox's Prefect flows.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from outbox._internal.redaction.masking import hide_credentials, hide_url_secrets


def hidden_text(text: str) -> str:
    """`text` with each URL's secret and each password parameter as ***."""
    return hide_credentials(hide_url_secrets(text))


class _HidingRecordFactory:
    """The record factory that was installed, each record it makes then hidden."""

    def __init__(self, made_by: Any) -> None:
        self.made_by = made_by

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = self.made_by(*args, **kwargs)
        hide_record(record)
        return record


def hide_secrets_in_logs() -> None:
    """From now on every log record this process makes is hidden (see the module's docstring); once only."""
    current = logging.getLogRecordFactory()
    if not isinstance(current, _HidingRecordFactory):
        logging.setLogRecordFactory(_HidingRecordFactory(current))


def hide_record(record: logging.LogRecord) -> None:
    """Hide `record`'s message, traceback and stack in place. A record whose message shows a secret becomes
    that message hidden, with no arguments (whichever argument or the format itself showed it); a record
    that shows none is left as it is."""
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not suit the format: said in the line, instead of a logging error
        record.msg, record.args = f"{record.msg} (arguments that do not suit it: {record.args!r})", ()
        message = record.msg
    hidden = _hidden(message)
    if hidden != message:
        record.msg, record.args = hidden, ()
    if record.exc_info and record.exc_info[1] is not None:
        shown = logging.Formatter().formatException(record.exc_info)
        hidden = _hidden(shown)
        if hidden != shown:
            record.exc_text, record.exc_info = hidden, None
    if record.exc_text:
        record.exc_text = _hidden(record.exc_text)
    if record.stack_info:
        record.stack_info = _hidden(record.stack_info)


def _hidden(text: str) -> str:
    """`hidden_text`, after a quick look for what it hides (most lines hold no URL and no password)."""
    return hidden_text(text) if _MAY_HOLD_A_SECRET.search(text) else text


_MAY_HOLD_A_SECRET = re.compile(r"://|password", re.IGNORECASE)
