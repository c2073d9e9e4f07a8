"""The two MCP transports govern through one flow: the same scripted session, sent to the same
SDK-built server through `dharma stdio` and through `dharma serve`'s `/mcp` (with that server as
an `mcp_stdio` upstream), gets the same answers and leaves the same ledger records."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.mcp.conftest import (
    REPO,
    RawGateway,
    gateway_command,
    ledger_records,
    test_server_command,
    write_mcp_policy,
)
from tests.mcp_http.conftest import serve_gateway
from tests.mcp_http.raw import Raw, answer

VERSION = "2025-11-25"

#: The scripted session after initialize: (id, method, params). Covers an allowed call, a rule's
#: deny, a hidden tool, an unknown tool, malformed arguments and name, a redacted result, and a
#: method MCP does not define (passed through and recorded).
SCRIPT: list[tuple[int, str, dict[str, Any]]] = [
    (2, "tools/list", {}),
    (3, "tools/call", {"name": "echo", "arguments": {"text": "hello"}}),
    (4, "tools/call", {"name": "write_note", "arguments": {"path": "../escape", "text": "x"}}),
    (5, "tools/call", {"name": "admin_reset", "arguments": {}}),
    (6, "tools/call", {"name": "no_such_tool", "arguments": {}}),
    (7, "tools/call", {"name": "echo", "arguments": ["not", "an", "object"]}),
    (8, "tools/call", {"arguments": {}}),
    (9, "tools/call", {"name": "get_report", "arguments": {"title": "q3"}}),
    (10, "vendor/custom", {"x": 1}),
    (11, "tools/call", {"name": "ｅｃｈｏ", "arguments": {"text": "look-alike"}}),
]

#: Ledger fields that legitimately differ between two runs (ids, times, where the server runs).
VOLATILE = {"time", "request_id", "session_id", "latency_us", "backend", "response_digest", "hash", "prev_hash", "prev",
            "decision_hash"}  # the hash of the decision record, which holds the volatile fields


def _normal(message: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs per call: the receipt and the gateway's request id."""
    out = copy.deepcopy(message)
    result = out.get("result")
    if isinstance(result, dict) and isinstance(result.get("_meta"), dict):
        meta = result["_meta"]
        meta.pop("dharma.gateway/receipt", None)
        decision = meta.get("dharma.gateway/decision")
        if isinstance(decision, dict):
            decision.pop("request_id", None)
        if not meta:
            del result["_meta"]
    return out


def _records(state: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in ledger_records(state)]


async def _through_stdio(tmp: Path, policy: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    state = tmp / "stdio-state"
    state.mkdir()
    log = open(tmp / "stdio-gateway.log", "wb")
    proc = await anyio.open_process(gateway_command(state, policy, test_server_command()), stdin=-1, stdout=-1, stderr=log,
                                    cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    gw = RawGateway(proc)
    answers = []
    try:
        await gw.initialize(VERSION)
        for rpc_id, method, params in SCRIPT:
            await gw.send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
            answers.append(await gw.response(rpc_id, timeout=30))
    finally:
        assert proc.stdin is not None
        await proc.stdin.aclose()
        with anyio.fail_after(20):
            await proc.wait()
    return answers, _records(state)


async def _through_http(tmp: Path, policy: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    command = test_server_command()
    ups = [{"id": "py", "type": "mcp_stdio", "command": command[0], "args": command[1:],
            "env": {"PYTHONPATH": str(REPO)}}]
    answers = []
    async with serve_gateway(tmp / "http", ups, policy=policy, anonymous_user="tester") as gw:
        async with Raw(gw.url, key="") as raw:
            raw.http.headers.pop("x-api-key", None)
            await raw.initialize(VERSION)
            for rpc_id, method, params in SCRIPT:
                response = await raw.post({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
                answers.append(answer(response))
    return answers, _records(tmp / "http" / "state")


@pytest.mark.skipif(sys.platform == "win32", reason="stdio pipes")
async def test_same_session_same_answers_and_same_ledger_records(tmp_path: Path) -> None:
    policy = write_mcp_policy(tmp_path / "policy", timeout=5)
    (tmp_path / "http").mkdir()
    stdio_answers, stdio_records = await _through_stdio(tmp_path, policy)
    http_answers, http_records = await _through_http(tmp_path, policy)

    assert len(stdio_answers) == len(SCRIPT)
    for (rpc_id, method, _), a, b in zip(SCRIPT, stdio_answers, http_answers, strict=True):
        assert _normal(a) == _normal(b), f"answers to {rpc_id} ({method}) differ:\n{json.dumps(a)}\n{json.dumps(b)}"

    # The script's calls left records, in order, and both transports wrote the same ones.
    kinds = [(r.get("tool"), r.get("method"), r.get("decision"), r.get("status")) for r in stdio_records]
    assert ("echo", "tools/call", "allow", "ok") in kinds
    assert ("echo", "tools/call", "allow", None) in kinds  # its decision record, committed before the backend saw it
    assert ("write_note", "tools/call", "deny", "blocked") in kinds
    assert (None, "vendor/custom", "allow", "forwarded") in kinds
    assert sum(1 for r in stdio_records if r.get("stage") == "mcp") == 2  # the malformed arguments and name
    assert any(r.get("error_code") == "tool_not_found" and r.get("tool") == "admin_reset" for r in stdio_records)
    assert stdio_records == http_records
