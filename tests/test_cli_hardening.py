"""Every `outbox` command against what an operator may hand it: bad values of every kind, a host that is
closed, a host that accepts and never answers, a database never migrated, a role without rights, URLs
holding a password, lane keys holding escape sequences, and a server that ends the sessions of a starting
`outbox run`.

Each command runs as the operator runs it, a subprocess of `python -m outbox.cli`, with a 2-second connect
timeout. A failure is no traceback, exactly one line on stderr (one JSON object with `--json`), the exit
code of the rule (2 bad input, 1 the database), nothing on stdout, no password, and an answer within the
connect timeout and a margin.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from outbox.cli.run import START_ASK_SECONDS
from tests.support import until

ROOT = Path(__file__).resolve().parent.parent
# every URL handed to a command holds one of these; neither may ever be printed
PASSWORD = "Pw-of-the-0perator"
ROLE_PASSWORD = "N0-rights-Pw"
CONNECT_TIMEOUT = 2
# process start and the driver's own work, on a busy machine; still well under the 10 s default timeout
MARGIN = 6.0

COMMANDS: dict[str, list[str]] = {
    "status": ["status"],
    "lanes": ["lanes"],
    "show": ["show", "1"],
    "list": ["list"],
    "admit": ["admit", "1"],
    "refuse": ["refuse", "1"],
    "cancel": ["cancel", "1"],
    "erase-account": ["erase-account", "1"],
    "purge": ["purge"],
    "run": ["run"],
    "metrics serve": ["metrics", "serve"],
    "db upgrade": ["db", "upgrade"],
    "db downgrade": ["db", "downgrade"],
    "db current": ["db", "current"],
    "db check": ["db", "check"],
}
JSON_COMMANDS = {"status", "lanes", "show", "list", "admit", "refuse", "cancel", "erase-account", "purge"}
# `metrics serve` starts with its database down and says so in its metrics: its own tests below
DATABASE_COMMANDS = [name for name in COMMANDS if name != "metrics serve"]
MIGRATIONS = {"db upgrade", "db downgrade"}


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str
    seconds: float


def outbox(*args: str, url: str | None, env: dict[str, str] | None = None) -> Ran:
    environ = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOX_")}
    environ["OUTBOX_CONNECT_TIMEOUT_SECONDS"] = str(CONNECT_TIMEOUT)
    if url is not None:
        environ["OUTBOX_DATABASE_URL"] = url
    environ |= env or {}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", *args],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    return Ran(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def no_secret(ran: Ran) -> None:
    for secret in (PASSWORD, ROLE_PASSWORD):
        assert secret not in ran.out and secret not in ran.err, ran


def failed(ran: Ran, code: int, expected: str, *, json_output: bool = False, prefix: str = "error: ") -> str:
    """The one line (or JSON object) of a failure that exits `code` and says `expected`; its message."""
    no_secret(ran)
    assert "Traceback" not in ran.err, ran.err
    assert (ran.code, ran.out) == (code, ""), ran
    assert ran.err.endswith("\n") and ran.err.count("\n") == 1, ran.err
    line = ran.err.removesuffix("\n")
    if json_output:
        report = json.loads(line)
        assert report == {"error": report["error"], "exit_code": code}, report
        message = str(report["error"])
    else:
        assert line.startswith(prefix), line
        message = line
    assert expected in message, message
    return message


def with_json(name: str) -> list[str]:
    return [*COMMANDS[name], "--json"] if name in JSON_COMMANDS else COMMANDS[name]


# ---- databases, roles and hosts ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def migrated_url(admin_engine: Engine, server_url: str, template_name: str) -> Iterator[str]:
    """One migrated database for the whole module: nothing here may change it."""
    name = f"outbox_hardening_{os.getpid()}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"'))
    yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def no_rights_url(admin_engine: Engine, migrated_url: str) -> Iterator[str]:
    """The migrated database, as a role that may log in and nothing more."""
    role = f"outbox_no_rights_{os.getpid()}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        conn.execute(text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{ROLE_PASSWORD}'"))
    yield make_url(migrated_url).set(username=role, password=ROLE_PASSWORD).render_as_string(hide_password=False)
    with admin_engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"), {"r": role})
        conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))


@pytest.fixture(scope="module")
def closed_url() -> str:
    """A port on 127.0.0.1 that nothing listens on (the kernel refuses at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql://app:{PASSWORD}@127.0.0.1:{port}/app"


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte. It times how long each
    client held its connection before closing it (`held`): the client's own timeout, whatever its process
    took to start."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"postgresql://app:{PASSWORD}@127.0.0.1:{self.port}/app"
        self._open: list[socket.socket] = []
        self._holding: list[threading.Thread] = []
        self.held: list[float] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            if self._stopping:
                client.close()
                return
            self._open.append(client)
            holding = threading.Thread(target=self._hold, args=(client, time.monotonic()), daemon=True)
            self._holding.append(holding)
            holding.start()

    def _hold(self, client: socket.socket, accepted: float) -> None:
        with contextlib.suppress(OSError):
            while client.recv(4096):  # the client's startup packet, then nothing until it closes
                pass
            self.held.append(time.monotonic() - accepted)

    def wait_held(self) -> list[float]:
        """`held`, once every connection accepted so far was closed by its client (at most 10 s each)."""
        for holding in list(self._holding):
            holding.join(10)
        return self.held

    def stop(self) -> None:
        self._stopping = True
        socket.create_connection(("127.0.0.1", self.port)).close()  # wakes the accepting thread
        self._thread.join(10)
        self.wait_held()
        for client in self._open:
            client.close()
        self._listener.close()


@pytest.fixture(scope="module")
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hanging_url(silent_server: SilentServer) -> str:
    return silent_server.url


class TerminatingProxy:
    """A TCP relay on 127.0.0.1 to the test server that, on each of its first `terminations` connections,
    holds the client's first query and has the server terminate that backend (pg_terminate_backend): the
    client then meets the server's own `terminating connection due to administrator command`, as when an
    operator or a failover ends its session. With `hang_ups`, its first connections are closed as soon as they
    are accepted, before any byte, as a restarting server's are. Later connections are relayed as they are."""

    def __init__(self, server_url: str, admin_engine: Engine, terminations: int, hang_ups: int = 0) -> None:
        self._server_url = make_url(server_url)
        self._admin = admin_engine
        self._left = terminations
        self._hang_ups = hang_ups
        self.terminated = 0
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="terminating-proxy", daemon=True).start()

    def url(self, database_url: str) -> str:
        url = make_url(database_url).set(host="127.0.0.1", port=self.port)
        return url.difference_update_query(["host"]).render_as_string(hide_password=False)

    def _server(self) -> socket.socket:
        directory, port = self._server_url.query.get("host"), self._server_url.port or 5432
        if isinstance(directory, str) and directory.startswith("/"):
            unix = socket.socket(socket.AF_UNIX)
            unix.connect(f"{directory}/.s.PGSQL.{port}")
            return unix
        return socket.create_connection((self._server_url.host or "127.0.0.1", port))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            if self._hang_ups > 0:
                self._hang_ups -= 1
                client.close()
                continue
            terminate = self._left > 0
            self._left -= terminate
            threading.Thread(target=self._relay, args=(client, terminate), daemon=True).start()

    def _relay(self, client: socket.socket, terminate: bool) -> None:
        with client, self._server() as server:
            while True:  # refuse encryption; forward the startup message
                head = _read(client, 8)
                length, code = int.from_bytes(head[:4]), int.from_bytes(head[4:])
                if code not in (80877103, 80877104):  # SSLRequest, GSSENCRequest
                    server.sendall(head + _read(client, length - 8))
                    break
                client.sendall(b"N")
            backend: list[int] = []  # the pid the server names in BackendKeyData
            back = threading.Thread(target=self._to_client, args=(server, client, backend), daemon=True)
            back.start()
            try:
                while True:
                    kind, body = _message(client)
                    if terminate and kind in (b"Q", b"P"):
                        with self._admin.connect() as conn:
                            conn.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": backend[0]})
                        self.terminated += 1
                        back.join(10)  # the server's FATAL reaches the client, then it closes
                        return
                    server.sendall(kind + (len(body) + 4).to_bytes(4) + body)
            except OSError:  # the client hung up, or the server did and _to_client closed the client
                return

    @staticmethod
    def _to_client(server: socket.socket, client: socket.socket, backend: list[int]) -> None:
        try:
            while True:
                kind, body = _message(server)
                if kind == b"K":
                    backend.append(int.from_bytes(body[:4]))
                client.sendall(kind + (len(body) + 4).to_bytes(4) + body)
        except (ConnectionError, OSError):
            client.close()

    def stop(self) -> None:
        self._listener.close()


