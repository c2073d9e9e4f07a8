"""Smoke test of `python -m bench.optimisations` (issue 26): it runs and prints a row for every
optimisation docs/performance-history.md reports, each with a figure; never how fast anything is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROWS = (
    "request id from shared random blocks", "cached RFC 3339 timestamp", "settled-logger shim",
    "session facts copied field by field", "pin file: fstat", "auth guard: route answers", "auth guard: one pass",
    "header map memo", "upstream request head memo", "tool group membership memo", "ToolInfo memo of the called tool",
    "definition findings memo", "Deadline instead of asyncio.timeout", "one-statement commit",
    "CEL fast path: decision, permissive.yaml", "CEL fast path: decision, standard.yaml",
    "CEL fast path: decision, strict.yaml", "guards: decision", "policy memos: decision", "classify memo: decision",
    "regex memo: decision", "CEL fast path: governed call", "canonical JSON by msgspec", "inline ledger commit",
    "strict JSON by msgspec when compact", "jsonrpc.dumps by msgspec when plain",
)


def test_every_optimisation_gets_a_figure() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.optimisations", "--rounds", "1", "--quick"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    for name in ROWS:
        row = [line for line in lines if name in line]
        assert row, f"no row for {name!r}:\n{proc.stdout}"
        assert re.search(r"[+-]\d+(\.\d+)? +(removed|kept|see text)$", row[0].rstrip()), row[0]
