"""The headers and recipients of an email, against a real SMTP sink (aiosmtpd) and a real PostgreSQL.

    header_case rows (address, display name) + the event's subject ─▶ enqueue_email ─ refused ─▶ InvalidEmail
        ─▶ drain (EmailAdapter) ─▶ SmtpSink ─▶ the bytes received ─▶ parsed (policy.default) and compared

`HeaderCase` is a test notice: its recipients are the rows of the test's `header_case` table, its subject is
the event's. The named tests hold each fault once reproduced: a line break or control character in a
header, a NULL or repeated address, an over-long display name, a missing Date. The properties generate
subjects, display names and addresses (any text, the mail library's line breaks, specials and encoded-word
look-alikes included): either enqueue refuses with InvalidRequest naming the field, or the relay receives
byte for byte the message outbox built, and its parsed headers say what the notice meant. Hypothesis runs
the `email-ci` profile (derandomized, a modest number of examples); `HYPOTHESIS_PROFILE=long` runs
`email-long`.
"""

from __future__ import annotations

import email
import email.policy
import itertools
import os
import re
import string
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from email.header import decode_header
from email.message import EmailMessage
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

import outbox
from demo.sink import Received, SmtpSink
from outbox import InvalidRequest
from outbox.email import (
    Draft,
    EmailAdapter,
    EmailNotice,
    InvalidEmail,
    Recipient,
    SmtpSettings,
    enqueue_email,
    register,
)
from outbox.email.message import PreparedEmail, build_message, message_bytes, message_id
from outbox.testing import drain

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "email-ci", derandomize=True, max_examples=100, deadline=None, database=None, suppress_health_check=_HEALTH
)
settings.register_profile("email-long", max_examples=2_000, deadline=None, database=None, suppress_health_check=_HEALTH)
PROFILE = settings.get_profile("email-long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "email-ci")
# the property that never leaves the process runs more examples than the one that goes through the relay
PURE = settings(PROFILE, max_examples=PROFILE.max_examples * 5)

SENDER, SENDER_NAME = "outbox@example.com", "Outbox Notices"
TEXT = "Something happened. Open the application to read it.\n"

# the rules docs/email.md states, restated here apart from outbox's code: the oracle of the properties
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
UNWRITABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]|=\\?[^?]*\\?[bBqQ]\\?")
MAX_SUBJECT, MAX_NAME, MAX_ADDRESS, MAX_LOCAL = 255, 200, 254, 64


class HeaderCase(EmailNotice):
    """To the rows of header_case with the event's case_id, in their order; the subject is the event's."""

    name = "header_case"
    workspace_scoped = False
    recipients_query = text("SELECT address, display_name FROM header_case WHERE case_id = :case_id ORDER BY position")

    def params(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"case_id": int(event["case_id"])}

    def compose(self, event: dict[str, Any], recipients: tuple[Recipient, ...]) -> Draft:
        return Draft(subject=event["subject"], text=TEXT)

    def idempotency_key(self, event: dict[str, Any]) -> str:
        return f"header_case:{event['case_id']}"

    def lane_key(self, event: dict[str, Any]) -> str:
        return f"header_case:{event['case_id']}"


HEADER_CASE = register(HeaderCase())
Row = tuple[str | None, str | None]
_case_ids = itertools.count(1)