def _read(source: socket.socket, size: int) -> bytes:
    data = source.recv(size, socket.MSG_WAITALL) if size else b""
    if len(data) < size:
        raise ConnectionError("closed")
    return data


def _message(source: socket.socket) -> tuple[bytes, bytes]:
    """One protocol message after the startup: its type byte and its body."""
    head = _read(source, 5)
    return head[:1], _read(source, int.from_bytes(head[1:]) - 4)


HOSTILE_LANE = "lane\x1b]0;owned\x07\x1b[2J\r\nforged | row\u2028next\x9b31m\x7f"
HOSTILE_KEY = "key\x1b[H\x1b[2J\n"
RAW = ["\x1b", "\x07", "\r", "\u2028", "\x9b", "\x7f"]


@pytest.fixture(scope="module")
def hostile_action(migrated_url: str) -> int:
    """An action whose lane and idempotency keys hold escape sequences, CR/LF and separators."""
    engine = create_engine(migrated_url)
    with engine.begin() as conn:
        action_id = conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload, max_attempts,"
                " state, attempt, epoch) VALUES ('TEST_NOOP', 1, :lane, :key, CAST(:payload AS jsonb), 5,"
                " 'ADMITTED', 0, 0) RETURNING id"
            ),
            {"lane": HOSTILE_LANE, "key": HOSTILE_KEY, "payload": json.dumps({"note": HOSTILE_KEY})},
        ).scalar_one()
    engine.dispose()
    return int(action_id)


