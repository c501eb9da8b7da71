"""What the docs state about the files beside them stays true, read from both sides:

- the revision docs/adoption.md pins, in its Alembic and Django examples and their docstrings, is the newest
  of outbox's migrations (a new revision without the page following it fails here);
- docs/deployment.md's table for a Grafana outside compose names exactly the variables that the provisioning
  in deploy/grafana/ reads and that compose's Grafana is given;
- the README's Install names every extra of pyproject.toml that a user installs, docs/adoption.md's table
  every extra.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from outbox import migrate

ROOT = Path(__file__).resolve().parent.parent
ADOPTION = ROOT / "docs" / "adoption.md"
DEPLOYMENT = ROOT / "docs" / "deployment.md"
# outbox.migrate.upgrade(<connection>, "0014") and the example's docstring, "at its revision 0014"
PIN = re.compile(r'outbox\.migrate\.upgrade\([^,]+, "(\w+)"\)|at its revision (\w+)')


def section(page: Path, heading: str) -> str:
    """The text of `page` under `heading` (a level-2 heading), up to the next one."""
    text = page.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_adoption_examples_pin_the_newest_revision() -> None:
    pins = [call or docstring for call, docstring in PIN.findall(ADOPTION.read_text())]
    assert len(pins) == 4, pins  # the Alembic and the Django example, each its call and its docstring
    assert set(pins) == {migrate.head()}, f"docs/adoption.md pins {sorted(set(pins))}; the newest is {migrate.head()}"


def test_the_grafana_variables_are_documented_for_a_grafana_outside_compose() -> None:
    provisioning = "".join(path.read_text() for path in sorted((ROOT / "deploy" / "grafana").rglob("*.yaml")))
    read = set(re.findall(r"\$\{(\w+)\}", provisioning))
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    given = {name for name in compose["services"]["grafana"]["environment"] if not name.startswith("GF_")}
    table = section(DEPLOYMENT, "Grafana outside compose")
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    assert read == given == documented
    for name, value in compose["services"]["grafana"]["environment"].items():  # the table's compose column
        assert name.startswith("GF_") or re.search(rf"^\| `{name}` \|.*\| `{re.escape(str(value))}` \|$", table, re.M)


def test_the_install_sections_name_every_extra() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    readme = section(ROOT / "README.md", "Install")
    assert {extra for extra in extras if f"'outbox[{extra}]'" in readme} == extras - {
        "dev",
        "bench",
    }  # the repository's
    assert set(re.findall(r"^\| `(\w+)` \|", section(ADOPTION, "Install"), re.M)) == extras
