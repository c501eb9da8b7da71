"""Validation is total: any ActionRequest is stored as given or refused by name, and nothing else happens.

    named inputs ─────────────┐
    Hypothesis requests ──────┴─▶ outbox.enqueue in the caller's transaction ─▶ InvalidRequest(field)
                                                                              └▶ a row that reads back equal
    then, in the same transaction: SELECT 1, a row of the test's own table, commit; both are seen afterwards

The named tests hold inputs that would otherwise escape as another exception or reach the database; the
properties draw every field from broad strategies (any text, surrogates and NUL included; nested values with
keys of any type; huge integers; NaN; datetimes with odd offsets; wrong types). Hypothesis runs the "ci"
profile (derandomized, 200 examples a property); `HYPOTHESIS_PROFILE=long` runs 5,000. One database serves
every example of a test: each example deletes the action it stored.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from examples.accounts import notices
from outbox import Action, ActionKind, ActionRequest, InvalidRequest
from outbox.requests import MAX_ATTEMPTS, MAX_KEY_LENGTH, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH, validate
from outbox.store.application import SELECT_ACTION
from tests import kinds
from tests.test_enqueue import request
from tests.test_enqueue_psycopg import libpq_url

_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", derandomize=True, max_examples=200, deadline=None, database=None, suppress_health_check=_HEALTH
)
# the long profile keeps Hypothesis's example database (.hypothesis/), so a failure it finds replays first
settings.register_profile("long", max_examples=5_000, deadline=None, suppress_health_check=_HEALTH)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FIELDS = {
    "request",
    "kind",
    "workspace_id",
    "subject_account_id",
    "lane_key",
    "idempotency_key",
    "max_attempts",
    "expires_at",
    "proposed",
    "payload",
    "payload.notice",
    "payload.event",
}
_markers = itertools.count(1)


# -- requests and values


def email(payload: Any) -> ActionRequest:
    return request(kind=ActionKind.EMAIL, workspace_id=None, subject_account_id=42, payload=payload)


def nested(depth: int, container: str = "list") -> Any:
    """A value `depth` containers deep, built without recursion."""
    value: Any = 1
    for _ in range(depth):
        value = [value] if container == "list" else {"k": value}
    return value


def cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def same_json(stored: Any, given: Any) -> bool:
    """`stored` is how jsonb gives back `given`: arrays for tuples, and a float as the same number."""
    if given is None or isinstance(given, bool):
        return stored is given
    if isinstance(given, float):
        # jsonb keeps the decimal written; an integral one (1e+16) reads back as an int of the same value
        return isinstance(stored, int | float) and not isinstance(stored, bool) and float(stored) == given
    if isinstance(given, int | str):
        return type(stored) is type(given) and stored == given
    if isinstance(given, list | tuple):
        return isinstance(stored, list) and len(stored) == len(given) and all(map(same_json, stored, given))
    if isinstance(given, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == given.keys()
            and all(same_json(stored[key], value) for key, value in given.items())
        )
    return False


def kind_name(kind: ActionKind | str) -> str:
    return kind.name if isinstance(kind, ActionKind) else kind


# -- one attempt in the caller's transaction, and what it left


def attempt(conn: Connection | psycopg.Connection[Any], request: ActionRequest) -> Action | InvalidRequest:
    """Enqueue, then use the transaction: a refusal must leave it usable. Commits; returns what enqueue gave."""
    marker = next(_markers)
    try:
        outcome: Action | InvalidRequest = outbox.enqueue(conn, request)
    except InvalidRequest as refused:
        outcome = refused
    if isinstance(conn, Connection):
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
        conn.execute(text("INSERT INTO own_change VALUES (:n)"), {"n": marker})
    else:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.execute("INSERT INTO own_change VALUES (%s)", (marker,))
    conn.commit()
    return outcome


def outcome_event(outcome: Action | InvalidRequest) -> None:
    """Count the outcome in Hypothesis's statistics (`--hypothesis-show-statistics`)."""
    event(f"refused: {outcome.field}" if isinstance(outcome, InvalidRequest) else "stored")