# ---- bad values, refused before anything connects ----------------------------------------------------

NOT_INTEGERS = ["abc", "1e20", "", "nan", "0x10"]
OUT_OF_RANGE = ["99999999999999999999", "-5"]
INTEGER_OPTIONS = [
    ("lanes", "--top"),
    ("list", "--limit"),
    ("list", "--before-id"),
    ("purge", "--batch-size"),
    ("run", "--concurrency"),
    ("run", "--claim-batch"),
    ("run", "--max-actions"),
    ("metrics serve", "--port"),
]
ID_COMMANDS = ["show", "admit", "refuse", "cancel", "erase-account"]
FLOAT_OPTIONS = [("run", "--lease-seconds"), ("run", "--max-seconds"), ("metrics serve", "--cache-seconds")]
BAD_FLOATS = [
    ("nan", "nan is not a finite number"),
    ("inf", "is not in the range"),
    ("-1", "is not in the range"),
    ("1e20", "is not in the range"),
    ("abc", "is not a valid float"),
    ("", "is not a valid float"),
]
BAD_DURATIONS = [
    ("99999999999d", "more than 100 years"),
    ("800000d", "more than 100 years"),
    ("9999999d", "more than 100 years"),
    ("36501d", "more than 100 years"),
    ("1" + "0" * 40 + "s", "is not a duration"),
    ("-1d", "is not a duration"),
    ("", "is not a duration"),
    ("nan", "is not a duration"),
    ("1e20d", "is not a duration"),
    ("3 weeks", "is not a duration"),
    ("\u0663d", "is not a duration"),  # an Arabic-Indic digit three
]

