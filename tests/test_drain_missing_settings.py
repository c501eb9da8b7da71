"""A drain run whose webhook endpoint has no secret, or whose NATS adapter has no OUTBOX_NATS_URL, on
Prefect's test harness (a real Prefect API on a temporary database) and a real PostgreSQL: the run ends
Failed at once, before it claims anything, with one line that names what is missing (for a secret, every
place it was looked for: the variable and the Prefect Secret block), and no traceback in its logs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest
from prefect.blocks.system import Secret
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler
from prefect.testing.utilities import prefect_test_harness
from sqlalchemy import Engine

from flows.drain import drain
from outbox._internal.config.credentials import Sources
from outbox.github import accounts as account_registry
from outbox.github import register_account
from outbox.webhook import endpoints as endpoint_registry
from outbox.webhook import register_endpoint

pytestmark = pytest.mark.usefixtures("outbox_logger_restored")

MISSING = (
    "webhook endpoint unsigned-hooks has no secret: neither the code (register_endpoint's secret=),"
    " OUTBOX_WEBHOOK_SECRET_UNSIGNED_HOOKS nor the Prefect Secret block outbox-webhook-unsigned-hooks holds one;"
    " put whsec_ and the base64 of 24 to 64 random bytes in one of them"
)


@pytest.fixture(scope="module", autouse=True)
def prefect_api() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield


async def run_logs(flow_run_id: Any) -> list[tuple[int, str]]:
    await APILogHandler.aflush()
    async with get_client() as client:
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [(log.level, log.message) for log in logs]


async def final_logs(flow_run_id: Any) -> list[tuple[int, str]]:
    """The run's logs once its last line ("Finished in state ...") has reached the API."""
    deadline = asyncio.get_running_loop().time() + 30
    logs = await run_logs(flow_run_id)
    while not any(message.startswith("Finished in state") for _, message in logs):
        assert asyncio.get_running_loop().time() < deadline, logs
        await asyncio.sleep(0.2)  # the API ingests logs in batches: poll until the last one is there
        logs = await run_logs(flow_run_id)
    return logs


def one_line_and_no_traceback(logs: list[tuple[int, str]], message: str) -> None:
    errors = [line for level, line in logs if level >= 40]
    assert errors == [f"Finished in state Failed({message!r})"], logs
    assert not any("Traceback" in line or "Encountered exception" in line for _, line in logs)
    assert not any("carrying out" in line for _, line in logs), "its executor never started"


async def test_a_run_without_a_webhook_secret_fails_in_one_line_naming_the_prefect_secret_block(
    engine: Engine, outbox_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(endpoint_registry, "_ENDPOINTS", {})
    monkeypatch.setattr(endpoint_registry, "_SOURCES", Sources("secret"))
    for name in [name for name in os.environ if name.startswith("OUTBOX_WEBHOOK_SECRET_")]:
        monkeypatch.delenv(name)
    register_endpoint("unsigned-hooks", "http://127.0.0.1:9/hooks")
    state = await drain(max_seconds=30, adapters="outbox.webhook:webhook_adapters", return_state=True)
    assert state.is_failed() and state.message == MISSING
    one_line_and_no_traceback(await final_logs(state.state_details.flow_run_id), MISSING)


async def test_a_run_without_outbox_nats_url_fails_in_one_line_naming_it(
    engine: Engine, outbox_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOX_NATS_URL", raising=False)
    state = await drain(max_seconds=30, adapters="outbox.nats:nats_adapters", return_state=True)
    missing = "OUTBOX_NATS_URL is not set: give one or more nats:// URLs, comma separated"
    assert state.is_failed() and state.message == missing
    one_line_and_no_traceback(await final_logs(state.state_details.flow_run_id), missing)


@pytest.fixture
def no_github_accounts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(account_registry, "_ACCOUNTS", {})
    monkeypatch.setattr(account_registry, "_SOURCES", Sources("secret"))
    for name in [name for name in os.environ if name.startswith("OUTBOX_GITHUB_")]:
        monkeypatch.delenv(name)


async def test_a_run_without_a_github_token_fails_in_one_line_naming_the_prefect_secret_block(
    engine: Engine, outbox_env: None, no_github_accounts: None
) -> None:
    register_account("acme-bot")
    state = await drain(max_seconds=30, adapters="outbox.github:github_adapters", return_state=True)
    missing = (
        "GitHub account acme-bot has no token: neither the code (register_account's token=),"
        " OUTBOX_GITHUB_TOKEN_ACME_BOT nor the Prefect Secret block outbox-github-acme-bot holds one; put a token"
        " with write access to issues and pulls in one of them"
    )
    assert state.is_failed() and state.message == missing
    one_line_and_no_traceback(await final_logs(state.state_details.flow_run_id), missing)


async def test_a_github_token_comes_from_its_prefect_secret_block(
    engine: Engine, outbox_env: None, no_github_accounts: None
) -> None:
    register_account("acme-bot")
    await Secret(value="ghs_" + "b" * 36).save("outbox-github-acme-bot", overwrite=True)
    state = await drain(max_seconds=1, adapters="outbox.github:github_adapters", return_state=True)
    assert state.is_completed(), state.message
