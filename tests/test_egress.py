"""The egress rule: only the executor calls an adapter's `execute`; only the email adapter imports aiosmtplib.

Both are checked over the source of `outbox/` and `flows/`, and the failure names the offending module.
import-linter checks the aiosmtplib rule too, on the import graph (`make check`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXECUTOR = ROOT / "outbox" / "executor" / "executor.py"
EMAIL_PACKAGE = ROOT / "outbox" / "email"


def sources() -> list[Path]:
    return sorted(p for folder in ("outbox", "flows") for p in (ROOT / folder).rglob("*.py"))


def adapter_execute_calls(tree: ast.AST) -> list[int]:
    """Lines calling `<something adapter-like>.execute(attempt)`: a receiver named *adapter*, or an
    argument that is an ActionAttempt (named attempt, or built in place)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "execute":
            receiver = ast.unparse(node.func.value).lower()
            arguments = [ast.unparse(a) for a in node.args]
            if "adapter" in receiver or any(a == "attempt" or a.startswith("ActionAttempt(") for a in arguments):
                lines.append(node.lineno)
    return lines


def test_only_the_executor_calls_an_adapters_execute() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sources()
        if path != EXECUTOR
        for line in adapter_execute_calls(ast.parse(path.read_text()))
    ]
    assert not offenders, f"only outbox/executor/executor.py may call an adapter's execute: {offenders}"
    assert adapter_execute_calls(ast.parse(EXECUTOR.read_text())), "the executor no longer calls execute?"


def test_only_the_email_adapter_imports_aiosmtplib() -> None:
    offenders = []
    for path in sources():
        if EMAIL_PACKAGE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] == "aiosmtplib" for name in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"only outbox/email may import aiosmtplib: {offenders}"


def test_the_check_finds_a_call_from_elsewhere() -> None:
    rogue = ast.parse("async def send(adapter, attempt):\n    return await adapter.execute(attempt)\n")
    assert adapter_execute_calls(rogue) == [2]
    sql = ast.parse("conn.execute(statement, params)\n")
    assert adapter_execute_calls(sql) == []