BAD_ARGUMENTS: list[tuple[str, list[str], str]] = [
    *[
        (name, [*COMMANDS[name], option, value], "is not a valid")
        for name, option in INTEGER_OPTIONS
        for value in NOT_INTEGERS
    ],
    *[
        (name, [*COMMANDS[name], option, value], "is not in the range")
        for name, option in INTEGER_OPTIONS
        for value in OUT_OF_RANGE
    ],
    ("lanes", ["lanes", "--top", "99999999999"], "is not in the range"),
    ("list", ["list", "--limit", "1001"], "is not in the range"),
    ("purge", ["purge", "--batch-size", "99999999999"], "is not in the range"),
    ("run", ["run", "--concurrency", "99999999999"], "is not in the range"),
    ("metrics serve", ["metrics", "serve", "--port", "65536"], "is not in the range"),
    *[(name, [name, value], "is not a valid") for name in ID_COMMANDS for value in NOT_INTEGERS],
    *[(name, [name, "99999999999999999999"], "is not in the range") for name in ID_COMMANDS],
    *[(name, [name, "0"], "is not in the range") for name in ID_COMMANDS],
    *[(name, [name, "-5"], "No such option: -5") for name in ID_COMMANDS],
    *[(name, [*COMMANDS[name], option, value], said) for name, option in FLOAT_OPTIONS for value, said in BAD_FLOATS],
    ("run", ["run", "--lease-seconds", "30"], "--lease-seconds must exceed the 60 s write window, not 30"),
    *[
        (name, [name, option, value], said)
        for name, option in [("list", "--since"), ("purge", "--older-than")]
        for value, said in BAD_DURATIONS
    ],
    ("list", ["list", "--state", ""], "--state: unknown state ''"),
    ("list", ["list", "--state", "DONEISH"], "--state: unknown state 'DONEISH'"),
    ("list", ["list", "--state", "\x1b[2J"], "--state: unknown state '\\x1b[2J'"),
    ("list", ["list", "--kind", "\x1b]0;x\x07"], "--kind: unknown action kind '\\x1b]0;X\\x07'"),
    ("run", ["run", "--adapters", ""], "--adapters must look like module:factory"),
    ("run", ["run", "--adapters", "no_such_module_here:factory"], "No module named 'no_such_module_here'"),
    ("metrics serve", ["metrics", "serve", "--host", ""], "--host must name an address"),
    ("metrics serve", ["metrics", "serve", "--host", "no-such-host.invalid"], "cannot listen on no-such-host"),
    ("db upgrade", ["db", "upgrade", ""], "REVISION: '' is not a revision"),
    ("db upgrade", ["db", "upgrade", "@"], "REVISION: '@' is not a revision"),
    ("db upgrade", ["db", "upgrade", "nosuchrev"], "Can't locate revision identified by 'nosuchrev'"),
    ("db upgrade", ["db", "upgrade", "--sql", "a:b:c"], "is not a revision (head, base, 0002, -1) or FROM:TO"),
    ("db downgrade", ["db", "downgrade", ""], "REVISION: '' is not a revision"),
    ("db downgrade", ["db", "downgrade", "x@y"], "REVISION: 'x@y' is not a revision"),
    # the options every command that connects shares
    *[(name, [*COMMANDS[name], "--connect-timeout", "1"], "is not in the range 2<=x<=3600") for name in COMMANDS],
    *[(name, [*COMMANDS[name], "--statement-timeout", "nan"], "nan is not a finite number") for name in COMMANDS],
    *[(name, [*COMMANDS[name], "--bogus"], "No such option: --bogus") for name in COMMANDS],
]


@pytest.mark.parametrize(("name", "args", "expected"), BAD_ARGUMENTS, ids=[" ".join(a) for _, a, _ in BAD_ARGUMENTS])
def test_a_bad_value_is_one_line_and_exit_2(
    migrated_url: str, hostile_action: int, name: str, args: list[str], expected: str
) -> None:
    ran = outbox(*args, url=migrated_url)
    failed(ran, 2, expected)
    assert ran.seconds < MARGIN, ran.seconds


@pytest.mark.parametrize("name", list(COMMANDS))
def test_bad_timeouts_in_the_environment_are_one_line(migrated_url: str, name: str) -> None:
    ran = outbox(*COMMANDS[name], url=migrated_url, env={"OUTBOX_CONNECT_TIMEOUT_SECONDS": "ten"})
    failed(ran, 2, "Invalid value for '--connect-timeout' (env var: 'OUTBOX_CONNECT_TIMEOUT_SECONDS')")
    if name not in MIGRATIONS:  # a migration takes its statement timeout from --statement-timeout only
        ran = outbox(*COMMANDS[name], url=migrated_url, env={"OUTBOX_STATEMENT_TIMEOUT_SECONDS": "inf"})
        failed(ran, 2, "Invalid value for '--statement-timeout'")


@pytest.mark.parametrize("name", sorted(JSON_COMMANDS))
def test_with_json_a_bad_value_is_one_json_object(migrated_url: str, name: str) -> None:
    ran = outbox(*COMMANDS[name], "--json", "--connect-timeout", "abc", url=migrated_url)
    assert "'abc' is not a valid" in failed(ran, 2, "--connect-timeout", json_output=True)


# ---- URLs that cannot be used, and the password they hold ----------------------------------------------

BAD_URLS = [
    ("not a url", "the database URL is not a URL"),
    (f"mysql://app:{PASSWORD}@db/app", "outbox needs PostgreSQL, not 'mysql' (mysql://app:***@db/app)"),
]


