"""What a chaos run is told and what it keeps track of: its configuration, the executor slots, the kills,
brinks and network faults it caused, the actions it enqueued and the accounts it erased."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from tests.chaos.netrelay import NetRelay
    from tests.chaos.postgres import OwnPostgres

SENDER_DOMAIN = "example.com"
ENDED_STATES = ("DONE", "UNCERTAIN", "FAILED", "CANCELLED")


@dataclass
class ChaosConfig:
    seed: int
    minutes: float  # how long faults are injected (the workload runs meanwhile)
    executors: int = 4
    rate: float = 15.0  # actions enqueued per second
    lease_seconds: float = 65.0
    mean_fault_gap: float = 3.0  # seconds between faults, on average (exponential)
    brink_every: float = 120.0  # one on-purpose frozen-at-the-brink holder this often (the first four at once)
    nats_duplicate_window: float = 20.0  # shorter than the lease: a reclaim's read-back falls past it
    settle_seconds: float = 360.0  # the most a run waits for the store to settle after the faults
    server_url: str | None = None  # an existing server's maintenance database; None: our own, restartable
    pooler: str | None = None  # None, or PgBouncer's pool mode ("transaction", "session") between relays and server
    # 0: one database; else this many cells (tests.chaos.records.CELL_NAMES), each a PostgreSQL server of its own
    # (on server_url: a database each), drained by executors that run `outbox run --all-cells`
    cells: int = 0
    work_dir: Path | None = None
    log: Callable[[str], None] = print

    @property
    def seconds(self) -> float:
        return self.minutes * 60


# the cells of a cells run, in the cells file's order; a cell's action ids start at its index times CELL_ID_STRIDE
# (+1), so that an id names its cell in the journals, the providers' records and the report
CELL_NAMES = ("eu", "us", "ap")
CELL_ID_STRIDE = 1_000_000_000


@dataclass
class CellDb:
    """One database of the run: the only one (name None), or a cell's."""

    name: str | None
    index: int
    own: OwnPostgres | None  # its own server, which the run may restart or kill
    server: str  # the server's maintenance database
    db_name: str
    url: str  # the database, reached directly
    engine: Engine  # the runner's connections (the application's side)
    direct: tuple[str, int]  # where its executors' relays forward to

    @property
    def label(self) -> str:
        return self.name or "the database"


@dataclass
class Slot:
    index: int
    skew: float
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    journal: Path | None = None
    paused_until: float | None = None  # SIGSTOPped by the runner until then
    brink: Brink | None = None  # froze itself (or the relay froze it) on purpose
    down_since: float | None = None  # killed, waiting for its restart
    # the network between this slot's process and the database: one relay per connection target
    relays: list[NetRelay] = field(default_factory=list)
    started_at: float = 0.0
    beat_at: float | None = None  # the current process's first heartbeat; no fault touches it before
    partition: Partition | None = None  # a network fault on this slot, until its process beat after it


@dataclass
class Brink:
    kind: str
    action_id: int | None
    epoch: int | None
    since: float
    slot: int = -1
    released_at: float | None = None
    outcome: str = ""
    ending: str = ""  # WEBHOOK and NATS_EVENT: "SIGKILL" or "past the lease"


@dataclass
class Kill:
    n: int
    at: float  # seconds into the run
    slot: int
    held: list[tuple[int, int]]
    restarted_at: float | None = None
    new_pid: int | None = None
    beat_at: float | None = None
    recovered_at: float | None = None

    @property
    def restart_to_beat(self) -> float | None:
        return None if self.beat_at is None or self.restarted_at is None else self.beat_at - self.restarted_at

    @property
    def recovery(self) -> float | None:
        """Kill to every action it held taken back or ended (0 when it held none)."""
        return None if self.recovered_at is None else self.recovered_at - self.at


@dataclass
class Partition:
    """A network fault on one executor's connections to the database (tests.chaos.netrelay)."""

    n: int
    kind: str  # "blackhole past the lease", "blackhole short", "delay", "cut"
    slot: int
    pid: int
    at: float  # seconds into the run
    seconds: float  # how long it lasted (0: a cut)
    wall_at: float  # epoch seconds, this machine's clock (the database's too)
    log: Path
    log_offset: int  # the executor log's size when it began
    skew: float  # the executor's wall clock is off by this much (its log lines too)
    detail: str = ""
    ended_at: float | None = None
    wall_end: float | None = None
    noticed_after: float | None = None  # its executor first logged the database unreachable, after its start
    beat_after_end: float | None = None  # its executor's next heartbeat, after its end
    outcome: str = ""


@dataclass
class Planned:
    id: int
    kind: str
    key: str
    lane: str
    account: int | None
    proposed: bool = False
    parked: bool = False
    brink: bool = False
    expires: bool = False


@dataclass
class Erasure:
    account: int
    at: float  # epoch seconds (database clock) just before the erasure committed
    rows: list[dict[str, Any]]
