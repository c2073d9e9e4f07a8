"""The official conformance suite (`@modelcontextprotocol/conformance`, three passes) against the
fixture directly and through `dharma serve` with the permissive profile; `compare.sh` must report
no difference at all, scenarios and checks alike (exit 0).

That includes `server-sse-polling`'s resumability checks: the gateway primes its streams with its
own event ids and `retry:`, closes the client's stream when the upstream closes its own, and
answers GET + `Last-Event-ID` from its own store of events it governed and sent (never by asking
the upstream to replay; docs/mcp-http.md, "Resumed streams").

The fixture runs on uvicorn's h11 parser, the reference it has always had (`h11_only/` hides
httptools from it); `dharma serve` runs on httptools and trims header values itself.
Slow (about 90 s, plus a one-time install of about 290 MB into the conformance cache); skipped
when ../shared/conformance (or $DHARMA_CONFORMANCE_DIR) is absent or DHARMA_SKIP_CONFORMANCE is set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.mcp_http.conftest import CONFORMANCE

H11_ONLY = REPO / "tests" / "mcp_http" / "h11_only"


#: A named group over the fixture's tools (its every tool name, by globs), on a gateway that also
#: serves python tools of its own (`tests.mcp_http.native_tools`): the group must hide those and
#: change nothing else.
FIXTURE_GROUP = ("[{name: fixture, tools: [test_*, json_schema_*, greet, slow_compute, failing_job, protocol_error_job, "
                 "confirm_delete, multi_input]}]")
CALC = "{id: calc, type: python, target: 'tests.mcp_http.native_tools:backend'}"


def test_conformance_suite_through_the_gateway(tmp_path) -> None:
    _through_the_gateway(tmp_path, "dharma-pytest", "", "/mcp")


def test_conformance_suite_through_a_group(tmp_path) -> None:
    """The same suite at `/mcp/fixture`, a group of every fixture tool on a gateway that has more
    tools (python ones) than the fixture: through the group it is the fixture, exactly."""
    _through_the_gateway(tmp_path, "dharma-pytest-group", f'DHARMA_GROUPS="{FIXTURE_GROUP}" ', "/mcp/fixture", extra=f", {CALC}")


def _through_the_gateway(tmp_path, label: str, env: str, path: str, extra: str = "") -> None:
    script = CONFORMANCE / "check_gateway.sh"
    if not script.exists():
        pytest.skip(f"the conformance runner is not at {script} (../shared/conformance relative to the repo)")
    if os.environ.get("DHARMA_SKIP_CONFORMANCE"):
        pytest.skip("DHARMA_SKIP_CONFORMANCE is set")
    state = tmp_path / "state"
    # Every scenario runs as the one anonymous principal, and many never end their session: the suite
    # is about transparency, so the per-principal session cap (default 16) is set above what it opens.
    gateway = (
        f'DHARMA_STATE_ROOT={state} DHARMA_UPSTREAMS="[{{id: fixture, type: mcp_http, url: $UPSTREAM_URL}}{extra}]" {env}'
        f"DHARMA_MCP__ANONYMOUS_USER=conformance DHARMA_MCP__MAX_SESSIONS_PER_PRINCIPAL=1000 PYTHONPATH={REPO} "
        f'exec {sys.executable} -m gateway serve --policy {REPO / "policies" / "permissive.yaml"} --port "$PORT"'
    )
    started = time.monotonic()
    done = subprocess.run(["bash", str(script), "--label", label, "--path", path, "--gateway", gateway], capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(H11_ONLY)})
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    print(out[-4000:], f"\nconformance through the gateway took {took:.0f}s")
    if done.returncode == 2:
        pytest.skip(f"the conformance runner could not be set up: {out[-1000:]}")
    scenarios = re.search(r"^(\d+) scenario\(s\) differ", out, re.M)
    assert scenarios is not None and scenarios.group(1) == "0", out[-4000:]
    deltas = sorted(set(re.findall(r"^\s+(\S+/\S+ \S+): \S+ -> \S+$", out, re.M)))
    assert not deltas, deltas
    assert done.returncode == 0, out[-4000:]  # compare.sh: no difference at all
    assert out.count("total: 118 passed, 0 failed") == 2, out[-2000:]  # direct, then through the gateway