@pytest.mark.parametrize("name", list(COMMANDS))
@pytest.mark.parametrize(("url", "expected"), BAD_URLS, ids=["not-a-url", "mysql"])
def test_a_url_that_cannot_be_used_is_one_line_without_its_password(name: str, url: str, expected: str) -> None:
    failed(outbox(*COMMANDS[name], url=url), 2, expected)


def test_the_password_stays_hidden_however_the_url_holds_it(closed_url: str) -> None:
    port = make_url(closed_url).port
    for url, code in [
        ("   ", 2),
        (f"postgresql://app:{PASSWORD}@db:port/app", 2),
        (f"postgresql://app@127.0.0.1:{port}/app?password={PASSWORD}", 1),
        (f"postgresql://app:{PASSWORD}@127.0.0.1:{port}/app?no_such_parameter=1", 2),
        (f"mysql://app@db/app?password={PASSWORD}", 2),
        (f"postgresql://app:{PASSWORD}@[::1/app", 2),
        (f"postgresql://app:{PASSWORD}@127.0.0.1:99999/app", 2),
        (f"postgresql://app:{PASSWORD}@db:{PASSWORD}/app", 2),
    ]:
        failed(outbox("status", url=url), code, "")
    ran = outbox("status", "--database-url", f"mysql://app:{PASSWORD}@db/app", url=None)
    failed(ran, 2, "outbox needs PostgreSQL")


# ---- a database that cannot serve the command ------------------------------------------------------------


@pytest.mark.parametrize("name", DATABASE_COMMANDS)
def test_a_closed_port_is_one_line_and_exit_1(closed_url: str, name: str) -> None:
    as_json = name in JSON_COMMANDS
    ran = outbox(*with_json(name), url=closed_url)
    failed(ran, 1, "cannot connect to the database: ", json_output=as_json)
    assert ran.seconds < CONNECT_TIMEOUT + MARGIN, ran.seconds


@pytest.fixture(scope="module")
def hanging_runs() -> dict[str, tuple[Ran, list[float]]]:
    """Every command against a silent host of its own, four at a time (each waits on its host, not the
    processor): how it ended, and how long it held each connection it made."""

    def against_a_silent_host(name: str) -> tuple[Ran, list[float]]:
        server = SilentServer()
        try:
            ran = outbox(*COMMANDS[name], url=server.url)
        finally:
            server.stop()
        return ran, server.held

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(DATABASE_COMMANDS, pool.map(against_a_silent_host, DATABASE_COMMANDS), strict=True))


@pytest.mark.parametrize("name", DATABASE_COMMANDS)
def test_a_host_that_never_answers_is_one_line_within_the_connect_timeout(
    hanging_runs: dict[str, tuple[Ran, list[float]]], name: str
) -> None:
    ran, held = hanging_runs[name]
    failed(ran, 1, "cannot connect to the database: connection timeout expired")
    # one connection, given up after the connect timeout: timed by the host, so a process slow to start on a
    # busy machine does not count
    assert len(held) == 1 and CONNECT_TIMEOUT - 0.5 < held[0] < CONNECT_TIMEOUT + 1.0, held
    assert ran.seconds < CONNECT_TIMEOUT + 4 * MARGIN, ran.seconds  # and the command ended with it


def test_the_connect_timeout_option_wins_over_the_variable(silent_server: SilentServer) -> None:
    silent_server.held.clear()
    url = silent_server.url
    ran = outbox("status", "--connect-timeout", "2", url=url, env={"OUTBOX_CONNECT_TIMEOUT_SECONDS": "3600"})
    failed(ran, 1, "cannot connect to the database: connection timeout expired")
    held = silent_server.wait_held()
    assert len(held) == 1 and CONNECT_TIMEOUT - 0.5 < held[0] < CONNECT_TIMEOUT + 1.0, held


@pytest.mark.parametrize("name", DATABASE_COMMANDS)
def test_a_database_never_migrated(empty_database_url: str, name: str) -> None:
    ran = outbox(*COMMANDS[name], url=empty_database_url)
    if name == "db upgrade":  # what it is for
        assert (ran.code, ran.err) == (0, f"outbox schema at revision {_head()}\n"), ran
    elif name == "db downgrade":  # at base already
        assert (ran.code, ran.err) == (0, "outbox schema at revision base (none)\n"), ran
    elif name == "db current":
        assert (ran.code, ran.out) == (0, f"none (never migrated; the newest is {_head()})\n"), ran
    elif name == "db check":
        failed(ran, 1, "run `outbox db upgrade`", prefix="outbox schema at none")
    else:
        failed(ran, 1, "the database has no outbox schema: run `outbox db upgrade` first")


