"""Destinations, the executor's layer: the numbers of a pause, a pace and a breaker, shared through the database.

Pause. A provider's slow-down (outbox.executor.results.SlowDown) pauses its destination: for the wait the
provider named (a Retry-After), else for one token of its pace (1 / pace seconds, at least MIN_PAUSE_SECONDS;
with no pace, PAUSE_BASE_SECONDS), doubling with each slow-down in a row (the provider accepted nothing since
the last pause ended), up to PAUSE_CAP_SECONDS. The slow-downs of attempts that were claimed before the
pause, and answered during it, change nothing (but for a longer wait the provider names). No executor claims
for a paused destination. A paced destination's pause is short: the lowered pace is what keeps it under the
limit, and a long pause in every cycle of the pace would cost more than the refusals it saves; a provider
that refuses everything (a window of its limit used up) doubles it.

Pace. A slow-down that finds its destination not paused, and its pace not lowered in the last SETTLE_SECONDS (or two
tokens of it, when longer: the attempts sent at the pace before are still being answered), lowers the pace to DECREASE
of what it was: the pace then, else its configured rate, and no more than what the provider accepted. What it accepted
is measured over the last MEASURE_SECONDS: the attempts that ended accepted, a second since the first of them ended
(over at least MEASURE_FLOOR_SECONDS), when at least MIN_ACCEPTED. A first pace (none yet) counts what was sent since
the provider's last refusal that paused the destination (`slowed_at`) and accepted, over the seconds since it, when
that refusal came within MEASURE_SECONDS (or the slow-down is in a row), at least MEASURE_FLOOR_SECONDS ago, and at
least MIN_ACCEPTED were: a provider refuses when its bucket is empty, so what it accepts of the attempts sent after a
refusal is its rate, where a count of everything it accepted after a cold start includes the burst it had saved up and
set first paces of twice its limit and more. Else it counts what was sent in the last MEASURE_SECONDS and accepted, a
second since the first was sent, when at least MIN_ACCEPTED (the executors' own pause, and the attempts already in
flight taking what the provider refills, can leave one or two sent since the refusal accepted: a pace of a fraction of
the limit, measured so, once kept a backlog crawling for a minute). (Once paced, the executors pause every fraction of
a second while the provider refuses, each pause moves `slowed_at`, and too little is sent between them to measure the
rate: there the last seconds' measure is the better one, the provider's bucket being near empty.) A pace that had
risen far above the limit comes down to it at once instead of by a tenth at a time; with no measure and no pace, the
pause alone (at a cold start most attempts are still in flight). A slow-down in a row without a pace takes that
measure of the last seconds from as few as one: without a pace every executor claims its whole concurrency again when
a pause ends, the provider refuses the first of those before the ones it accepted have ended, and the pause doubled to
minutes with the backlog waiting. Only a provider that accepted nothing sent in those seconds keeps the pause alone.
A pace lowered in a row, and a first pace not measured from the refusal (fewer than MIN_ACCEPTED sent since it, or in
a row), is never below RECENT_SHARE of what the provider accepted over the last RECENT_SECONDS, a second since the first
of them ended (over at least RECENT_SPAN_SECONDS): in a row the pause has doubled, the seconds since the refusal hold
the pause itself and the last seconds little that was sent, and a first pace measured from them once set 1.1 a second
against a relay of 20, which then fed it a tenth of its rate for most of a minute while the pace climbed. Over any span
a provider accepts at most its burst and its rate, so half of that over a second or more is at most its rate when its
burst is at most a second's worth (a larger burst lifts the floor for the seconds it stays in the window, and the
refusals in a row then keep pausing the destination until it has left it).
From there the pace climbs in RETURN_SECONDS to LEVEL of where it was slowed down (`pace * LEVELLED`, LEVELLED = LEVEL
/ DECREASE), levels off there, then rises above it ever faster (a cubic of the time since it was lowered, to at most
twice itself and one more), so it finds the provider's limit again: multiplicative decrease, and an increase whose
cycle lasts about as long at any pace. The level is below the pace that was refused: a provider whose bucket the last
refusals emptied refills it only by what the pace leaves unused, and at the refused pace itself it would stay empty,
refusing any two attempts that reach it closer together than its rate (a connection, a notice's query: their times
vary). A rise by a fixed number of attempts a second, a second, would overrun a slow provider within a second or two
of each slow-down (a cycle accepts about L^2 / 5 attempts at a limit of L a second with 0.5 a second, a second: the
refusals grow as the limit falls), and one by a share of the pace would take minutes to climb from a pace measured too
low. A pace at its ceiling whose tokens the executors use up (they keep up with it, and the provider still accepts)
starts its curve again from there, levelled: a pace measured far too low grows 1.9 times every 2.6 * RETURN_SECONDS.
Above its level a pace rises only while it is used: its curve's time stops IDLE_SECONDS (or two tokens of the pace as
lowered, when longer) after its attempts' last turn, so a pace whose backlog drained holds where it was instead of
rising to its ceiling, above the provider's limit, for the next backlog to meet with a run of refusals; the next turn
starts its curve again from there, levelled. (The climb back to the level is not held: the level is below a pace the
provider refused.) A pace neither lowered nor restarted for PACE_HOLD_SECONDS is over; the destination is open again.
With a configured rate the lower of the two holds.

Turns. The claim takes a paced destination's heads as its token bucket allows, which bounds what is in flight; the
attempts then reach the provider at their own speed (a notice's query, a connection), and on a busy machine those
claimed in one second could reach it in the next together with that second's own. So each attempt of a held
destination takes a token of a second bucket just before its fence, as full and as fast as the first, and waits
for its turn when there is none: the provider sees at most the rate and the burst in any second. An attempt whose
turn, or its destination's pause, is more than GATE_WAIT_SECONDS away waits no longer and takes no turn: it ends
Defer (it does not count) and its lane's head is due when the wait is over. (A turn taken and never used would
push every later one further off, until none came within GATE_WAIT_SECONDS and the destination sent nothing: seen
once at 5 a second, 687 emails waiting and none sent for three minutes.) A provider's pause voids every turn given
before it (the bucket starts again from empty): an attempt that waited for its turn reads `slowed_at` before its
fence and, if the provider paused the destination meanwhile, takes a turn again; the turns given at a pace the
provider refused would otherwise reach it one after another at that pace, each refused, for as long as the queue
at the gate was (seconds, at a cold start).

Breaker. Every failed attempt (a Retry: refused, reset, 5xx, no answer) and every pause a slow-down made (the slow-downs
answered during it are the same refusal) of a destination not known broken adds to its run of failures, kept on its row
for every executor (`failing_since`, `failures`). A run that has lasted `ExecutorConfig.break_seconds` (120 s), with at
least BREAK_FAILURES in it, and during which the destination accepted no attempt (read from the actions' record, once,
when the run is judged; an acceptance starts the run again from it), marks it broken: no executor claims for it but one
probe every `ExecutorConfig.probe_seconds` (15 s; the probe's attempt counts as any other; a provider's pause still
holds it back); the first attempt that succeeds mends it. The window is judged from the row, not from attempts that
happen to fall inside it: heads that timed out and then wait their retries for minutes are broken at their next failure,
whichever executor sees it. 120 s is longer than a receiver's restart or a deploy and twice the window of a per-minute
quota (a provider refusing until its minute turns accepts again within it), and short enough that a dead receiver is
seen, and alerted on, about two minutes after it stopped accepting. An attempt accepted writes nothing here: only
failures do.

Credentials refused. An adapter that hears its destination's credentials refused (a revoked or invalid token, a
deactivated account, a 401) returns CredentialsRefused: no other action can succeed there until a person mends the
secret, so the destination is held as broken at once, for every executor, with the reason kept on its row
(`credentials_refused_at`, `credentials_reason`), and probed once every CREDENTIALS_PROBE_SECONDS; the action
waits as long and its attempt does not count. Five minutes: a mended secret is found within them (an operator's
`outbox destinations resume` probes at once), and a provider that stays refusing costs twelve requests an hour.

Destinations are one concept in three layers: the operator's (outbox.destinations), the executor's
(outbox.executor.destinations, pacing and turns) and the store's (outbox.store.destinations and destination_rows).
"""