@pytest.fixture
def cases(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE header_case (case_id int, position int, address text, display_name text)"))
    return engine


def smtp(port: int) -> SmtpSettings:
    return SmtpSettings(host="127.0.0.1", port=port, sender=SENDER, sender_name=SENDER_NAME, timeout_seconds=5)


def add_rows(conn: Connection, rows: Sequence[Row]) -> int:
    case_id = next(_case_ids)
    for position, (address, name) in enumerate(rows):
        conn.execute(
            text("INSERT INTO header_case VALUES (:case_id, :position, :address, :name)"),
            {"case_id": case_id, "position": position, "address": address, "name": name},
        )
    return case_id


def enqueue_case(engine: Engine, subject: str, rows: Sequence[Row]) -> int:
    """The case's rows and its action, in one transaction: neither stays when enqueue refuses."""
    with engine.begin() as conn:
        case_id = add_rows(conn, rows)
        enqueue_email(conn, HEADER_CASE, {"case_id": case_id, "subject": subject})
    return case_id


def queued_unchecked(engine: Engine, subject: str, rows: Sequence[Row]) -> int:
    """An action enqueued without the notice's check, as an earlier version of outbox let it in."""
    with engine.begin() as conn:
        case_id = add_rows(conn, rows)
        outbox.enqueue(conn, HEADER_CASE.request({"case_id": case_id, "subject": subject}))
    return case_id


def action_of(engine: Engine, case_id: int) -> tuple[str, str | None, int, bool]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT state, stop_reason, attempt, write_started_at IS NOT NULL FROM agent_action"
                " WHERE idempotency_key = :key"
            ),
            {"key": f"header_case:{case_id}"},
        ).one()
    return row[0], row[1], row[2], row[3]


def count_actions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM agent_action")).scalar_one())


def message_id_of(case_id: int) -> str:
    return message_id(f"header_case:{case_id}", "example.com")


def received_for(sink: SmtpSink, case_id: int) -> Received:
    [received] = [r for r in sink.received if r.message_id == message_id_of(case_id)]
    return received


def parsed(received: Received) -> EmailMessage:
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


# -- a header the mail library would refuse: refused at enqueue, and Failed before the fence ------------------

# every character str.splitlines() breaks at, and control characters of each range; NUL and a surrogate
# only in the subject, which comes from the application's code (PostgreSQL text holds neither)
REFUSED_IN_TEXT = [*LINE_BREAKS, "\r\n", "\x01", "\t", "\x1b", "\x1f", "\x7f", "\x80", "\x9f"]
REFUSED_IN_SUBJECT = [*REFUSED_IN_TEXT, "\x00", "\ud800", "\udfff"]


def test_every_line_break_and_control_character_in_a_subject_is_refused_at_enqueue(cases: Engine) -> None:
    for character in REFUSED_IN_SUBJECT:
        with pytest.raises(InvalidEmail) as refused:
            enqueue_case(cases, f"Disk full{character}Bcc: eve@evil.example", [("ann@example.com", "Ann")])
        assert refused.value.field == "subject", repr(character)
        assert "evil" not in str(refused.value) and "Disk" not in str(refused.value)
    assert count_actions(cases) == 0


@pytest.mark.parametrize("field", ["display name", "address"])
def test_every_line_break_and_control_character_in_a_recipient_is_refused_at_enqueue(cases: Engine, field: str) -> None:
    for character in REFUSED_IN_TEXT:
        value = f"ann{character}Bcc: eve@evil.example"
        row = ("ann@example.com", value) if field == "display name" else (value, "Ann")
        with pytest.raises(InvalidEmail) as refused:
            enqueue_case(cases, "Disk full", [("bob@example.com", "Bob"), row])
        assert refused.value.field == f"recipient 2 {field}", repr(character)
        assert "evil" not in str(refused.value)
    assert count_actions(cases) == 0


