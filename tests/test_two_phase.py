"""Two-phase records with real parts: nothing reaches a backend before its decision is committed.

A `dharma serve` process whose backend tool writes a marker and then blocks is killed with
SIGKILL once the marker appears: the ledger holds that call's decision record and no outcome,
`dharma audit query` shows it as outcome unknown and `dharma audit verify` passes and reports it.
On each backend: the default SQLite file under the state root, and a PostgreSQL database
(`ledger: {url: …}`) started from the installed binaries.
(A decision record that cannot be appended: tests/test_pipeline.py.)
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from audit.query import query_records
from tests.audit.conftest import BACKENDS, new_location, open_reader
from tests.conftest import KEYS, REPO, write_policy
from tests.test_cli import cli_env, dharma, free_port

BLOCKING_BACKEND = '''
import asyncio, os
from pathlib import Path
from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend

async def write_marker(path: str):
    marker = Path(os.environ["TWOPHASE_MARKER"])  # the side effect happened: written whole, then renamed,
    marker.with_suffix(".tmp").write_text(path, encoding="utf-8")  # so the test never reads it half written
    os.replace(marker.with_suffix(".tmp"), marker)
    await asyncio.Event().wait()  # ... and the answer never comes

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

def backend(backend_id: str = "blocker") -> CallableBackend:
    return CallableBackend(backend_id, {"write_marker": (write_marker, ToolSpec("write_marker", "Write a marker, then block.", SCHEMA))})
'''


async def _wait_for(condition: Any, what: str, server: subprocess.Popen[str], seconds: float = 30) -> None:
    """Poll `condition` (a positive signal) until it holds; fail naming `what` if the server died or time ran out."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert server.poll() is None, server.communicate()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_kill_9_mid_call_leaves_the_decision_and_audit_says_outcome_unknown(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    state_root = tmp_path / "state"
    state_root.mkdir()
    location = state_root / "ledger.db" if backend == "sqlite" else new_location(backend, request, tmp_path)
    ledger_args = ("--ledger", str(location)) if backend == "postgres" else ()
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "blocking_backend.py").write_text(BLOCKING_BACKEND, encoding="utf-8")
    marker = tmp_path / "marker.txt"
    policy = write_policy(tmp_path / "policy", backend_timeout_seconds=600)  # the call must still be running when killed
    config = tmp_path / "dharma.yaml"
    config.write_text(yaml.safe_dump({
        "policy": str(policy), "python_path": [str(modules), str(REPO)],
        "upstreams": [{"id": "blocker", "type": "python", "target": "blocking_backend:backend"}],
        **({"ledger": {"url": location}} if backend == "postgres" else {}),
    }), encoding="utf-8")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--port", str(port)],
        env=cli_env(state_root, TWOPHASE_MARKER=str(marker)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    request_id = "req-killed-mid-call"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            async def healthy() -> bool:
                try:
                    return (await http.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            deadline = time.monotonic() + 30
            while not await healthy():
                assert server.poll() is None, server.communicate()
                assert time.monotonic() < deadline, "dharma serve did not start"
                await asyncio.sleep(0.05)
            call = asyncio.create_task(http.post(
                "/v1/tools/write_marker:call", json={"arguments": {"path": "plan.md"}},
                headers={"authorization": f"Bearer {KEYS['operator']}", "x-request-id": request_id},
            ))
            await _wait_for(marker.exists, "the backend's marker", server)
            assert marker.read_text(encoding="utf-8") == "plan.md"
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
            try:
                answer = await call
            except httpx.TransportError:
                answer = None
            assert answer is None, answer.text  # no answer ever left: the gateway died mid-call
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=30)
    assert server.returncode == -signal.SIGKILL

    with open_reader(location) as reader:
        records = [r for r in query_records(reader) if r["request_id"] == request_id]
    [decided] = records  # the decision record, and no outcome record
    assert decided["kind"] == "decision" and decided["tool"] == "write_marker" and decided["principal"] == "operator"
    assert decided["decision"] == "allow" and decided["args"] == {"path": "plan.md"} and "status" not in decided

    unknown, table, verify, strict = (
        dharma(*args, state_root=state_root)
        for args in (
            ("audit", "query", *ledger_args, "--outcome-unknown", "--format", "jsonl"),
            ("audit", "query", *ledger_args),
            ("audit", "verify", *ledger_args),
            ("audit", "verify", *ledger_args, "--strict-outcomes"),
        )
    )
    assert unknown.rc == 0, unknown.err
    [shown] = [json.loads(line) for line in unknown.out.splitlines()]
    assert shown["seq"] == decided["seq"] and shown["outcome"] == "unknown" and shown["request_id"] == request_id
    assert table.rc == 0 and "outcome unknown" in table.out.splitlines()[-1], table.out
    assert verify.rc == 0 and verify.out.startswith("OK"), verify.out + verify.err  # not tampering
    assert "1 call(s) with outcome unknown" in verify.out and f"at seq {decided['seq']}" in verify.out, verify.out
    assert strict.rc == 1 and "FAIL" in strict.out and f"at seq {decided['seq']}" in strict.out, strict.out
