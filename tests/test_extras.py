"""An optional part of outbox used without its extra: one line naming the install command.

Each test runs a fresh interpreter in which the extra's package cannot be imported (None in sys.modules,
as if it were not installed) and reads what it printed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = "import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
CLI = "sys.argv = ['outbox', *{argv!r}]\nfrom outbox.cli import main\nmain()\n"


def run_without(blocked: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    program = BLOCKED.format(blocked=blocked) + code
    return subprocess.run(
        [sys.executable, "-c", program], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )


WEBHOOK_LINE = "outbox.webhook needs the webhook extra ({missing} missing): pip install 'outbox[webhook]'"
NATS_LINE = "outbox.nats needs the nats extra (nats missing): pip install 'outbox[nats]'"


@pytest.mark.parametrize(
    ("code", "missing"),
    [
        ("import outbox.webhook.adapter", "httpx"),
        ("import outbox.webhook.adapter", "standardwebhooks"),
        ("from outbox.webhook import webhook_adapters", "httpx"),
        ("import outbox.webhook.message", "standardwebhooks"),
    ],
)
def test_importing_the_webhook_adapter_without_its_extra_names_the_install_command(missing: str, code: str) -> None:
    done = run_without((missing,), code)
    assert done.returncode == 1
    line = WEBHOOK_LINE.format(missing=missing)
    assert done.stderr.splitlines()[-1] == f"outbox._internal.config.extras.MissingExtra: {line}"


@pytest.mark.parametrize("module", ["adapter", "client", "streams", "readback"])
def test_importing_the_nats_adapter_without_its_extra_names_the_install_command(module: str) -> None:
    done = run_without(("nats",), f"import outbox.nats.{module}")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"outbox._internal.config.extras.MissingExtra: {NATS_LINE}"


def test_outbox_run_with_the_webhook_adapters_without_the_extra_is_one_line() -> None:
    argv = ["run", "--adapters", "outbox.webhook:webhook_adapters", "--database-url", "postgresql://u@127.0.0.1:1/d"]
    done = run_without(("httpx",), CLI.format(argv=argv))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"error: --adapters outbox.webhook:webhook_adapters: {WEBHOOK_LINE.format(missing='httpx')}\n"


def test_outbox_nats_ensure_stream_without_the_extra_is_one_line() -> None:
    done = run_without(("nats",), CLI.format(argv=["nats", "ensure-stream", "--stream", "S", "--subject", "s.>"]))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {NATS_LINE}\n")


def test_the_extras_install_what_they_name() -> None:
    """What the lines promise: each extra's packages are its optional dependencies in pyproject.toml."""
    import tomllib
    from pathlib import Path

    from outbox._internal.config.extras import EXTRAS

    optional = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, (_, modules) in EXTRAS.items():
        requirements = " ".join(optional[extra]).replace("-py", "")  # nats-py installs the module nats
        assert all(module in requirements for module in modules), (extra, optional[extra])
