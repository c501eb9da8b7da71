"""No URL's secret in a log line, whoever logs it: each log record of the process is hidden as it is made.

    any logger (outbox's, httpx, httpcore, aiosmtplib, nats, Prefect's, ...) ─ makes a record ─▶
      the record factory installed by `hide_secrets_in_logs`:
        the message and each argument that shows a URL's secret ─▶ the same with it as ***
        (`outbox.masking.hide_url_secrets`: a URL's query and fragment, its user information's password or
        token; `hide_credentials`: a password=... parameter)
        the message as formatted still showing one (a URL built from two arguments) ─▶ that text, no arguments
        a traceback or stack that shows one ─▶ its text hidden, the exception itself dropped from the record
    ─▶ every handler (a console, a file, Prefect's API log handler shipping to the Prefect server)

A record factory, not a handler's filter or formatter, because it holds for every handler whoever added
it and whenever: a library's own, Prefect's, one the application adds later. Standard library only.
Installed once per process by `outbox`'s commands, `outbox worker`'s supervisor and outbox's Prefect flows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from outbox.masking import hide_credentials, hide_url_secrets


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
    """Hide `record`'s message, traceback and stack in place; a record that shows no secret is left as it is."""
    try:
        message: str | None = record.getMessage()
    except Exception:  # a message that does not format: its handler reports it, with what it holds hidden
        message = None
    if message is None or hidden_text(message) != message:
        _hide_message(record, message)
    if record.exc_info and record.exc_info[1] is not None:
        shown = logging.Formatter().formatException(record.exc_info)
        if hidden_text(shown) != shown:
            record.exc_text, record.exc_info = hidden_text(shown), None
    if record.exc_text:
        record.exc_text = hidden_text(record.exc_text)
    if record.stack_info:
        record.stack_info = hidden_text(record.stack_info)


def _hide_message(record: logging.LogRecord, message: str | None) -> None:
    """Each argument that shows a secret as its hidden text, so the record keeps its format and arguments
    (a formatter that reads them still can); when the format itself or the arguments together show one, the
    hidden message with no arguments."""
    args: Any = record.args
    if isinstance(args, Mapping):
        args = {name: _hidden_argument(value) for name, value in args.items()}
    elif args:
        args = tuple(_hidden_argument(value) for value in args)
    msg = str(record.msg)
    if message is None:
        record.msg, record.args = hidden_text(msg), args
        return
    if hidden_text(msg) == msg:
        try:
            kept = msg % args if args else msg
        except Exception:  # an argument that became text no longer suits its %d: the whole message instead
            kept = message
        if hidden_text(kept) == kept:
            record.args = args
            return
    record.msg, record.args = hidden_text(message), ()


def _hidden_argument(value: object) -> object:
    """`value` as it is, or as its hidden text when that shows a secret (a number never does: `%d` keeps
    working)."""
    if value is None or isinstance(value, int | float):
        return value
    shown = value if isinstance(value, str) else str(value)
    hidden = hidden_text(shown)
    return value if hidden == shown else hidden
