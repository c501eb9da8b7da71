"""What the EMAIL adapter makes of a relay's reply: one table of rules, read top down, the first match wins.

    (stage, code, text) ──▶ the first rule of REPLY_RULES whose stages, code and text match ──▶ its result:
        Slow down (a SlowDown: a slow-down before any data; nothing was sent, the attempt does not count, and
        the relay's destination, `smtp`, pauses for every executor), Defer (this message alone waits, such
        as a greylisted one: outbox.executor.backoff.not_yet), Retry, Failed PROVIDER_REFUSED or Uncertain
        PROVIDER_UNCERTAIN

The stages are those the adapter reaches in order: connect (and the greeting), ehlo, starttls, login, mail,
rcpt, data (the DATA command, the message and the reply at its end). A reply's text is read only to match
it, case-insensitively (an enhanced status code such as `4.7.1` opens it); a result's reason holds the
stage, the code and what the rule says, never the text, which often repeats an address.

The table in docs/email.md shows these rules (`markdown_rows`), and a test keeps the two the same; each
rule's examples are real relays' replies, and a test sends each through a real SMTP server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from outbox.executor import Failed, Result, Retry, Uncertain
from outbox.executor.backoff import not_yet, slow_down

Verdict = Literal["Slow down", "Defer", "Retry", "Failed", "Uncertain"]

# the stages before DATA: a refusal there proves the relay holds nothing
BEFORE_DATA = ("connect", "ehlo", "starttls", "login", "mail", "rcpt")
# how the docs name each stage
STAGE_NAMES = {
    "connect": "connect",
    "ehlo": "EHLO",
    "starttls": "STARTTLS",
    "login": "AUTH",
    "mail": "MAIL FROM",
    "rcpt": "RCPT TO",
    "data": "DATA and after",
}
# an enhanced status code of the class "security or policy status" (RFC 3463): rates, throttles, greylisting
POLICY_CODE = re.compile(r"^\s*4\.7\.\d{1,3}\b")
# a limit on one message's recipients (RFC 5321 asks to send the rest in another transaction)
TOO_MANY_RECIPIENTS = re.compile(r"^\s*4\.5\.3\b|too many recipients", re.I)
# words of a rate or a throttle in a reply's text
SLOW_DOWN_WORDS = re.compile(r"\brate|too many|throttl|try again later|too much mail", re.I)
# greylisting: the relay wants this message again later, and takes the others meanwhile
GREYLISTED = re.compile(r"greylist|graylist", re.I)


@dataclass(frozen=True)
class ReplyRule:
    stages: tuple[str, ...]
    # the codes it takes: "421", or "4xx" for any 4xx
    code: str
    # what the reply's text must match (None: any text)
    text: re.Pattern[str] | None
    # the reply as the docs describe it
    reply: str
    verdict: Verdict
    # why, for the docs and the end of the result's reason
    why: str
    # (stage, reply): replies of real relays this rule takes, each tested against a real SMTP server
    examples: tuple[tuple[str, str], ...] = ()

    def takes(self, stage: str, code: int, text: str) -> bool:
        return (
            stage in self.stages
            and re.fullmatch(self.code.replace("x", r"\d"), str(code)) is not None
            and (self.text is None or self.text.search(text) is not None)
        )

    def result(self, stage: str, code: int, uncounted: int) -> Result:
        """This rule's result for `code` at `stage`, when `uncounted` earlier claims of the action did not count."""
        reason = f"{stage}: {code}; {self.why}"
        match self.verdict:
            case "Slow down":
                return slow_down(uncounted, reason)
            case "Defer":
                return not_yet(uncounted, reason)
            case "Retry":
                return Retry(reason)
            case "Failed":
                return Failed(reason)
            case "Uncertain":
                return Uncertain(reason)


SLOWS_DOWN = "the relay asks to slow down; nothing was sent"
GREYLISTS = "the relay wants this message again later (greylisting); nothing was sent"