def check_outcome(engine: Engine, request: ActionRequest, outcome: Action | InvalidRequest) -> None:
    """The caller's change committed; a refusal wrote nothing; a stored action reads back as given."""
    with engine.begin() as conn:
        changes = conn.execute(text("DELETE FROM own_change RETURNING n")).scalars().all()
        if isinstance(outcome, Action):
            row = conn.execute(SELECT_ACTION, {"id": outcome.id}).mappings().one()
            conn.execute(text("DELETE FROM agent_action WHERE id = :id"), {"id": outcome.id})
        left = conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one()
    assert len(changes) == 1 and left == 0
    if isinstance(outcome, InvalidRequest):
        assert outcome.field in FIELDS, outcome
        return
    assert Action.from_row(row) == outcome
    assert_stored_as_given(outcome, request)


def assert_stored_as_given(action: Action, request: ActionRequest) -> None:
    assert action.kind == kind_name(request.kind)
    assert (action.lane_key, action.idempotency_key) == (request.lane_key, request.idempotency_key)
    assert same_json(action.payload, request.payload), (action.payload, request.payload)
    assert (action.workspace_id, action.subject_account_id) == (request.workspace_id, request.subject_account_id)
    assert action.max_attempts == request.max_attempts
    # the same instant (compared in UTC: a datetime in a fold or gap is never equal to one of another zone)
    assert action.expires_at == (request.expires_at and request.expires_at.astimezone(UTC))
    assert action.state.value == ("PROPOSED" if request.proposed else "ADMITTED")


@pytest.fixture
def own_table(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE own_change (n int PRIMARY KEY)"))
    return engine


@pytest.fixture
def pg_conn(own_table: Engine, database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(libpq_url(database_url)) as conn:
        yield conn


def refused(engine: Engine, request: ActionRequest) -> InvalidRequest:
    with engine.connect() as conn:
        outcome = attempt(conn, request)
    check_outcome(engine, request, outcome)
    assert isinstance(outcome, InvalidRequest), f"stored: {outcome}"
    return outcome


def stored(engine: Engine, request: ActionRequest) -> Action:
    with engine.connect() as conn:
        outcome = attempt(conn, request)
    assert isinstance(outcome, Action), f"refused: {outcome}"
    check_outcome(engine, request, outcome)
    return outcome


# -- each input that is easy to get wrong, by name

SURROGATE = "\ud800"
FAR_TOO_LATE = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-14)))

