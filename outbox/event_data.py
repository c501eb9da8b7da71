"""The data of an event kind (WEBHOOK, NATS_EVENT) written as JSON: one rule for both kinds.

    compose's data ──json.dumps(default=row_value)──▶ compact JSON text
        a value a query row holds that JSON has no form for ─▶ text: a timestamp, date or time in ISO 8601,
                                                               a numeric as its exact decimal text, a uuid as text
        anything else (a set, bytes, NaN, a key JSON cannot hold) ─▶ UnwritableData naming where and what

`where_unwritable` runs only once writing failed: it walks the data again to name the first value that
stopped it (`data["items"][2]: a set`), never the value itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

# deeper than this, a value is named by its depth (JSON's writer stops near Python's recursion limit)
MAX_DEPTH = 200
# the most of a key a path shows
_KEY_SHOWN = 40
_SCALARS = (str, int, float, bool, type(None))
_ROW_VALUES = (datetime, date, time, Decimal, UUID)


class UnwritableData(ValueError):
    """Data JSON cannot write; `where` names the first value that stopped it and its type."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def row_value(value: object) -> str:
    """The JSON text of a value a query row holds that JSON has no form for; TypeError for anything else."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal) and value.is_finite():
        return str(value)
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} has no JSON form")


def dumped(envelope: Mapping[str, Any]) -> bytes:
    """`envelope` as compact UTF-8 JSON, its row values written by `row_value`; UnwritableData naming the
    first value under `envelope["data"]` that JSON cannot write."""
    try:
        text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=row_value)
        return text.encode()
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as error:
        where = where_unwritable(envelope.get("data"), "data")
        raise UnwritableData(where or f"data: {type(error).__name__}") from None


def where_unwritable(value: object, path: str, depth: int = 0, parents: frozenset[int] = frozenset()) -> str | None:
    """`<path>: <what>` for the first value under `value` that JSON cannot write, or None when it all can."""
    if depth > MAX_DEPTH:
        return f"{path}: nested more than {MAX_DEPTH} deep"
    if isinstance(value, dict | list | tuple) and id(value) in parents:
        return f"{path}: holds itself"
    if isinstance(value, dict):
        inner = parents | {id(value)}
        for key, item in value.items():
            if not isinstance(key, _SCALARS):
                return f"{path}: a key of type {type(key).__name__}"
            found = where_unwritable(key, f"{path}: a key", depth + 1, inner) or where_unwritable(
                item, f"{path}[{_shown_key(key)}]", depth + 1, inner
            )
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        inner = parents | {id(value)}
        return next(
            (
                found
                for index, item in enumerate(value)
                if (found := where_unwritable(item, f"{path}[{index}]", depth + 1, inner)) is not None
            ),
            None,
        )
    return _scalar_unwritable(value, path)


def _scalar_unwritable(value: object, path: str) -> str | None:
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return f"{path}: a str with an unpaired surrogate"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path}: a float that is not finite"
    if isinstance(value, Decimal) and not value.is_finite():
        return f"{path}: a Decimal that is not finite"
    if isinstance(value, _SCALARS + _ROW_VALUES):
        return None
    return f"{path}: a {type(value).__name__}"


def _shown_key(key: object) -> str:
    shown = json.dumps(key, ensure_ascii=True) if isinstance(key, str) else repr(key)
    return shown if len(shown) <= _KEY_SHOWN else shown[: _KEY_SHOWN - 4] + '..."'