REPLY_RULES: tuple[ReplyRule, ...] = (
    ReplyRule(
        ("data",),
        "4xx",
        None,
        "4xx, a slow-down's included",
        "Retry",
        "the relay accepted nothing",
        (
            ("data", "452 4.3.1 Insufficient system storage"),
            ("data", "451 4.7.1 Error: too much mail, try again later"),
            ("data", "421 4.7.0 Try again later, closing connection"),
        ),
    ),
    ReplyRule(
        ("data",), "5xx", None, "5xx", "Failed", "the relay refused the message", (("data", "554 5.7.1 refused"),)
    ),
    ReplyRule(
        ("data",),
        "xxx",
        None,
        "any other reply",
        "Uncertain",
        "an unexpected reply: the message may have been taken",
        (("data", "354 go ahead"),),
    ),
    ReplyRule(
        BEFORE_DATA,
        "421",
        None,
        "421 (the relay closes the connection)",
        "Slow down",
        SLOWS_DOWN,
        (
            ("connect", "421 4.7.0 relay.example.test Error: too many connections from 127.0.0.1"),
            ("ehlo", "421 4.3.2 Service not available"),
            ("starttls", "421 4.7.0 Try again later, closing connection"),
            ("login", "421 4.7.0 Too many authentications, closing connection"),
            ("mail", "421 4.7.0 Try again later, closing connection"),
            ("rcpt", "421 4.7.0 Try again later, closing connection"),
        ),
    ),
    ReplyRule(
        ("rcpt",),
        "4xx",
        TOO_MANY_RECIPIENTS,
        "4xx `4.5.3` or too many recipients",
        "Retry",
        "a limit of this message, not of the pace: waiting alone would not help",
        (("rcpt", "452 4.5.3 Error: too many recipients"),),
    ),
    ReplyRule(
        BEFORE_DATA,
        "4xx",
        GREYLISTED,
        "4xx whose text says greylisted",
        "Defer",
        GREYLISTS,
        (
            ("rcpt", "451 4.7.1 Greylisted, please come back later"),
            ("rcpt", "450 4.2.0 Recipient address rejected: Greylisted"),
        ),
    ),
    ReplyRule(
        BEFORE_DATA,
        "4xx",
        POLICY_CODE,
        "4xx with an enhanced code `4.7.x` (`454 4.7.0`, `450 4.7.1`, `451 4.7.1`)",
        "Slow down",
        SLOWS_DOWN,
        (
            ("mail", "454 4.7.0 Throttling failure: Maximum sending rate exceeded"),
            ("mail", "450 4.7.1 Error: too much mail from 127.0.0.1"),
            ("login", "454 4.7.0 Temporary authentication failure"),
            ("ehlo", "450 4.7.1 Helo command rejected: Host not found"),
        ),
    ),
    ReplyRule(
        BEFORE_DATA,
        "4xx",
        SLOW_DOWN_WORDS,
        "4xx whose text says rate, too many, throttled, try again later or too much mail",
        "Slow down",
        SLOWS_DOWN,
        (
            ("mail", "451 Throttled, please slow down"),
            ("mail", "450 Requested action aborted: sending rate exceeded"),
            ("mail", "452 4.3.0 Too many messages for now"),
            ("rcpt", "451 4.3.0 Please try again later"),
        ),
    ),
    ReplyRule(
        BEFORE_DATA,
        "4xx",
        None,
        "any other 4xx",
        "Retry",
        "the relay accepted nothing",
        (
            ("mail", "451 4.3.0 Temporary lookup failure"),
            ("rcpt", "450 4.2.1 mailbox busy"),
            ("starttls", "454 TLS not available due to temporary reason"),
        ),
    ),
    ReplyRule(
        ("mail", "rcpt"),
        "5xx",
        None,
        "5xx (at RCPT TO: to every recipient)",
        "Failed",
        "the relay refused it",
        (("mail", "550 5.7.1 sender refused"), ("rcpt", "550 5.1.1 no such user")),
    ),
    ReplyRule(
        BEFORE_DATA,
        "xxx",
        None,
        "any other reply (a 5xx greeting, 535 at AUTH)",
        "Retry",
        "nothing was sent",
        (
            ("connect", "554 5.3.2 no service here"),
            ("ehlo", "550 5.7.1 go away"),
            ("login", "535 5.7.8 Authentication credentials invalid"),
        ),
    ),
)


def reply_rule(stage: str, code: int, text: str) -> ReplyRule:
    """The rule that classifies `code` and `text` at `stage`: the first in REPLY_RULES that takes it."""
    for rule in REPLY_RULES:
        if rule.takes(stage, code, text):
            return rule
    raise ValueError(f"no reply rule for stage {stage!r}")


def classify_reply(stage: str, code: int, text: str, uncounted: int) -> Result:
    """A relay's reply at `stage`, by REPLY_RULES; `uncounted`: the action's earlier claims that did not count."""
    return reply_rule(stage, code, text).result(stage, code, uncounted)


def markdown_rows() -> list[str]:
    """REPLY_RULES as the rows of docs/email.md's table: stage, reply, result, why."""
    rows = []
    for rule in REPLY_RULES:
        stages = ", ".join(STAGE_NAMES[stage] for stage in rule.stages)
        rows.append(f"| {stages} | {rule.reply} | {rule.verdict} | {rule.why} |")
    return rows