REFUSED = [
    ("surrogate in a payload value", {"payload": {"a": [{"b": "x" + SURROGATE}]}}, "payload", "lone surrogate"),
    ("surrogate in a payload key", {"payload": {"a": {SURROGATE: 1}}}, "payload", "lone surrogate"),
    ("surrogate in the lane key", {"lane_key": "lane:" + SURROGATE}, "lane_key", "lone surrogate"),
    ("surrogate in the idempotency key", {"idempotency_key": "\udfff"}, "idempotency_key", "lone surrogate"),
    ("NUL in a payload key", {"payload": {"a\x00": 1}}, "payload", "NUL"),
    ("NUL in the lane key", {"lane_key": "a\x00b"}, "lane_key", "NUL"),
    ("a list nested 2,000 deep", {"payload": nested(2000)}, "payload", f"deeper than {MAX_PAYLOAD_DEPTH} levels"),
    ("an object nested 2,000 deep", {"payload": nested(2000, "dict")}, "payload", "deeper than"),
    ("nested one level too deep", {"payload": nested(MAX_PAYLOAD_DEPTH + 1)}, "payload", "deeper than"),
    ("a list that holds itself", {"payload": cycle()}, "payload", "deeper than"),
    ("max_attempts 2**31", {"max_attempts": 2**31}, "max_attempts", f"at most {MAX_ATTEMPTS}"),
    ("max_attempts a bool", {"max_attempts": True}, "max_attempts", "not True"),
    ("max_attempts a float", {"max_attempts": 3.0}, "max_attempts", "at least 1"),
    ("kind a list", {"kind": ["EMAIL"]}, "kind", "an ActionKind or the name of one, not a list"),
    ("kind None", {"kind": None}, "kind", "not a NoneType"),
    ("kind another declaration", {"kind": ActionKind("TEST_NOOP", True, True)}, "kind", "another declaration"),
    ("expires_at past year 9999 in UTC", {"expires_at": FAR_TOO_LATE}, "expires_at", "between the years 1 and 9999"),
    ("expires_at on the last day", {"expires_at": datetime.max.replace(tzinfo=UTC)}, "expires_at", "too late"),
    ("expires_at a date", {"expires_at": date(2100, 1, 1)}, "expires_at", "timezone-aware datetime, not a date"),
    ("proposed 'no'", {"proposed": "no"}, "proposed", "True or False, not a str"),
    ("proposed 1", {"proposed": 1}, "proposed", "True or False"),
    ("an int key beside its string", {"payload": {1: "a", "1": "b"}}, "payload", "keys are strings, not an int"),
    ("a tuple key deep inside", {"payload": {"a": [{(1, 2): 3}]}}, "payload", "keys are strings, not a tuple"),
    ("workspace_id of 5,000 digits", {"workspace_id": 10**5000}, "workspace_id", "positive 64-bit integer"),
    ("subject_account_id 2**63", {"subject_account_id": 2**63}, "subject_account_id", "positive 64-bit integer"),
    ("lane_key an int", {"lane_key": 12}, "lane_key", "non-empty string, not an int"),
    ("idempotency_key None", {"idempotency_key": None}, "idempotency_key", "non-empty string"),
    ("lane_key too long", {"lane_key": "é" * (MAX_KEY_LENGTH + 1)}, "lane_key", f"at most {MAX_KEY_LENGTH}"),
    ("payload NaN inside", {"payload": {"a": [math.nan]}}, "payload", "has no JSON form"),
    ("payload infinity", {"payload": -math.inf}, "payload", "has no JSON form"),
    ("payload a set", {"payload": {"a": {1}}}, "payload", "a set has no JSON form"),
    ("payload a Decimal", {"payload": [Decimal("1.5")]}, "payload", "a Decimal has no JSON form"),
    ("payload an int of 5,000 digits", {"payload": [10**5000]}, "payload", "more than 4300 digits"),
    ("payload of 20,000 values", {"payload": list(range(20_000))}, "payload", f"at most {MAX_PAYLOAD_BYTES}"),
    ("payload one string too long", {"payload": "x" * 20_000}, "payload", f"at most {MAX_PAYLOAD_BYTES}"),
]


