"""`outbox demo` itself, as the README's first command runs it: an embedded PostgreSQL, the SMTP sink, the
local Slack, GitHub and GitLab APIs, the Prefect server, deployments, the exporter and workers; a small
workload; what a visitor reads of it, sent to a pipe: the lines while it works, the database it prints and the
command that reads it, a summary whose figures add up against that database, the posts as the local APIs'
stores (their journals) hold them and as `outbox show` gives them, and the logs the demo's processes wrote."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import IO, Any

import psutil
from sqlalchemy import text

from demo.postgres import embedded_postgres_server, fresh_database
from outbox.db import sync_engine
from outbox.github import marker as github_marker
from outbox.gitlab import marker as gitlab_marker
from outbox.slack import message_marker

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
ACTIONS = 60
PROBE = 100
# the alert's posts: a Slack message and its reply, a pull request's comment and a feedback issue, a GitLab note
POSTS = 5
POST_KINDS = ("SLACK_MESSAGE", "GITHUB_POST", "GITLAB_POST")
# the border characters of rich's tables: a line starting with one is a line of a table
TABLE_LINE = re.compile(r"^[┏┃┡│├└┌]")


class Lines:
    """The lines a process writes, each with the moment it arrived, read by a thread of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self.arrived: list[tuple[float, str]] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.arrived.append((time.monotonic(), line.rstrip("\n")))
            self._new.put(line)
        self._new.put(None)

    def wait_for(self, marker: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            line = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, "the demo ended before printing " + repr(marker) + "\n" + self.text()[-4000:]
            if marker in line:
                return

    def text(self) -> str:
        return "\n".join(line for _, line in self.arrived)

    def when(self, text: str) -> float:
        """When the first line holding `text` arrived."""
        return next(at for at, line in self.arrived if text in line)


EARLIER_LOG_LINE = "a line an earlier demo's worker wrote"


def leave_an_earlier_run(data: Path) -> None:
    """What an earlier demo left in its database `outbox` (a table) and in its logs (a line): the next run
    must find neither."""
    server = embedded_postgres_server(data)
    engine = sync_engine(fresh_database(server, "outbox"))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE earlier_run (id int)"))
    engine.dispose()
    server.cleanup()  # stops the server, keeps its data
    (data / "demo").mkdir()
    (data / "demo" / "worker-1.log").write_text(EARLIER_LOG_LINE + "\n")


def test_the_demo_prints_its_database_and_figures_that_add_up_against_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    leave_an_earlier_run(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PREFECT_", "XDG_RUNTIME_DIR"))}
    env.pop("COLUMNS", None)  # a pipe: rich's 80 columns
    env.update({"OUTBOX_DATA_DIR": str(data), "PYTHONPATH": str(ROOT)})
    command = ["demo", "--actions", str(ACTIONS), "--lanes", "10", "--workers", str(WORKERS), "--timeout", "400"]
    demo = subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", *command, "--keep-running"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as in a terminal, even when the tests run in a background job, whose shell ignores SIGINT
        # for every process it starts (Python then keeps ignoring it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert demo.stdout is not None
    lines = Lines(demo.stdout)
    try:
        lines.wait_for("--keep-running: the stack stays up", timeout=600)
        url = lines.text().partition("outbox's database: ")[2].partition("\n")[0]
        check_the_command_it_prints(lines.text(), url, env)
        check_the_posts(lines.text(), url, env, data / "demo")
        check_the_figures_against_the_database(lines.text(), url)
        check_the_alert_rules(lines.text())
        tokens = demo_tokens(demo.pid)
    finally:
        demo.send_signal(signal.SIGINT)  # Ctrl-C
        demo.wait(300)
    output = lines.text()
    assert demo.returncode == 0, output[-4000:]
    assert "RuntimeDirWarning" not in output and "XDG_RUNTIME_DIR" not in output, output[:2000]
    assert "Traceback" not in output, output[-4000:]  # nothing of the demo's own fails as it stops either

    # the backlog is there, due, before any executor runs; the unsubscribed share is the one that ended so
    assert lines.when("backlog: actions enqueued") < lines.when(f"{WORKERS} executors claiming: the first"), output
    unsubscribed = re.search(r"(\d+) of the (\d+) alert emails will end CANCELLED / NOT_WANTED$", output, re.M)
    ended_as = outcomes(output)
    not_wanted = sum(n for part, _, _, reason, n in ended_as if part == "backlog" and reason == "NOT_WANTED")
    emails = sum(n for part, kind, _, _, n in ended_as if part == "backlog" and kind == "EMAIL")
    assert unsubscribed and (int(unsubscribed[1]), int(unsubscribed[2])) == (not_wanted, emails), output

    # how every drain run ended, after the stack stopped: each one's page, Completed
    ended = output.partition("drain runs, as they ended")[2].splitlines()[1:]
    finals = [line for line in ended if line.startswith("  ")]
    assert len(finals) >= WORKERS and all(re.fullmatch(r"  .+: Completed, queue [\w-]+", n) for n in finals), finals
    for n in range(1, WORKERS + 1):
        assert any(line.startswith(f"  outbox-worker-{n} ") for line in finals), finals

    # it showed its progress as it went: the stack's start long before the summary, and what the runs did
    assert lines.when("every action of this run") - lines.when("starting the local stack") > 10, output[:3000]
    assert re.search(r"^drain runs: .*; \d+ s so far$", output, re.MULTILINE), output[:3000]
    assert re.search(r"^the Prefect server .*; \d+ s so far$", output, re.MULTILINE), output[:3000]

    # the summary, sent to a pipe: every row on one line, within 80 columns
    table = [line for line in output.splitlines() if TABLE_LINE.match(line)]
    assert len(table) > 20 and max(len(line) for line in table) <= 80, "\n".join(table)
    assert all(cells[0] for cells in map(cells_of, table) if cells), "\n".join(table)

    # no log of the demo's processes holds a traceback, the stop on Ctrl-C included
    workdir = data / "demo"
    for n in range(1, WORKERS + 1):
        assert f"Beginning flow run 'outbox-worker-{n} " in (workdir / f"worker-{n}.log").read_text()
    logs = [*workdir.glob("*.log"), data / "pg" / "log"]
    assert {log.name for log in logs} >= {"prefect-server.log", "exporter.log", "worker-1.log", "log"}
    with_traceback = [log.name for log in logs if "Traceback" in log.read_text(errors="replace")]
    assert not with_traceback, with_traceback
    # the tokens the demo made for its local APIs are in no line it printed and no log
    for token in tokens:
        assert token not in output
        assert not [log.name for log in logs if token in log.read_text(errors="replace")], logs
    assert EARLIER_LOG_LINE not in (workdir / "worker-1.log").read_text()
    live_lines = [
        line for n in range(1, WORKERS + 1) for line in (workdir / f"worker-{n}.log").read_text().splitlines()
    ]
    assert not any("waiting behind lane heads -" in line for line in live_lines), live_lines


def check_the_command_it_prints(output: str, url: str, env: dict[str, str]) -> None:
    """The printed command reads the printed database; it holds this run's actions only, none unended."""
    assert url.startswith("postgresql://postgres@/outbox?host="), output[:2000]
    assert "made empty for this run" in output
    printed = output.partition("look at it while the demo runs: ")[2].partition("\n")[0]
    assert shlex.split(printed)[1:] == ["status", "--database-url", url], printed
    status = subprocess.run(  # as printed: `outbox` runs here, on PATH or not
        [*shlex.split(printed), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    figures = json.loads(status.stdout)
    assert figures["unended"] == [] and figures["due"] == 0, figures
    uncertain = {(row["kind"], row["stop_reason"]): row["actions"] for row in figures["uncertain"]}
    in_the_table = Counter[tuple[str, str]]()
    for _, kind, state, reason, count in outcomes(output):
        if state == "UNCERTAIN":
            in_the_table[(kind, reason)] += count
    assert uncertain == dict(in_the_table), (uncertain, in_the_table)


def check_the_alert_rules(output: str) -> None:
    """The demo's Prometheus scrapes its exporter and loaded the shipped rules; without `prometheus` installed,
    the command printed starts one that would: its configuration names the demo's exporter and those rules."""
    metrics = output.partition("metrics:    ")[2].partition("\n")[0]
    exporter = urllib.parse.urlsplit(metrics).netloc
    if shutil.which("prometheus") is None:
        command = output.partition("alert rules evaluate against this demo: ")[2].partition("\n")[0]
        config = json.loads(Path(shlex.split(command)[1].partition("=")[2]).read_text())
        assert config["scrape_configs"][0]["static_configs"][0]["targets"] == [exporter], config
        assert Path(config["rule_files"][0]).samefile(ROOT / "deploy" / "prometheus" / "outbox-rules.yml"), config
        return
    alerts = output.partition("alerts:     ")[2].partition("\n")[0]
    prometheus = alerts.removesuffix("/alerts")
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as answer:
        groups = json.load(answer)["data"]["groups"]
    assert any(rule["name"] == "OutboxExecutorsDown" for group in groups for rule in group["rules"]), groups
    with urllib.request.urlopen(f"{prometheus}/api/v1/targets", timeout=10) as answer:
        targets = json.load(answer)["data"]["activeTargets"]
    assert [target["discoveredLabels"]["__address__"] for target in targets] == [exporter], targets


def check_the_figures_against_the_database(output: str, url: str) -> None:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT to_regclass('earlier_run')")).scalar_one() is None
            held = conn.execute(
                text("SELECT kind, state, coalesce(stop_reason, ''), count(*) FROM agent_action GROUP BY 1, 2, 3")
            ).all()
            # the backlog's ids come first, the posts' and the probe's after: the database held nothing before
            by_part = conn.execute(
                text("""
                SELECT CASE WHEN id <= (SELECT min(id) + :backlog - 1 FROM agent_action) THEN 1
                            WHEN kind = ANY (:posts) THEN 2 ELSE 3 END,
                       count(*),
                       count(*) FILTER (WHERE write_started_at IS NOT NULL AND attempt = 1),
                       count(*) FILTER (WHERE write_started_at IS NOT NULL AND attempt > 1)
                  FROM agent_action GROUP BY 1 ORDER BY 1"""),
                {"backlog": ACTIONS, "posts": list(POST_KINDS)},
            ).all()
            drained = conn.execute(
                text("""
                SELECT extract(epoch FROM max(ended_at) - min(write_started_at))::float8 FROM agent_action
                 WHERE id <= (SELECT min(id) + :backlog - 1 FROM agent_action)"""),
                {"backlog": ACTIONS},
            ).scalar_one()
    finally:
        engine.dispose()
    table = outcomes(output)
    summed = Counter[tuple[str, str, str]]()
    for _, kind, state, reason, count in table:
        summed[(kind, state, reason)] += count
    assert {(kind, state, reason): n for kind, state, reason, n in held} == dict(summed), (held, table)
    (_, backlog, backlog_first, backlog_later), (_, posts, _, _), (_, probe, probe_first, probe_later) = by_part
    assert (backlog, posts, probe) == (ACTIONS, POSTS, PROBE), by_part
    rows = figure_rows(output)

    # the waits say over which actions they are measured, and why the others are not counted
    unfenced = backlog - backlog_first - backlog_later
    over = f"{backlog_first + backlog_later} of {ACTIONS}" + (f": {unfenced} ended before a fence" if unfenced else "")
    assert rows["backlog wait p50/p95/p99"][1] == over, rows
    retried = f"; {probe_later} retried" if probe_later else ""
    assert rows["pickup p50/p95/p99 (20/s)"][1] == f"{probe_first} of {PROBE}: first attempts{retried}", rows
    pickup = re.fullmatch(r"([\d,.]+) / ([\d,.]+) / ([\d,.]+) ms", rows["pickup p50/p95/p99 (20/s)"][0])
    assert pickup and float(pickup[1].replace(",", "")) < 2000, rows  # generous on a shared 2-core machine

    # the backlog's throughput: from its first fence to its last end, on the database clock
    assert f"{drained:.1f}" in rows["backlog throughput"][0], (drained, rows)
    assert re.fullmatch(rf"[\d,]+ actions/s: {ACTIONS} in [\d.]+ s", rows["backlog throughput"][0]), rows

    # every effect at its provider against the actions' outcomes
    emails = {
        state: sum(n for _, kind, s, _, n in table if kind == "EMAIL" and s == state) for state in ("DONE", "UNCERTAIN")
    }
    assert rows["messages at the sink"][0] == (
        f"{emails['DONE'] + emails['UNCERTAIN']}: {emails['DONE']} DONE + {emails['UNCERTAIN']} UNCERTAIN"
    ), rows
    assert rows["duplicates at the sink"] == ["0"], rows
    webhooks = re.fullmatch(r"(\d+) from (\d+) deliveries \((\d+) repeats\)", rows["webhook effects"][0])
    assert webhooks and int(webhooks[1]) == summed[("WEBHOOK", "DONE", "CONFIRMED")] == ACTIONS // 3, rows
    assert int(webhooks[2]) - int(webhooks[1]) == int(webhooks[3]), rows
    events = summed[("NATS_EVENT", "DONE", "CONFIRMED")]
    assert events == ACTIONS // 3 and rows["events in the stream"] == [f"{events} ({events} distinct Nats-Msg-Id)"]
    servers = "Prefect UI, metrics, mailbox" + (", Prometheus" if shutil.which("prometheus") else "")
    assert rows["servers up (URLs below)"] == [servers], rows
    assert rows["posts at the local APIs"] == ["Slack 2, GitHub 2, GitLab 1: 5 DONE"], rows


def check_the_posts(output: str, url: str, env: dict[str, str], workdir: Path) -> None:
    """Each post is DONE and stored once by its local API (read from the API's journal, found by its action's
    marker), where the demo says: the reply in the thread of the first message, the comment on acme/web#42, the
    issue in acme/feedback, the note on acme/shop!12; `outbox show` gives each one's channel and ts, or its
    URL, and the summary's line for it says the same."""
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            made = conn.execute(
                text("SELECT id, kind, idempotency_key FROM agent_action WHERE kind = ANY (:kinds) ORDER BY id"),
                {"kinds": list(POST_KINDS)},
            ).all()
    finally:
        engine.dispose()
    shown = {id_: show(id_, url, env) for id_, _, _ in made}
    assert [action["state"] for action in shown.values()] == ["DONE"] * POSTS, shown
    ids = {kind: [(id_, key) for id_, k, key in made if k == kind] for kind in POST_KINDS}
    (message, message_key), (reply, reply_key) = ids["SLACK_MESSAGE"]
    (comment, comment_key), (issue, issue_key) = ids["GITHUB_POST"]
    [(note, note_key)] = ids["GITLAB_POST"]
    lines = dict(
        re.findall(r"^  (Slack message|Slack reply|PR comment|feedback issue|GitLab note) +(.*)$", output, re.M)
    )

    channels = json.loads((workdir / "slack.json").read_text())
    assert list(channels) == ["C0ALERTS01"], channels
    stored = {m["metadata"]["event_payload"]["key"]: m for m in channels["C0ALERTS01"]}
    assert len(stored) == len(channels["C0ALERTS01"]) == 2, channels  # each message once
    first, second = stored[message_marker(message_key)], stored[message_marker(reply_key)]
    assert "thread_ts" not in first and second["thread_ts"] == first["ts"], channels
    assert shown[message]["readback_ref"] == f"channel=C0ALERTS01 ts={first['ts']}", shown
    assert shown[reply]["readback_ref"] == f"channel=C0ALERTS01 ts={second['ts']}", shown
    assert lines["Slack message"] == f"action {message}, DONE: channel C0ALERTS01, ts {first['ts']}", lines
    assert lines["Slack reply"] == (
        f"action {reply}, DONE: channel C0ALERTS01, ts {second['ts']}, in the thread of {first['ts']}"
    ), lines

    github = [json.loads(line) for line in (workdir / "github.jsonl").read_text().splitlines()]
    [on_pull] = [p for p in github if p["body"].endswith(github_marker(comment_key))]
    [opened] = [p for p in github if p["body"].endswith(github_marker(issue_key))]
    assert len(github) == 2 and (on_pull["kind"], on_pull["repo"], on_pull["number"]) == ("comment", "acme/web", 42)
    assert (opened["kind"], opened["repo"]) == ("issue", "acme/feedback"), github
    assert shown[comment]["readback_ref"] == f"https://github.com/acme/web/pull/42#issuecomment-{on_pull['id']}"
    assert shown[issue]["readback_ref"] == f"https://github.com/acme/feedback/issues/{opened['number']}", shown
    assert lines["PR comment"] == f"action {comment}, DONE: {shown[comment]['readback_ref']}", lines
    assert lines["feedback issue"] == f"action {issue}, DONE: {shown[issue]['readback_ref']}", lines

    [on_merge_request] = [json.loads(line) for line in (workdir / "gitlab.jsonl").read_text().splitlines()]
    where = {name: on_merge_request[name] for name in ("kind", "project", "target", "iid", "markers")}
    assert where == {
        "kind": "notes",
        "project": "acme/shop",
        "target": "merge_requests",
        "iid": "12",
        "markers": [gitlab_marker(note_key)],
    }, on_merge_request
    made_note = on_merge_request["made"]["id"]
    assert re.fullmatch(
        rf"http://127\.0\.0\.1:\d+/acme/shop/-/merge_requests/12#note_{made_note}", shown[note]["readback_ref"]
    ), shown[note]
    assert lines["GitLab note"] == f"action {note}, DONE: note {made_note} on acme/shop!12", lines


def show(action_id: int, url: str, env: dict[str, str]) -> dict[str, Any]:
    """`outbox show ID --json` of the demo's database."""
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "show", str(action_id), "--json", "--database-url", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def demo_tokens(pid: int) -> list[str]:
    """The tokens the running demo gave its local APIs, read from the environment of a process it started."""
    names = ("OUTBOX_SLACK_TOKEN_ACME", "OUTBOX_GITHUB_TOKEN_ACME", "OUTBOX_GITLAB_TOKEN_MAIN")
    for child in psutil.Process(pid).children(recursive=True):
        try:
            environment = child.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if all(name in environment for name in names):
            return [environment[name] for name in names]
    raise AssertionError("no process of the demo holds the tokens of its local APIs")


def cells_of(line: str) -> list[str]:
    """The cells of a table's row (none for a border line)."""
    if not line.startswith(("│", "┃")):
        return []
    return [cell.strip() for cell in re.split("[│┃]", line)[1:-1]]


def outcomes(output: str) -> list[tuple[str, str, str, str, int]]:
    """The outcomes table's rows: (part, kind, state, reason, actions), its `all` rows left out."""
    rows = [cells_of(line) for line in output.partition("every action of this run")[2].splitlines()]
    return [
        (part, kind, state, reason, int(count.replace(",", "")))
        for part, kind, state, reason, count in (row for row in rows if len(row) == 5)
        if part in ("backlog", "posts", "probe") and kind != "all"
    ]


def figure_rows(output: str) -> dict[str, list[str]]:
    """The figures table: each figure's value, then the `measured over` row that follows it, if any."""
    rows: dict[str, list[str]] = {}
    name = ""
    for cells in map(cells_of, output.partition("figures, and what each one counts")[2].splitlines()):
        if len(cells) != 2:
            continue
        if cells[0] == "measured over":
            rows[name].append(cells[1])
        else:
            name = cells[0]
            rows[name] = [cells[1]]
    return rows


def test_outside_a_clone_the_demo_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    """An outbox with no demo/ next to it (as installed), run in a folder that is not a clone either."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "outbox", site / "outbox", ignore=shutil.ignore_patterns("__pycache__"))
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PREFECT_"))}
    env |= {"OUTBOX_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "demo"], env=env, cwd=folder, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "runs from a clone of the outbox repository" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()


def test_make_demo_passes_its_options_on() -> None:
    """`make demo ARGS="..."` hands the options to `outbox demo`: `--help` answers and nothing starts."""
    done = subprocess.run(
        ["make", "--no-print-directory", "demo", "ARGS=--help"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--keep-running" in done.stdout and "Leave the stack up until Ctrl-C" in done.stdout, done.stdout
