"""The data of both event kinds, written by one rule: a webhook's body and a NATS event's body hold the same
JSON for the same data (timestamps in ISO 8601, numerics as their exact text), and data JSON cannot write
is refused by both, naming the key and the type of the first value that stopped it, never the value."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.nats.message import InvalidEvent, message_body
from outbox.webhook.message import InvalidBody, body

AT = datetime(2026, 12, 1, 9, 42, 14, 618000, tzinfo=UTC)
ZONES = st.sampled_from([None, UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))])
KEYS = st.text(max_size=8)
SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
)
ROW_VALUES = (
    st.datetimes(timezones=ZONES)
    | st.dates()
    | st.times()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.uuids()
)
VALUES = st.recursive(
    SCALARS | ROW_VALUES,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
DATA = st.dictionaries(KEYS, VALUES, max_size=6)
# values JSON cannot write, and the type each is named by
UNWRITABLE = st.sampled_from(
    [
        ({1, 2}, "a set"),
        (frozenset(), "a frozenset"),
        (b"\x00", "a bytes"),
        (1j, "a complex"),
        (object(), "a object"),
        (float("nan"), "a float that is not finite"),
        (float("-inf"), "a float that is not finite"),
        (Decimal("NaN"), "a Decimal that is not finite"),
        (Decimal("Infinity"), "a Decimal that is not finite"),
        (timedelta(seconds=3), "a timedelta"),
        ("\ud800", "a str with an unpaired surrogate"),
        ({(1, 2): "x"}, None),  # a key JSON cannot hold: named one level down
    ]
)
STEPS = st.lists(st.integers(min_value=0, max_value=3) | KEYS, max_size=4)


def expected(value: Any) -> Any:
    """What JSON should read back for `value`: a row value as its text, a tuple as a list."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [expected(item) for item in value]
    if isinstance(value, dict):
        return {key: expected(item) for key, item in value.items()}
    return value


def both(data: dict[str, Any]) -> tuple[Any, Any]:
    """The `data` of the webhook's body and of the NATS event's body, read back."""
    webhook = json.loads(body("invoice.paid", data, AT))["data"]
    event = json.loads(message_body("invoice.paid", "0" * 32, data, AT))["data"]
    return webhook, event


@given(DATA)
def test_both_kinds_write_the_same_data_with_row_values_as_their_exact_text(data: dict[str, Any]) -> None:
    webhook, event = both(data)
    assert webhook == event == expected(data)


@given(st.datetimes(timezones=ZONES), st.decimals(allow_nan=False, allow_infinity=False))
def test_a_timestamp_reads_back_as_itself_and_a_numeric_keeps_its_digits(moment: datetime, amount: Decimal) -> None:
    webhook, _ = both({"paid_at": moment, "amount": amount})
    assert datetime.fromisoformat(webhook["paid_at"]) == moment
    assert webhook["amount"] == str(amount) and Decimal(webhook["amount"]).as_tuple() == amount.as_tuple()


def test_what_postgresql_rows_hold_is_written_as_iso_8601_and_exact_decimal_text() -> None:
    data = {
        "amount": Decimal("19.90"),
        "paid_at": datetime(2026, 12, 1, 9, 42, 14, 618000, tzinfo=UTC),
        "due": date(2026, 12, 31),
        "id": UUID("12345678-1234-5678-1234-567812345678"),
    }
    raw = body("invoice.paid", data, AT)
    assert (
        b'"data":{"amount":"19.90","paid_at":"2026-12-01T09:42:14.618000+00:00","due":"2026-12-31",'
        b'"id":"12345678-1234-5678-1234-567812345678"}' in raw
    )
    assert raw.split(b'"data":')[1] == message_body("invoice.paid", "0" * 32, data, AT).split(b'"data":')[1]


def shown_key(key: str) -> str:
    """A key as an error shows it: JSON text (ASCII), at most 40 characters."""
    shown = json.dumps(key)
    return shown if len(shown) <= 40 else shown[:36] + '..."'


def placed(bad: Any, steps: list[int | str], siblings: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`bad` nested under `steps` (an index in a list, a key in an object) among writable siblings, and the
    path an error names it by."""
    inner, path = bad, ""
    for step in reversed(["top", *steps]):
        if isinstance(step, int):
            inner = [*(f"before {n}" for n in range(step)), inner, "after"]
            path = f"[{step}]{path}"
        else:
            inner = {**{k: v for k, v in siblings.items() if k != step}, step: inner}
            path = f"[{shown_key(step)}]{path}"
    assert isinstance(inner, dict)
    return inner, "data" + path


@given(UNWRITABLE, STEPS, st.dictionaries(KEYS, SCALARS | ROW_VALUES, max_size=3))
def test_a_value_json_cannot_write_is_refused_by_both_kinds_naming_its_key_and_type(
    bad: tuple[Any, str | None], steps: list[int | str], siblings: dict[str, Any]
) -> None:
    value, what = bad
    data, path = placed(value, steps, siblings)
    named = f"{path}: {what}" if what is not None else f"{path}: a key of type tuple"
    with pytest.raises(InvalidBody) as webhook:
        body("invoice.paid", data, AT)
    with pytest.raises(InvalidEvent) as event:
        message_body("invoice.paid", "0" * 32, data, AT)
    assert str(webhook.value) == f"the invoice.paid event's data cannot be written as JSON: {named}"
    assert str(event.value) == f"data: cannot be written as JSON: {named}"


def test_data_that_holds_itself_is_refused_naming_where() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(InvalidBody, match=r'cannot be written as JSON: data\["items"\]\[0\]: holds itself$'):
        body("invoice.paid", {"items": looped}, AT)


def test_a_long_key_is_shortened_in_the_error() -> None:
    with pytest.raises(InvalidBody) as refused:
        body("invoice.paid", {"k" * 500: {1}}, AT)
    assert str(refused.value).endswith('data["' + "k" * 35 + '..."]: a set')
