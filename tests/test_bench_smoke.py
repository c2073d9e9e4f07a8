"""Smoke test of the benchmarks: `python -m bench --quick` runs and prints every figure.

It checks that the figures are printed, never how fast anything is (design §8: performance is
measured by `bench/`, printed, and not asserted in tests).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_bench_quick_prints_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{proc.stderr[-4000:]}"
    for title in ("== decision", "== governed", "== ledger_verify", "== ledger_query", "== mcp_stdio", "== mcp_http",
                  "== targets"):
        assert title in out, f"{title!r} missing from:\n{out}"
    for figure in ("p50", "p99", "mean", "calls/s", "records/s", "rules eval/call", "added p50", "x direct",
                   "through dharma stdio", "through dharma serve /mcp", "clients"):
        assert figure in out, f"{figure!r} missing from:\n{out}"
    verdicts = [line for line in out.splitlines() if line.strip().startswith(("MET", "MISSED"))]
    assert len(verdicts) == 6, f"expected one verdict per §8 target:\n{out}"
    assert "mcp stdio added p50" in out, f"the MCP stdio target is missing:\n{out}"
    assert "receipt returned: yes" in out, f"a governed MCP call came back without a receipt:\n{out}"