from __future__ import annotations

from outbox._internal.config.rates import BURST_SECONDS

PAUSE_BASE_SECONDS = 0.5
PAUSE_CAP_SECONDS = 300.0
DECREASE = 0.9
LEVEL = 0.95
# the level the pace climbs to and holds, as a multiple of the pace as lowered
LEVELLED = LEVEL / DECREASE
MEASURE_SECONDS = 2.0
MEASURE_FLOOR_SECONDS = 0.5
MIN_ACCEPTED = 5
MIN_PAUSE_SECONDS = 0.25
MIN_PACE = 0.1
SETTLE_SECONDS = 1.0
RETURN_SECONDS = 5.0
PACE_HOLD_SECONDS = 600.0
IDLE_SECONDS = 1.0
RECENT_SECONDS = 10.0
RECENT_SPAN_SECONDS = 1.0
RECENT_SHARE = 0.5

BREAK_FAILURES = 5
CREDENTIALS_PROBE_SECONDS = 300.0
GATE_WAIT_SECONDS = 10.0

# the parameters of the pace in outbox.store.destinations' statements; a learned pace's bucket holds
# BURST_SECONDS of it (outbox._internal.config.rates), as a configured rate's does
PACE = {
    "decrease": DECREASE,
    "levelled": LEVELLED,
    "return_seconds": RETURN_SECONDS,
    "pace_hold": PACE_HOLD_SECONDS,
    "burst_seconds": BURST_SECONDS,
    "idle": IDLE_SECONDS,
}
SLOW_DOWN = PACE | {
    "base": PAUSE_BASE_SECONDS,
    "cap": PAUSE_CAP_SECONDS,
    "measure": MEASURE_SECONDS,
    "measure_floor": MEASURE_FLOOR_SECONDS,
    "min_accepted": MIN_ACCEPTED,
    "recent": RECENT_SECONDS,
    "recent_span": RECENT_SPAN_SECONDS,
    "recent_share": RECENT_SHARE,
    "min_pause": MIN_PAUSE_SECONDS,
    "min_pace": MIN_PACE,
    "settle": SETTLE_SECONDS,
}