@pytest.mark.parametrize(("changes", "field", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_bad_field_is_refused_by_name_and_the_transaction_stays_usable(
    own_table: Engine, changes: dict[str, Any], field: str, message: str
) -> None:
    refusal = refused(own_table, request(**changes))
    assert refusal.field == field
    assert message in refusal.message, refusal.message


EMAIL_REFUSED = [
    ("the old README payload", {"notice": "verify_address", "account_id": 42}, "payload", "only notice and event"),
    ("a list", [1], "payload", "not a list"),
    ("an unknown notice", {"notice": "birthday", "event": {}}, "payload.notice", "registered as 'birthday'"),
    ("no notice", {"event": {"account_id": 42}}, "payload.notice", "registered as None"),
    ("an event that is a list", {"notice": "verify_address", "event": [42]}, "payload.event", "must be an object"),
    ("an event its notice refuses", {"notice": "verify_address", "event": {}}, "payload.event", "account_id"),
    (
        "an event missing a field",
        {"notice": "workspace_alert", "event": {"workspace_id": 1}},
        "payload.event",
        "alert_id",
    ),
]


@pytest.mark.parametrize(
    ("payload", "field", "message"), [r[1:] for r in EMAIL_REFUSED], ids=[r[0] for r in EMAIL_REFUSED]
)
def test_an_email_payload_is_checked_by_its_kind_at_enqueue(
    own_table: Engine, payload: Any, field: str, message: str
) -> None:
    refusal = refused(own_table, email(payload))
    assert refusal.field == field
    assert message in refusal.message, refusal.message


def test_a_valid_email_payload_is_stored(own_table: Engine) -> None:
    payload = {"notice": notices.VERIFY_ADDRESS.name, "event": {"account_id": 42}}
    assert stored(own_table, email(payload)).payload == payload


def test_a_notice_params_error_becomes_a_refusal_of_the_event(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(event: dict[str, Any]) -> dict[str, Any]:
        return {"account_id": event["missing"]}

    monkeypatch.setattr(notices.VERIFY_ADDRESS, "params", broken)
    with pytest.raises(InvalidRequest, match="cannot read it: KeyError") as refusal:
        validate(email({"notice": "verify_address", "event": {"account_id": 1}}))
    assert refusal.value.field == "payload.event"


def test_the_text_of_an_escape_is_not_a_nul(own_table: Engine) -> None:
    payload = {"text": "\\u0000", "\\u0000": "\\\\u0000"}
    assert stored(own_table, request(payload=payload)).payload == payload


def test_the_limits_themselves_are_accepted(own_table: Engine) -> None:
    last_moment = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
    action = stored(
        own_table,
        request(
            lane_key="é" * MAX_KEY_LENGTH,
            idempotency_key="\U0001f600" * MAX_KEY_LENGTH,
            payload={"deep": nested(MAX_PAYLOAD_DEPTH - 1), "big": 10**4299, "tiny": 5e-324, "huge": 1e308},
            workspace_id=2**63 - 1,
            subject_account_id=1,
            max_attempts=MAX_ATTEMPTS,
            expires_at=last_moment.astimezone(timezone(timedelta(hours=-13, minutes=-59, seconds=-59))),
            proposed=True,
        ),
    )
    assert action.expires_at == last_moment


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Etc/GMT+12"])
def test_the_latest_expiry_reads_back_in_any_session_time_zone(own_table: Engine, zone: str) -> None:
    last_moment = datetime(9999, 12, 30, 23, 59, 59, tzinfo=UTC)
    with own_table.connect() as conn:
        conn.execute(text("SELECT set_config('TimeZone', :zone, true)"), {"zone": zone})
        action = attempt(conn, request(expires_at=last_moment))
    assert isinstance(action, Action) and action.expires_at == last_moment
    check_outcome(own_table, request(expires_at=last_moment), action)


class NoOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None


class BadOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return "an hour"  # type: ignore[return-value]


@pytest.mark.parametrize("zone", [NoOffset(), BadOffset()], ids=["no offset", "an offset that is not one"])
def test_a_time_zone_without_a_usable_offset_is_refused(zone: tzinfo) -> None:
    with pytest.raises(InvalidRequest) as refusal:
        validate(request(expires_at=datetime(2100, 1, 1, tzinfo=zone)))
    assert refusal.value.field == "expires_at"


def test_only_an_action_request_is_validated() -> None:
    with pytest.raises(InvalidRequest, match=r"must be an outbox\.ActionRequest, not a dict") as refusal:
        validate({"kind": "TEST_NOOP"})  # type: ignore[arg-type]
    assert refusal.value.field == "request"


def test_every_refusal_also_holds_on_a_psycopg_connection(pg_conn: psycopg.Connection[Any], own_table: Engine) -> None:
    cases = [(request(**changes), field) for _, changes, field, _ in REFUSED]
    cases += [(email(payload), field) for _, payload, field, _ in EMAIL_REFUSED]
    for bad, field in cases:
        outcome = attempt(pg_conn, bad)
        assert isinstance(outcome, InvalidRequest) and outcome.field == field, (bad, outcome)
        check_outcome(own_table, bad, outcome)


async def test_every_refusal_also_holds_on_an_async_connection(aengine: AsyncEngine, own_table: Engine) -> None:
    async with aengine.connect() as conn:
        for _, changes, field, _ in REFUSED:
            with pytest.raises(InvalidRequest) as refusal:
                await outbox.enqueue_async(conn, request(**changes))
            assert refusal.value.field == field
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
        action = await outbox.enqueue_async(conn, request())
        await conn.commit()
    assert action.payload == {"account_id": 42}


# -- a kind's own payload check


def only_even(payload: Any) -> None:
    """A payload check for the tests: the payload is {"n": an even integer}."""
    if not isinstance(payload, dict) or not isinstance(payload.get("n"), int) or payload["n"] % 2:
        raise InvalidRequest("payload.n", "must be an even integer")


@pytest.fixture
def checked_kind(monkeypatch: pytest.MonkeyPatch) -> ActionKind:
    """A kind with a payload check, registered for one test only (the test database does not declare it)."""
    kind = ActionKind("TEST_CHECKED", False, False, True, payload_check=f"{__name__}:only_even")
    monkeypatch.setitem(ActionKind._registry, kind.name, kind)
    return kind


def test_a_kind_checks_its_payload_after_the_generic_checks(checked_kind: ActionKind) -> None:
    assert validate(request(kind=checked_kind, payload={"n": 2})).kind is checked_kind
    assert validate(request(kind="TEST_CHECKED", payload={"n": 4})).payload_json == '{"n":4}'
    with pytest.raises(InvalidRequest, match="must be an even integer") as refusal:
        validate(request(kind=checked_kind, payload={"n": 3}))
    assert refusal.value.field == "payload.n"
    with pytest.raises(InvalidRequest, match="lone surrogate") as generic:
        validate(request(kind=checked_kind, payload={"n": 2, SURROGATE: 1}))
    assert generic.value.field == "payload"


def test_a_payload_check_is_named_module_colon_function() -> None:
    for path in ("only_even", "tests.test_request_validation:", ":only_even", "a b:c", "a:b:c"):
        with pytest.raises(ValueError, match="must be 'module:function'"):
            ActionKind.register("TEST_MISNAMED", at_most_once=False, instance_level=True, payload_check=path)
    assert "TEST_MISNAMED" not in {kind.name for kind in ActionKind.all()}
    assert ActionKind.EMAIL.payload_check == "outbox.email.notice:check_payload"


def test_a_payload_check_that_names_nothing_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    kind = ActionKind("TEST_UNCHECKABLE", False, False, True, payload_check=f"{__name__}:no_such_check")
    monkeypatch.setitem(ActionKind._registry, kind.name, kind)
    with pytest.raises(ImportError, match="names nothing callable"):
        validate(request(kind=kind))


# -- properties

_DAY_US = 24 * 3600 * 10**6
OFFSETS = st.one_of(
    st.sampled_from([UTC, *(timezone(timedelta(hours=h)) for h in (-14, -12, 14))]),
    st.integers(-_DAY_US + 1, _DAY_US - 1).map(lambda us: timezone(timedelta(microseconds=us))),
)
ZONES = st.one_of(OFFSETS, st.timezones()) if zoneinfo.available_timezones() else OFFSETS
ANY_CHARACTER = st.characters(codec=None, exclude_categories=())
ODD_TEXT = [SURROGATE, "\udfff", "\udc80", "\x00", "\\u0000", "", " ", "\u2028", "\ufeff", "é", "\U0001f600"]
_SOME_TEXT = st.text(ANY_CHARACTER, max_size=4)
# any text with a surrogate, a NUL, an escape's text or another odd piece inside
ODD_STRINGS = st.builds(
    lambda before, odd, after: before + odd + after, _SOME_TEXT, st.sampled_from(ODD_TEXT), _SOME_TEXT
)
ANY_TEXT = st.one_of(st.text(ANY_CHARACTER, max_size=12), ODD_STRINGS)
WRONG_TYPES = st.sampled_from([None, 1, -1.5, b"bytes", ["x"], {"x": 1}, (), object(), True, date(2100, 1, 1)])
# built, never listed: Python cannot write an integer of more than 4,300 digits, not even to show a strategy
HUGE_INTEGERS = st.builds(
    lambda digits, sign: sign * 10 ** (digits - 1), st.integers(4290, 5000), st.sampled_from([1, -1])
)
LONG_TEXT = st.builds(lambda unit, n: unit * n, st.sampled_from(["k", "é", "\U0001f600", " "]), st.integers(505, 520))
KEYS = st.one_of(st.text(max_size=20).filter(str.strip), ANY_TEXT, ODD_STRINGS, LONG_TEXT, WRONG_TYPES)
IDS = st.one_of(
    st.none(),
    st.integers(1, 2**63 - 1),
    st.integers(),
    st.sampled_from([0, -1, 2**63 - 1, 2**63, True, False]),
    HUGE_INTEGERS,
    WRONG_TYPES,
)
KINDS = st.one_of(
    st.sampled_from([kinds.NOOP, kinds.ONCE, kinds.READBACK, ActionKind.EMAIL]),
    st.sampled_from(["TEST_NOOP", "TEST_READBACK", "EMAIL", "SMOKE_SIGNAL", ActionKind("TEST_NOOP", True, True)]),
    ANY_TEXT,
    WRONG_TYPES,
)
MAX_ATTEMPTS_VALUES = st.one_of(
    st.integers(-3, 10),
    st.integers(MAX_ATTEMPTS - 2, MAX_ATTEMPTS + 2),
    st.integers(),
    st.sampled_from([True, False, 1.0, "5", None, 2**64]),
)
EXPIRES = st.one_of(
    st.none(),
    st.datetimes(timezones=ZONES),
    st.datetimes(min_value=datetime(9999, 12, 29), timezones=OFFSETS),
    st.datetimes(max_value=datetime(1, 1, 2), timezones=OFFSETS),
    st.datetimes(),
    WRONG_TYPES,
)
PROPOSED = st.one_of(st.booleans(), st.sampled_from(["no", "yes", 0, 1, None, 1.0]))
NOT_JSON = st.sampled_from([datetime(2026, 1, 1), {1, 2}, b"x", Decimal("1.5"), object(), 1j, cycle()])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63), 2**53 + 1]),
    HUGE_INTEGERS,
    st.floats(),
    ANY_TEXT,
    ODD_STRINGS,
)
OBJECT_KEYS = st.one_of(ANY_TEXT, ODD_STRINGS, st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False))


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(OBJECT_KEYS, children, max_size=4),
    )


