"""The deployment files parse, and every name they share with the code matches (no Docker here to run them);
`outbox prefect files` writes the Prefect ones into a folder all at once, replacing none unasked."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from outbox.cli.prefect import FILES as PREFECT_FILES
from tests.conftest import CliResult

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def default(value: str) -> str:
    """A compose value with `${NAME:-default}` read as its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def seconds(duration: str) -> float:
    """A compose duration such as `2m` or `1m30s`."""
    units = {"h": 3600, "m": 60, "s": 1}
    return float(sum(int(n) * units[unit] for n, unit in re.findall(r"(\d+)([hms])", duration)))


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def needs(services: dict[str, Any], name: str) -> set[str]:
    """Every service `name` waits for, directly or not."""
    direct = set(services[name].get("depends_on", []))
    return direct.union(*(needs(services, d) for d in direct))


def test_the_compose_file_starts_the_whole_stack_on_loopback() -> None:
    compose = load(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert {
        "postgres",
        "migrate",
        "prefect-server",
        "worker",
        "exporter",
        "prometheus",
        "grafana",
        "mailcatcher",
    } <= set(services)
    assert services["worker"]["deploy"]["replicas"] == 3
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts {source}, which does not exist"
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on an unknown service {dependency}"
    assert (ROOT / services["migrate"]["build"]["dockerfile"]).exists()


def test_the_compose_workers_find_everything_the_deployment_needs() -> None:
    services = load(DEPLOY / "compose.yaml")["services"]
    # the one-shot steps finish before any worker starts
    assert {"migrate", "work-pool", "automations", "deployments"} <= needs(services, "worker")
    completed = {
        dependency: spec["condition"]
        for service in services.values()
        if isinstance(service.get("depends_on"), dict)
        for dependency, spec in service["depends_on"].items()
    }
    for step in ("migrate", "work-pool", "automations", "deployments"):
        assert completed[step] == "service_completed_successfully", f"{step} is waited for until it succeeds"

    # every variable deploy/prefect.yaml reads at deploy time is given, and not empty
    prefect_file = (DEPLOY / "prefect.yaml").read_text()
    read = set(re.findall(r"\{\{ \$(\w+) \}\}", prefect_file))
    assert read == {"OUTBOX_ADAPTERS"}
    deployments = services["deployments"]
    given = {name: default(str(value)) for name, value in deployments["environment"].items()}
    assert all(given.get(name) for name in read), f"the deployments step leaves some of {read} empty"
    assert given["OUTBOX_ADAPTERS"] == "examples.accounts:adapters"
    assert "${OUTBOX_ADAPTERS:-" in deployments["environment"]["OUTBOX_ADAPTERS"], "a user can name their adapters"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, re.MULTILINE)
    assert workdir and deployments["working_dir"] == workdir.group(1)
    # the files the steps read are in the image, and the flow runs import the example's adapters from it
    copied = set(re.findall(r"^COPY (\S+) ", dockerfile, re.MULTILINE))
    assert "deploy" in copied and "flows" in copied and "examples" in copied
    assert services["worker"]["environment"]["PYTHONPATH"] == workdir.group(1)

    # the workers: `outbox worker` (the image's entrypoint is outbox), stopped after its grace
    worker = services["worker"]
    assert re.search(r'^ENTRYPOINT \["outbox"\]', dockerfile, re.MULTILINE)
    assert worker["command"][0] == "worker" and "entrypoint" not in worker
    assert seconds(worker["stop_grace_period"]) > float(option(worker["command"], "--grace"))
    env = worker["environment"]
    assert env["PREFECT_LOGGING_EXTRA_LOGGERS"] == "outbox"
    assert default(env["OUTBOX_ENVIRONMENT"]), "the drain runs are tagged env:<name>"
    assert {"OUTBOX_DATABASE_URL", "OUTBOX_SMTP_HOST", "OUTBOX_SMTP_SENDER", "PREFECT_API_URL"} <= set(env)

    # the zombie automation: re-created by name on every start (never a second copy), and its 90 s window
    # covers three of the workers' heartbeats
    automations = load(DEPLOY / "prefect-automations.yaml")["automations"]
    script = " ".join(services["automations"]["entrypoint"])
    for automation in automations:
        delete = f"prefect --no-prompt automation delete {automation['name']}"
        assert delete in script and script.index(delete) < script.index("automation create"), automation["name"]
    assert "--from-file deploy/prefect-automations.yaml" in script
    (crash,) = automations
    assert crash["trigger"]["within"] == 3 * int(env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"])


def test_the_compose_prefect_server_keeps_ended_flow_runs_14_days() -> None:
    services = load(DEPLOY / "compose.yaml")["services"]
    env = services["prefect-server"]["environment"]
    assert set(env["PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED"].split(",")) == {"events", "flow_runs"}
    assert int(env["PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD"]) == 14 * 86_400
    # its own database, made by postgres-init.sql
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"].endswith("@postgres:5432/prefect")
    assert "CREATE DATABASE prefect" in (DEPLOY / "postgres-init.sql").read_text()


def test_grafana_provisioning_names_what_the_dashboard_and_rules_use() -> None:
    datasources = {d["uid"]: d for d in load(DEPLOY / "grafana/datasources/outbox.yaml")["datasources"]}
    assert datasources["outbox-prometheus"]["type"] == "prometheus"
    assert datasources["outbox-postgres"]["type"] == "grafana-postgresql-datasource"
    dashboard = json.loads((ROOT / "dashboards/outbox-overview.json").read_text())
    sql_uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", []) if "rawSql" in t}
    assert sql_uids == {"outbox-postgres"}
    rules = load(DEPLOY / "grafana/alerting/outbox-rules.yaml")
    assert {q["datasourceUid"] for g in rules["groups"] for r in g["rules"] for q in r["data"]} == {
        "outbox-prometheus",
        "__expr__",
    }
    provider = load(DEPLOY / "grafana/dashboards/outbox.yaml")["providers"][0]
    compose = load(DEPLOY / "compose.yaml")
    mounts = compose["services"]["grafana"]["volumes"]
    assert any(m.endswith(provider["options"]["path"] + ":ro") for m in mounts)
    contact = load(DEPLOY / "grafana/alerting/contact-points.yaml")
    assert contact["contactPoints"][0]["receivers"][0]["settings"]["addresses"] == "${OUTBOX_ALERT_EMAIL}"


def test_prometheus_scrapes_the_exporter_and_loads_the_rules() -> None:
    config = load(DEPLOY / "prometheus/prometheus.yml")
    assert config["rule_files"] == ["outbox-rules.yml"]
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["exporter:9464"]


def test_outbox_prefect_files_writes_the_prefect_files_and_never_replaces_one_unasked(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    target = tmp_path / "app" / "deploy"  # made, with its parent
    written = cli("prefect", "files", str(target))
    assert written.code == 0, written.err
    assert sorted(p.name for p in target.iterdir()) == sorted(PREFECT_FILES)
    for name in PREFECT_FILES:
        assert (target / name).read_bytes() == (DEPLOY / name).read_bytes(), name

    edited = target / "prefect.yaml"
    edited.write_text("# the application's own edit\n")
    refused = cli("prefect", "files", str(target))
    assert refused.code == 2 and refused.err.count("\n") == 1
    assert str(target) in refused.err and "prefect.yaml" in refused.err and "--overwrite" in refused.err
    assert edited.read_text() == "# the application's own edit\n"

    assert cli("prefect", "files", "--overwrite", str(target)).code == 0
    assert edited.read_bytes() == (DEPLOY / "prefect.yaml").read_bytes()
    assert sorted(p.name for p in target.iterdir()) == sorted(PREFECT_FILES)


def test_outbox_prefect_files_writes_every_file_or_none(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    # the third file cannot be written (a folder stands where it is written first): the first two go too
    (tmp_path / ".prefect-notify.yaml.partial").mkdir()
    failed = cli("prefect", "files", str(tmp_path))
    assert failed.code == 2 and failed.err.count("\n") == 1 and str(tmp_path) in failed.err
    assert [p.name for p in tmp_path.iterdir()] == [".prefect-notify.yaml.partial"]

    # a folder that cannot be made (under a file) is named, and nothing is left
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    under_a_file = cli("prefect", "files", str(blocker / "deploy"))
    assert under_a_file.code == 2 and "cannot write to" in under_a_file.err
    assert cli("prefect", "files", str(blocker)).code == 2  # a file is not a folder
    assert blocker.read_text() == ""
