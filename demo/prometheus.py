"""The demo's Prometheus: it scrapes the demo's exporter and evaluates the alert rules outbox ships
(deploy/prometheus/outbox-rules.yml, the same file a deployment loads), so the alerts can be watched at
its `/alerts` page while the demo runs.

    the exporter's port ─▶ prometheus.yml in the demo's folder ─▶ Debian's `prometheus` on a free port
                                                            └▶ not installed: the command that starts one

It scrapes every 5 s (a deployment's 15 s would leave a short demo with few samples); the rules keep
their own group interval (1 minute), so an alert shows first as pending, then firing after its `for`.
"""

from __future__ import annotations

import json
from pathlib import Path

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "outbox-rules.yml"
# the port of the printed command, for a Prometheus started by hand
PORT = 9090
SCRAPE_SECONDS = 5


def config(metrics_port: int) -> str:
    """Prometheus's configuration: the demo's exporter, the shipped rules (JSON is YAML)."""
    return json.dumps(
        {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "outbox", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
        },
        indent=1,
    )


def command(binary: str, folder: Path, port: int) -> list[str]:
    """Prometheus on 127.0.0.1:`port`, its configuration and series in `folder`."""
    return [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