JSONISH = st.recursive(st.one_of(SCALARS, SCALARS, SCALARS, NOT_JSON), _containers, max_leaves=24)
EMAIL_PAYLOADS = st.fixed_dictionaries(
    {
        "notice": st.one_of(st.sampled_from(["verify_address", "workspace_alert", "birthday"]), ANY_TEXT),
        "event": st.one_of(
            st.fixed_dictionaries({"account_id": IDS}, optional={"workspace_id": IDS, "alert_id": IDS}), JSONISH
        ),
    },
    optional={"extra": JSONISH},
)
PAYLOADS = st.one_of(
    JSONISH,
    EMAIL_PAYLOADS,
    st.builds(
        nested,
        st.one_of(st.integers(MAX_PAYLOAD_DEPTH - 2, MAX_PAYLOAD_DEPTH + 2), st.integers(900, 3000)),
        st.sampled_from(["list", "dict"]),
    ),
    st.sampled_from(["x" * (MAX_PAYLOAD_BYTES - 2), "x" * MAX_PAYLOAD_BYTES, list(range(9000))]),
)


# well-formed requests: every one must be stored as given
VALID_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40).filter(str.strip)
VALID_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), VALID_TEXT
)
VALID_JSON = st.recursive(
    VALID_SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(VALID_TEXT, children, max_size=4)),
    max_leaves=20,
)
FUTURE = st.datetimes(min_value=datetime(2100, 1, 1), max_value=datetime(9999, 12, 29), timezones=ZONES)


