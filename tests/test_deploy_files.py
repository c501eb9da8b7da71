"""The deployment files parse, and every name they share with the code matches (no Docker here to run them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


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