def _head() -> str:
    from outbox import migrate

    return migrate.head()


@pytest.mark.parametrize("name", ["lanes", "show", "list", "erase-account"])
def test_a_schema_that_does_not_match_this_release_is_one_line_and_exit_1(engine: Engine, name: str) -> None:
    with engine.begin() as conn:
        # the account's action, so that its erasure passes its lane on (which names the column)
        conn.execute(
            text(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                " subject_account_id, max_attempts, state)"
                " VALUES ('EMAIL', NULL, 'account:1', 'email:mismatch:1', '{}', 1, 3, 'ADMITTED')"
            )
        )
        # what a schema behind the release, or altered by hand, looks like
        conn.execute(text("ALTER TABLE agent_action RENAME COLUMN lane_key TO lane"))
    ran = outbox(*COMMANDS[name], url=engine.url.render_as_string(hide_password=False))
    # the erasure's statement names no lane column: the trigger that passes the erased holder's lane on does
    missing = 'record "old" has no field "lane_key"' if name == "erase-account" else 'column "lane_key" does not exist'
    failed(ran, 1, f"the database's outbox schema does not match this release ({missing})")


@pytest.mark.parametrize("name", DATABASE_COMMANDS)
def test_a_role_without_rights_is_one_line_and_exit_1(no_rights_url: str, name: str) -> None:
    as_json = name in JSON_COMMANDS
    ran = outbox(*with_json(name), url=no_rights_url)
    failed(ran, 1, "the database role lacks a privilege: permission denied", json_output=as_json)