def _kind_and_place(kind: ActionKind, workspace_id: int) -> dict[str, Any]:
    return {"kind": kind, "workspace_id": workspace_id if kind.workspace_level else None}


@st.composite
def valid_requests(draw: st.DrawFn) -> ActionRequest:
    kind = draw(st.sampled_from([kinds.NOOP, kinds.ONCE, kinds.READBACK, ActionKind.EMAIL]))
    payload = draw(VALID_JSON)
    if kind is ActionKind.EMAIL:
        payload = {"notice": "verify_address", "event": {"account_id": draw(st.integers(1, 2**63 - 1)), "x": payload}}
    return ActionRequest(
        **_kind_and_place(kind, draw(st.integers(1, 2**63 - 1))),
        lane_key=draw(VALID_TEXT),
        idempotency_key=draw(VALID_TEXT),
        payload=payload,
        subject_account_id=draw(st.none() | st.integers(1, 2**63 - 1)),
        max_attempts=draw(st.integers(1, MAX_ATTEMPTS)),
        expires_at=draw(st.none() | FUTURE),
        proposed=draw(st.booleans()),
    )


BROAD = {
    "kind": KINDS,
    "lane_key": KEYS,
    "idempotency_key": KEYS,
    "payload": PAYLOADS,
    "workspace_id": IDS,
    "subject_account_id": IDS,
    "max_attempts": MAX_ATTEMPTS_VALUES,
    "expires_at": EXPIRES,
    "proposed": PROPOSED,
}
# the payload and the keys have the most ways to be wrong: they are drawn broadly more often
_BROKEN = st.lists(
    st.sampled_from([*sorted(BROAD), "payload", "payload", "lane_key", "idempotency_key"]), min_size=1, max_size=2
)


