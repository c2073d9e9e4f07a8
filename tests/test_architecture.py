"""The package contracts hold: the decision core does no I/O (it never imports network, storage or
server libraries), transports sit at the edge, the MCP core imports no transport, and only the CEL
adapter imports an engine (the contracts are in pyproject.toml, checked with import-linter)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

CORE = ["gateway/core/call.py", "gateway/core/pipeline.py", "gateway/core/errors.py", "gateway/core/backends.py"]
CORE_GLOBS: list[str] = []
CORE_DIRS = ["gateway/stages", "gateway/stages/sanitizer", "gateway/policy", "gateway/policy/cel"]
FORBIDDEN = {"starlette", "httpx", "sqlite3", "psycopg", "redis", "uvicorn", "socket", "subprocess"}
ROOT = Path(__file__).resolve().parent.parent


def core_files() -> list[Path]:
    files = [ROOT / f for f in CORE]
    for pattern in CORE_GLOBS:
        files.extend(sorted(ROOT.glob(pattern)))
    for d in CORE_DIRS:
        files.extend(sorted((ROOT / d).glob("*.py")))
    return files


def test_core_imports_no_io_libraries():
    offenders = []
    for file in core_files():
        tree = ast.parse(file.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{file.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
            if isinstance(node, ast.Attribute) and node.attr == "environ":
                offenders.append(f"{file.relative_to(ROOT)}: reads os.environ")
    assert offenders == []


def test_only_the_adapter_imports_cel_engines():
    for file in (ROOT / "gateway").rglob("*.py"):
        if file.relative_to(ROOT).as_posix() in ("gateway/policy/cel/celpython.py", "gateway/policy/cel/rust.py", "gateway/policy/cel/__init__.py"):
            continue
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & {"cel", "celpy"}, file
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert node.module.split(".")[0] not in {"cel", "celpy"}, file


def test_package_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    summary = re.search(r"Contracts: (\d+) kept, (\d+) broken", done.stdout)
    assert done.returncode == 0 and summary is not None, done.stdout[-4000:] + done.stderr[-2000:]
    assert int(summary.group(1)) >= 5 and summary.group(2) == "0"


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = []
    for file in sorted((ROOT / "gateway").rglob("*.py")) + sorted((ROOT / "audit").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("gateway", "audit"):
                offenders += [f"{file.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []


README_LABELS = {
    "sanitizer": "sanitizer",
    "circuit breaker": "circuit_breaker",
    "rate limiter": "rate_limiter",
    "tier gate": "tier_gate",
    "dharma rules": "dharma_rules",
    "approval": "approval",
    "decision record": "record_decision",
    "[backend]": "forward",
    "disclosure rules": "disclosure",
    "karma ledger": "record",
    "signed receipt": "receipt",
}


def test_readme_pipeline_line_is_the_declaration():
    """The README's pipeline line names the steps of `gateway.core.pipeline.steps()`, in order;
    only the identity steps (authenticate, tool visibility) come before it."""
    import re

    from gateway.core.pipeline import Wiring, split, steps
    from gateway.stages.circuit_breaker import CircuitBreaker
    from gateway.stores.memory import MemoryBreakerStore

    readme = (ROOT / "README.md").read_text()
    block = readme.split("one pipeline:", 1)[1].split("```", 2)[1]
    labels = [re.sub(r"\(.*?\)", "", part).strip() for part in block.replace("\n", " ").split("→")]
    wiring = Wiring(ledger=None, keys=None, limiter_store=None, approvals=None, idempotency=None,  # type: ignore[arg-type]
                    history=None, breaker=CircuitBreaker(MemoryBreakerStore()), clock=lambda: 0.0)  # type: ignore[arg-type]
    declared = [step.name for step in steps(wiring)]
    assert declared[:2] == ["authenticate", "tool_visibility"]
    assert [README_LABELS[label] for label in labels] == declared[2:]
    decide, act = split(steps(wiring))
    assert [s.name for s in act] == ["record_decision", "forward", "disclosure", "record", "receipt"]
    assert len(decide) + len(act) == len(declared)


MAX_FUNCTION_LINES = 120


def test_no_function_is_longer_than_the_bound() -> None:
    """Issue 26: no function in gateway/ or audit/ runs over 120 lines (decorators and nested
    functions included); a longer one is split into named steps a reader can follow."""
    long = []
    for package in ("gateway", "audit"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    if node.end_lineno is not None and node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - start + 1} lines)")
    assert not long, "functions over the bound:\n" + "\n".join(long)