async def test_a_subject_queued_before_the_check_fails_before_the_fence_on_its_first_attempt(
    cases: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    queued = [queued_unchecked(cases, f"Disk{c}full", [("ann@example.com", "Ann")]) for c in "\u2028\x85\v\f"]
    outcomes = await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    assert [action_of(cases, case_id) for case_id in queued] == [("FAILED", "PROVIDER_REFUSED", 1, False)] * 4
    assert outcomes.attempted == 4 and sink.received == []


async def test_a_display_name_changed_after_enqueue_fails_before_the_fence(
    cases: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    changes = {"a line separator": "Ann\u2028Bcc: eve@evil.example", "5,000 characters": "A" * 5_000}
    queued = {why: enqueue_case(cases, "Disk full", [("ann@example.com", "Ann")]) for why in changes}
    with cases.begin() as conn:
        for why, case_id in queued.items():
            conn.execute(
                text("UPDATE header_case SET display_name = :name WHERE case_id = :case_id"),
                {"name": changes[why], "case_id": case_id},
            )
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    assert {why: action_of(cases, case_id) for why, case_id in queued.items()} == dict.fromkeys(
        changes, ("FAILED", "PROVIDER_REFUSED", 1, False)
    )
    assert sink.received == []


def test_an_encoded_word_cannot_smuggle_a_header_into_the_subject(cases: Engine) -> None:
    """The mail library decodes an encoded word when a header is set, and writes a CR LF decoded so as is."""
    with pytest.raises(InvalidEmail, match="subject: contains the start of an encoded word") as refused:
        enqueue_case(cases, "Disk =?utf-8?q?full=0D=0ABcc:_eve@evil.example?=", [("ann@example.com", "Ann")])
    assert "evil" not in str(refused.value)
    enqueue_case(cases, "Is the disk full=? Yes", [("ann@example.com", "Ann")])  # no encoded word: sent as is


def test_a_5000_character_display_name_is_refused_at_enqueue(cases: Engine) -> None:
    with pytest.raises(InvalidEmail, match=r"recipient 1 display name: is longer than 200 characters"):
        enqueue_case(cases, "Disk full", [("ann@example.com", "A" * 5_000)])
    enqueue_case(cases, "Disk full", [("ann@example.com", "A" * 200)])


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        (("ann@example.com", "Ann =?utf-8?q?Admin?="), "recipient 1 display name", "encoded word"),
        (("a" * 65 + "@example.com", "Ann"), "recipient 1 address", "64 before the @"),
        (("ann@" + "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 63, "Ann"), "recipient 1 address", "254"),
        (("ann..lee@example.com", "Ann"), "recipient 1 address", "not a valid email address"),
        (("ann@-example.com", "Ann"), "recipient 1 address", "not a valid email address"),
        (("ann@example.com.", "Ann"), "recipient 1 address", "not a valid email address"),
        (("anné@example.com", "Ann"), "recipient 1 address", "ASCII"),
    ],
    ids=["encoded word in a name", "local part of 65", "address of 259", "two dots", "hyphen", "final dot", "utf-8"],
)
def test_what_an_address_or_a_display_name_cannot_be(cases: Engine, row: Row, field: str, message: str) -> None:
    with pytest.raises(InvalidEmail, match=message) as refused:
        enqueue_case(cases, "Disk full", [row])
    assert refused.value.field == field


def test_a_subject_is_at_most_255_characters(cases: Engine) -> None:
    enqueue_case(cases, "S" * 255, [("ann@example.com", "Ann")])
    with pytest.raises(InvalidEmail, match="subject: is longer than 255 characters"):
        enqueue_case(cases, "S" * 256, [("ann@example.com", "Ann")])


def test_a_text_with_nul_or_a_surrogate_is_refused_at_enqueue() -> None:
    for body in ("a\x00b", "a\ud800b"):
        with pytest.raises(InvalidEmail) as refused:
            PreparedEmail((Recipient("ann@example.com"),), "Disk full", body).check()
        assert refused.value.field == "text"


# -- recipients: NULL and empty skipped, duplicates kept once -------------------------------------------------


async def test_a_null_or_empty_address_is_skipped(cases: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    rows: list[Row] = [(None, "Nobody"), ("", "Empty"), ("ann@example.com", None)]
    case_id = enqueue_case(cases, "Disk full", rows)
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    received = received_for(sink, case_id)
    assert received.rcpt_tos == ("ann@example.com",) and str(parsed(received)["To"]) == "ann@example.com"
    assert action_of(cases, case_id) == ("DONE", "CONFIRMED", 1, True)


async def test_only_null_addresses_reach_nobody_at_enqueue_and_at_the_attempt(
    cases: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    with pytest.raises(InvalidRequest, match="header_case notice would reach nobody"):
        enqueue_case(cases, "Disk full", [(None, "Nobody"), ("", "Empty")])
    case_id = enqueue_case(cases, "Disk full", [("ann@example.com", "Ann")])
    with cases.begin() as conn:  # the address went away while the action waited
        conn.execute(text("UPDATE header_case SET address = NULL WHERE case_id = :id"), {"id": case_id})
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    assert action_of(cases, case_id) == ("CANCELLED", "NOT_WANTED", 1, False) and sink.received == []


async def test_a_repeated_recipient_receives_one_copy(cases: Engine, aengine: AsyncEngine, sink: SmtpSink) -> None:
    rows: list[Row] = [
        ("ann@example.com", "Ann"),
        ("bob@example.com", "Bob"),
        ("ann@EXAMPLE.com", "Ann again"),  # the same mailbox: the domain's case does not matter
        ("ann@example.com", "Ann, third"),
        ("Ann@example.com", "Capital Ann"),  # another mailbox: the local part's case may matter
    ]
    case_id = enqueue_case(cases, "Disk full", rows)
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    assert received_for(sink, case_id).rcpt_tos == ("ann@example.com", "bob@example.com", "Ann@example.com")
    assert len(sink.received) == 1


async def test_the_first_display_name_of_a_repeated_recipient_wins(
    cases: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    case_id = enqueue_case(cases, "Disk full", [("ann@Example.COM", "Ann Lee"), ("ann@example.com", "Other")])
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    received = received_for(sink, case_id)
    assert received.rcpt_tos == ("ann@Example.COM",)
    assert str(parsed(received)["To"]) == "Ann Lee <ann@Example.COM>"


# -- the headers every message carries -------------------------------------------------------------------------


async def test_every_message_carries_from_to_date_message_id_and_mime_headers(
    cases: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    case_id = enqueue_case(cases, "  Disk   full  ", [("ann@example.com", "  Ann \u00a0  Lee ")])
    before = datetime.now(UTC).replace(microsecond=0)
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    after = datetime.now(UTC)
    message = parsed(received_for(sink, case_id))
    assert message.keys() == [
        "From",
        "To",
        "Subject",
        "Date",
        "Message-ID",
        "Content-Type",
        "Content-Transfer-Encoding",
        "MIME-Version",
    ]
    assert str(message["From"]) == "Outbox Notices <outbox@example.com>"
    assert str(message["To"]) == "Ann Lee <ann@example.com>"  # whitespace runs become one space
    assert str(message["Subject"]) == "Disk   full"  # surrounding whitespace dropped, the inside kept
    assert str(message["Message-ID"]) == message_id_of(case_id)
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d \+0000", str(message["Date"]))
    sent_at = message["Date"].datetime
    assert sent_at.utcoffset() is not None and before <= sent_at <= after
    assert message.get_content_type() == "text/plain" and message.get_content().replace("\r\n", "\n") == TEXT


async def test_several_recipients_see_undisclosed_recipients_and_are_only_in_the_envelope(
    cases: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    rows: list[Row] = [(f"admin{n}@example.com", f"Admin {n}") for n in range(5)]
    case_id = enqueue_case(cases, "Disk full", rows)
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    received = received_for(sink, case_id)
    assert received.rcpt_tos == tuple(address for address, _ in rows)
    assert str(parsed(received)["To"]) == "undisclosed-recipients:;"
    assert b"admin" not in received.data.lower() and b"Admin" not in received.data
    assert len(sink.received) == 1


# -- the properties --------------------------------------------------------------------------------------------

# what a header may hold and the mail library treats specially: quoting, encoded words, folding, whitespace
SPECIAL = [
    " ",
    "   ",
    "\u00a0",
    "\u3000",
    "\u200b",
    "\u202e",
    "\ufeff",
    "\ufffe",
    '"',
    "\\",
    "=?",
    "?=",
    "=?utf-8?q?x?=",
    "=?utf-8?b?QQ==?=",
    "=??Q??=",
    "=?utf-8?q?a=0D=0ABcc:_eve@evil.example?=",
    "x=? ",
    "==",
    "_",
    ",",
    ";",
    ":",
    "<",
    ">",
    "@",
    "(",
    ")",
    ".",
    "[",
    "]",
    "é",
    "ß",
    "中文",
    "𐀀",
    "Bcc: eve@evil.example",
    "Ünïcödé Ñàmé",
]
# what no header may hold
HOSTILE = [*LINE_BREAKS, "\r\n", "\x00", "\x01", "\t", "\x1b", "\x7f", "\x80", "\x9f", "\ud800"]
WRITABLE = st.characters(blacklist_categories=["Cc", "Cs"], blacklist_characters="\u2028\u2029")


def texts(*, storable: bool) -> st.SearchStrategy[str]:
    """Mostly short text a header can hold (specials, encoded-word look-alikes, any script), some long words
    and long text, some that no header can hold; `storable`: without NUL and surrogates, which PostgreSQL
    text cannot hold."""
    short = st.one_of(
        st.text(WRITABLE, max_size=40),
        st.lists(st.sampled_from(SPECIAL) | st.text(WRITABLE, max_size=6), max_size=10).map("".join),
    )
    long = st.one_of(
        st.integers(180, 270).map(lambda n: "x" * n),
        st.integers(180, 270).map(lambda n: "é" * n),
        st.text(WRITABLE, min_size=150, max_size=260),
        st.integers(20, 40).map(lambda n: "Ünïcödé " * n),
    )
    hostile = st.one_of(
        st.text(max_size=40),
        st.lists(st.sampled_from([*SPECIAL, *HOSTILE]) | st.text(max_size=6), max_size=10).map("".join),
    )
    drawn = st.sampled_from([short] * 6 + [long, hostile]).flatmap(lambda strategy: strategy)
    if storable:
        return drawn.map(lambda s: "".join(c for c in s if c != "\x00" and not "\ud800" <= c <= "\udfff"))
    return drawn


def addresses(*, storable: bool = True) -> st.SearchStrategy[str]:
    """Mostly valid addresses; some of any atext and dots, any domain-like text, any text at all."""
    local = st.from_regex(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,70}", fullmatch=True)
    domain = st.from_regex(r"[A-Za-z0-9.-]{1,70}", fullmatch=True)
    odd = st.one_of(
        st.builds(lambda lo, do: f"{lo}@{do}", local, domain),
        st.builds(lambda lo, do: f"{lo}@{do}", texts(storable=storable), st.sampled_from(["example.com", "a.b"])),
        texts(storable=storable),
    )
    return st.sampled_from([st.emails()] * 5 + [odd]).flatmap(lambda strategy: strategy)


def _strategy(value: str | st.SearchStrategy[str] | None) -> st.SearchStrategy[str | None]:
    return value if isinstance(value, st.SearchStrategy) else st.just(value)


@st.composite
def recipient_rows(draw: st.DrawFn) -> list[Row]:
    names = texts(storable=True)
    rows: list[Row] = draw(
        st.lists(
            st.tuples(st.sampled_from([None, "", *[addresses()] * 10]).flatmap(_strategy), st.none() | names),
            min_size=1,
            max_size=3,
        )
    )
    first = rows[0][0]
    if first and draw(st.booleans()):  # the same mailbox again, its domain in another case
        local, _, domain = first.rpartition("@")
        rows.append((f"{local}@{domain.swapcase()}", draw(names)))
    return rows


def name_as_written(name: str | None) -> str:
    return " ".join((name or "").split())


ATEXT = set(string.ascii_letters + string.digits + "!#$%&'*+/=?^_`{|}~-")
LETTERS_DIGITS_HYPHEN = set(string.ascii_letters + string.digits + "-")


def address_problem(address: str) -> str | None:
    if UNWRITABLE.search(address):
        return "a line break, control character or encoded word"
    local, at, domain = address.rpartition("@")
    if len(address) > MAX_ADDRESS or len(local) > MAX_LOCAL:
        return "address length"
    if not at or not all(part and set(part) <= ATEXT for part in local.split(".")):
        return "local part"
    for label in domain.split("."):
        if not (0 < len(label) <= 63 and set(label) <= LETTERS_DIGITS_HYPHEN and "-" not in (label[0], label[-1])):
            return "domain"
    return None


def name_problem(name: str) -> str | None:
    if UNWRITABLE.search(name):
        return "a line break, control character or encoded word"
    if len(name_as_written(name)) > MAX_NAME:
        return "name length"
    return None


def must_refuse(subject: str, rows: Sequence[Row]) -> str | None:
    """Why the rules docs/email.md states refuse this case, or None when they accept it."""
    kept = [(address, name or "") for address, name in rows if address not in (None, "")]
    if not kept:
        return "nobody"
    for address, name in kept:
        problem = address_problem(str(address)) or name_problem(name)
        if problem:
            return problem
    if UNWRITABLE.search(subject):
        return "a line break, control character or encoded word"
    if len(subject.strip()) > MAX_SUBJECT:
        return "subject length"
    return None


def unique(rows: Sequence[Row]) -> list[tuple[str, str]]:
    """The recipients as docs/email.md says: NULL and empty skipped, the first of a mailbox kept."""
    seen: dict[str, tuple[str, str]] = {}
    for address, name in rows:
        if address:
            local, _, domain = address.rpartition("@")
            seen.setdefault(f"{local}@{domain.lower()}", (address, name or ""))
    return list(seen.values())


_WORD = re.compile(
    r'(?P<encoded>=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=)|(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<atom>[^\s"]+)|(?P<space>\s+)'
)


def phrase_text(phrase: str) -> str:
    """A display name as RFC 2047 reads it: whitespace between two adjacent encoded words is no text.

    Python's `policy.default` parser keeps a space there inside an address (a display name long enough to
    need two encoded words reads back with a space where the folding split it); this reading does not.
    """
    out, space, previous_encoded, end = "", False, False, 0
    for match in _WORD.finditer(phrase):
        assert match.start() == end, phrase
        end = match.end()
        if match["space"]:
            space = True
            continue
        encoded = match["encoded"] is not None
        if encoded:
            [(raw, charset)] = decode_header(match["encoded"])
            assert isinstance(raw, bytes) and charset
            word = raw.decode(charset)  # strict: an encoded word never splits a character
        elif match["quoted"]:
            word = re.sub(r"\\(.)", r"\1", match["quoted"][1:-1])
        else:
            word = match["atom"]
        if out and space and not (encoded and previous_encoded):
            out += " "
        out, space, previous_encoded = out + word, False, encoded
    assert end == len(phrase), phrase
    return out


def raw_header(data: bytes, name: str) -> str:
    """The header as written, unfolded."""
    value = email.message_from_bytes(data, policy=email.policy.compat32)[name]
    return re.sub(r"\r?\n(?=[ \t])", "", str(value)).strip()


def assert_mailbox(data: bytes, message: EmailMessage, header: str, address: str, name: str) -> None:
    """The header names exactly this mailbox, with exactly this display name."""
    [mailbox] = message[header].addresses
    assert mailbox.addr_spec == address
    raw = raw_header(data, header)
    if name:
        phrase, _, rest = raw.rpartition(" <")
        assert rest == f"{address}>"
        assert phrase_text(phrase) == name, (raw, name)
    else:
        assert raw == address
    if "?= =?" not in raw:  # no adjacent encoded words: policy.default reads it exactly too
        assert mailbox.display_name == name, (raw, name)
    else:
        assert "".join(mailbox.display_name.split()) == "".join(name.split())


def assert_received_as_built(received: Received, subject: str, rows: Sequence[Row], case_id: int) -> None:
    """The relay received byte for byte what outbox builds for this case, and it reads as the case meant."""
    recipients = unique(rows)
    assert received.rcpt_tos == tuple(address for address, _ in recipients)
    message = parsed(received)
    assert str(message["Subject"]) == subject.strip()
    assert str(message["Message-ID"]) == message_id_of(case_id)
    sent_at = message["Date"].datetime
    assert sent_at.utcoffset() == timedelta(0)
    assert_mailbox(received.data, message, "From", SENDER, SENDER_NAME)
    if len(recipients) == 1:
        [(address, name)] = recipients
        assert_mailbox(received.data, message, "To", address, name_as_written(name))
    else:
        assert str(message["To"]) == "undisclosed-recipients:;" and message["To"].addresses == ()
    assert message.get("Cc") is None and message.get("Bcc") is None
    prepared = PreparedEmail(tuple(Recipient(a, n) for a, n in recipients), subject, TEXT)
    built = message_bytes(build_message(prepared, Recipient(SENDER, SENDER_NAME), message_id_of(case_id), sent_at))
    assert received.data.replace(b"\r\n", b"\n") == built
    assert max(len(line) for line in received.data.split(b"\r\n")) <= 998


async def test_generated_headers_are_refused_at_enqueue_or_received_exactly(
    cases: Engine, aengine: AsyncEngine, sink: SmtpSink
) -> None:
    accepted: list[tuple[int, str, list[Row]]] = []

    @PROFILE
    @given(subject=texts(storable=False), rows=recipient_rows())
    def enqueue_one(subject: str, rows: list[Row]) -> None:
        why = must_refuse(subject, rows)
        try:
            case_id = enqueue_case(cases, subject, rows)
        except InvalidRequest as refused:
            assert why is not None, f"refused ({refused}), though the rules accept it"
            if why != "nobody":
                assert isinstance(refused, InvalidEmail)
                assert refused.field == "subject" or refused.field.startswith("recipient "), refused.field
            for value in [subject, *(v for row in rows for v in row if v)]:
                assert len(value) < 12 or value not in str(refused), "an error holds the value it refused"
            return
        assert why is None, f"accepted, though the rules refuse it: {why}"
        accepted.append((case_id, subject, rows))

    enqueue_one()
    assert count_actions(cases) == len(accepted) > 0
    await drain(aengine, [EmailAdapter(aengine, smtp(sink.port))])
    for case_id, subject, rows in accepted:
        assert action_of(cases, case_id) == ("DONE", "CONFIRMED", 1, True), (subject, rows)
        assert_received_as_built(received_for(sink, case_id), subject, rows, case_id)
    assert len(sink.received) == len(accepted)


@PURE
@given(
    subject=texts(storable=False),
    name=texts(storable=False),
    sender_name=texts(storable=False),
    address=addresses(storable=False),
)
def test_generated_headers_are_refused_by_the_check_or_built_exactly(
    subject: str, name: str, sender_name: str, address: str
) -> None:
    """The same property without the relay, for more examples, NUL and surrogates in every field, and the
    sender's display name drawn too."""
    try:
        SmtpSettings(host="127.0.0.1", port=25, sender=SENDER, sender_name=sender_name)
    except InvalidEmail as refused:
        assert name_problem(sender_name) is not None and refused.field == "smtp sender name"
        return
    assert name_problem(sender_name) is None
    why = must_refuse(subject, [(address, name)])
    event(f"refused: {why}" if why else "accepted")
    prepared = PreparedEmail((Recipient(address, name),), subject, TEXT)
    try:
        prepared.check()
    except InvalidEmail as refused:
        assert why is not None, f"refused ({refused}), though the rules accept it"
        return
    assert why is None, f"accepted, though the rules refuse it: {why}"
    sent_at = datetime.now(UTC).replace(microsecond=0)
    data = message_bytes(build_message(prepared, Recipient(SENDER, sender_name), "<m@example.com>", sent_at))
    message = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    assert_mailbox(data, message, "From", SENDER, name_as_written(sender_name))
    assert_mailbox(data, message, "To", address, name_as_written(name))
    assert str(message["Subject"]) == subject.strip()
    assert message["Date"].datetime == sent_at and str(message["Message-ID"]) == "<m@example.com>"
    assert max(len(line) for line in data.splitlines()) <= 998