@st.composite
def any_requests(draw: st.DrawFn) -> ActionRequest:
    """A well-formed request with one to three fields drawn from their broad strategies instead."""
    good = draw(valid_requests())
    return dataclasses.replace(good, **{field: draw(BROAD[field]) for field in set(draw(_BROKEN))})


@PROFILE
@given(bad=any_requests())
def test_any_request_is_stored_as_given_or_refused_by_name(own_table: Engine, bad: ActionRequest) -> None:
    with own_table.connect() as conn:
        outcome = attempt(conn, bad)
    outcome_event(outcome)
    check_outcome(own_table, bad, outcome)


@PROFILE
@given(bad=any_requests())
def test_any_request_on_a_psycopg_connection_is_stored_as_given_or_refused_by_name(
    pg_conn: psycopg.Connection[Any], own_table: Engine, bad: ActionRequest
) -> None:
    outcome = attempt(pg_conn, bad)
    outcome_event(outcome)
    check_outcome(own_table, bad, outcome)


@PROFILE
@given(good=valid_requests())
def test_every_well_formed_request_is_stored_as_given(own_table: Engine, good: ActionRequest) -> None:
    with own_table.connect() as conn:
        outcome = attempt(conn, good)
    assert isinstance(outcome, Action), outcome
    outcome_event(outcome)
    check_outcome(own_table, good, outcome)


TEXT_PLACES = ["lane_key", "idempotency_key", "payload key", "payload value", "email event value"]


def with_text(text: str, place: str, depth: int) -> ActionRequest:
    """A well-formed request holding `text` in `place`; in the payload, `depth` lists down."""
    if place in ("lane_key", "idempotency_key"):
        return request(**{place: text})
    if place == "email event value":
        return email({"notice": "verify_address", "event": {"account_id": 42, "note": text}})
    inner: Any = {text: 1} if place == "payload key" else [text]
    for _ in range(depth):
        inner = [inner]
    return request(payload={"a": inner})


def storable(text: str, place: str) -> bool:
    """What PostgreSQL can store: UTF-8 without NUL; and a key of the request is not blank."""
    surrogate = any(0xD800 <= ord(character) <= 0xDFFF for character in text)
    blank_key = place.endswith("_key") and not text.strip()
    return not (surrogate or "\x00" in text or blank_key)


@PROFILE
@given(text=ANY_TEXT, place=st.sampled_from(TEXT_PLACES), depth=st.integers(0, MAX_PAYLOAD_DEPTH - 3))
def test_any_text_anywhere_is_stored_exactly_when_postgresql_can_store_it(
    own_table: Engine, text: str, place: str, depth: int
) -> None:
    given_request = with_text(text, place, depth)
    with own_table.connect() as conn:
        outcome = attempt(conn, given_request)
    outcome_event(outcome)
    check_outcome(own_table, given_request, outcome)
    assert isinstance(outcome, Action) == storable(text, place), outcome