# ---- `metrics serve`: up with its database down, and says so ----------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("database", ["closed", "hanging", "never migrated", "no rights"])
def test_metrics_serve_reports_a_database_it_cannot_read(request: pytest.FixtureRequest, database: str) -> None:
    fixture = {
        "closed": "closed_url",
        "hanging": "hanging_url",
        "never migrated": "empty_database_url",
        "no rights": "no_rights_url",
    }
    url: str = request.getfixturevalue(fixture[database])
    port = free_port()
    environ = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOX_")}
    environ |= {"OUTBOX_DATABASE_URL": url, "OUTBOX_CONNECT_TIMEOUT_SECONDS": str(CONNECT_TIMEOUT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "metrics", "serve", "--port", str(port), "--cache-seconds", "0"],
        env=environ,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        said = server.stderr.readline()  # printed once the address is checked, just before it binds
        assert said.startswith(f"serving outbox metrics on http://127.0.0.1:{port}/"), said
        until(lambda: _listening(port), 30, "the exporter to listen")
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            exposition = response.read().decode()
        assert time.monotonic() - started < CONNECT_TIMEOUT + MARGIN
        assert "\noutbox_exporter_up 0.0\n" in exposition
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
    ran = Ran(server.returncode, out, said + err, 0.0)
    no_secret(ran)
    assert (ran.code, ran.out) == (0, ""), ran
    assert "Traceback" not in ran.err, ran.err


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


def test_metrics_serve_on_a_port_in_use_is_one_line(migrated_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        ran = outbox("metrics", "serve", "--port", str(port), url=migrated_url)
    failed(ran, 2, f"cannot listen on 127.0.0.1:{port}: Address already in use")


# ---- what the database holds never steers the terminal ---------------------------------------------------


@pytest.mark.parametrize("args", [["list"], ["lanes"], ["show"], ["status"]], ids=" ".join)
def test_a_lane_key_with_escape_sequences_is_printed_escaped(
    migrated_url: str, hostile_action: int, args: list[str]
) -> None:
    if args == ["show"]:
        args = ["show", str(hostile_action)]
    ran = outbox(*args, url=migrated_url, env={"COLUMNS": "400"})
    assert (ran.code, ran.err) == (0, ""), ran
    for raw in RAW:
        assert raw not in ran.out, (raw, ran.out)
    assert not any(line.lstrip("│┃ ").startswith("forged") for line in ran.out.splitlines()), ran.out
    if args[0] in ("list", "lanes", "show"):
        assert "lane\\x1b]0;owned\\x07\\x1b[2J\\r\\nforged | row\\u2028next\\x9b31m\\x7f" in ran.out, ran.out
    if args[0] == "show":
        assert "key\\x1b[H\\x1b[2J\\n" in ran.out, ran.out


@pytest.mark.parametrize("args", [["list"], ["lanes"], ["show"]], ids=" ".join)
def test_with_json_the_keys_are_exact_and_the_output_ascii(
    migrated_url: str, hostile_action: int, args: list[str]
) -> None:
    if args == ["show"]:
        args = ["show", str(hostile_action)]
    ran = outbox(*args, "--json", url=migrated_url)
    assert (ran.code, ran.err) == (0, ""), ran
    assert ran.out.isascii()
    shown = json.loads(ran.out)
    lanes = {
        "list": lambda: [action["lane_key"] for action in shown["actions"]],
        "lanes": lambda: [lane["lane_key"] for lane in shown["deepest"]],
        "show": lambda: [shown["lane_key"]],
    }[args[0]]()
    assert HOSTILE_LANE in lanes
    if args[0] == "show":
        assert shown["idempotency_key"] == HOSTILE_KEY


def test_a_statement_that_waits_past_the_statement_timeout_is_one_line(migrated_url: str, hostile_action: int) -> None:
    engine = create_engine(migrated_url)
    try:
        with engine.begin() as holder:  # another session holds the action's row
            holder.execute(text("SELECT id FROM agent_action WHERE id = :id FOR UPDATE"), {"id": hostile_action})
            ran = outbox("cancel", str(hostile_action), "--statement-timeout", "1", url=migrated_url)
    finally:
        engine.dispose()
    failed(ran, 1, "the database cancelled a statement (canceling statement due to statement timeout)")
    assert 1 < ran.seconds < 1 + MARGIN, ran.seconds


# ---- a database that ends the first sessions of `outbox run` -------------------------------------------


def run_ending_sessions(admin_engine: Engine, server_url: str, migrated_url: str, terminations: int) -> tuple[Ran, int]:
    """`outbox run` through a relay that has the server terminate its first `terminations` sessions; what it
    did, and how many sessions the server ended."""
    proxy = TerminatingProxy(server_url, admin_engine, terminations)
    try:
        return outbox("run", "--max-seconds", "0", url=proxy.url(migrated_url)), proxy.terminated
    finally:
        proxy.stop()


def test_run_asks_again_when_the_database_ends_its_first_sessions(
    admin_engine: Engine, server_url: str, migrated_url: str
) -> None:
    ran, terminated = run_ending_sessions(admin_engine, server_url, migrated_url, terminations=2)
    assert terminated == 2
    assert ran.code == 0, ran
    waits = [line for line in ran.err.splitlines() if "the database ended the session" in line]
    assert len(waits) == 1 and "terminating connection due to administrator command" in waits[0], ran.err


def test_run_asks_again_when_the_server_closes_its_first_connections_as_it_accepts_them(
    admin_engine: Engine, server_url: str, migrated_url: str
) -> None:
    """A server restarting accepts a connection and closes it before it answers: `outbox run` starting then
    asks again instead of exiting."""
    proxy = TerminatingProxy(server_url, admin_engine, terminations=0, hang_ups=2)
    try:
        ran = outbox("run", "--max-seconds", "0", url=proxy.url(migrated_url))
    finally:
        proxy.stop()
    assert ran.code == 0, ran
    waits = [line for line in ran.err.splitlines() if "the database ended the session" in line]
    assert len(waits) == 1 and "server closed the connection unexpectedly" in waits[0], ran.err


def test_run_gives_up_on_a_database_that_ends_every_session_after_a_minute(
    admin_engine: Engine, server_url: str, migrated_url: str
) -> None:
    ran, terminated = run_ending_sessions(admin_engine, server_url, migrated_url, terminations=1_000_000)
    assert ran.code == 1 and ran.out == "" and "Traceback" not in ran.err, ran
    assert ran.err.splitlines()[-1].startswith("error: the database failed: terminating connection"), ran.err
    assert terminated >= 2
    # longer than the connect timeout: a restart, a failover or a pooler's login retry of 15 s passes first
    assert START_ASK_SECONDS - 0.5 < ran.seconds < START_ASK_SECONDS + MARGIN, ran.seconds
