"""Bad input over stdio: clear JSON-RPC errors, the connection survives, the ledger records it.

One gateway process takes the whole list of malformed messages in turn (it must survive each);
the crashing and silent backends get their own.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from tests.mcp.conftest import backend_calls, ledger_records


async def test_malformed_messages_get_clear_errors_and_are_recorded(raw_gateway, tmp_path: Path, state: Path) -> None:
    gw = await raw_gateway("--max-message-bytes", "200000")
    await gw.initialize()

    async def error_for(payload: bytes | dict, rpc_id: object) -> dict:
        await gw.send(payload)
        answer = await gw.response(rpc_id)
        assert "error" in answer, answer
        return answer["error"]

    e = await error_for(b'{"jsonrpc":"2.0","id":1,"method":"tools/call",', None)
    assert e["code"] == -32700 and "Parse error" in e["message"]
    e = await error_for(b"[1", None)
    assert e["code"] == -32700
    e = await error_for(b'"just a string"', None)
    assert e["code"] == -32600 and "must be an object" in e["message"]
    e = await error_for(b"42", None)
    assert e["code"] == -32600
    e = await error_for({"id": 2, "method": "tools/call", "params": {"name": "echo"}}, 2)
    assert e["code"] == -32600 and '"jsonrpc" must be "2.0"' in e["message"] and "missing" in e["message"]
    e = await error_for({"jsonrpc": "1.0", "id": 3, "method": "ping"}, 3)
    assert e["code"] == -32600 and "'1.0'" in e["message"]
    e = await error_for({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"arguments": {}}}, 4)
    assert e["code"] == -32602 and "`name`" in e["message"]
    e = await error_for({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "echo", "arguments": "text=hi"}}, 5)
    assert e["code"] == -32602 and "must be an object" in e["message"]
    e = await error_for({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "echo", "arguments": [1]}}, 6)
    assert e["code"] == -32602
    big = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"' + b"a" * 300_000 + b'"}}}'
    e = await error_for(big, 7)
    assert e["code"] == -32600 and "exceeds" in e["message"] and "200000" in e["message"]
    # an unknown method is forwarded: the backend gives its own answer
    e = await error_for({"jsonrpc": "2.0", "id": 8, "method": "vendor/frobnicate", "params": {}}, 8)
    assert e["code"] == -32601
    # still serving
    ok = await gw.call(9, "echo", {"text": "alive"})
    assert ok["result"]["content"][0]["text"] == "echo: alive"
    assert backend_calls(tmp_path) == ["echo"]

    records = ledger_records(state)
    blocked = [r for r in records if r.get("status") == "blocked"]  # decision records have no status yet
    assert len(blocked) >= 10  # every malformed message above
    assert all(r["error_code"] == "invalid_params" for r in blocked)
    assert any(r.get("method") == "vendor/frobnicate" and r["status"] == "forwarded" for r in records)


async def test_multi_megabyte_lines_pass_both_ways(raw_gateway, tmp_path: Path) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    answer = await gw.call(1, "big", {"size": 5_000_000})
    assert len(answer["result"]["content"][0]["text"]) == 5_000_000
    text = "y" * 3_000_000
    echoed = await gw.call(2, "echo", {"text": text})
    assert echoed["result"]["content"][0]["text"] == "echo: " + text


async def test_backend_crash_mid_call_is_an_error_and_the_gateway_keeps_serving(raw_gateway, tmp_path: Path, state: Path) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    crashed = await gw.call(1, "crash", {})
    result = crashed["result"]
    assert result["isError"] is True
    assert result["_meta"]["dharma.gateway/decision"]["error_code"] == "backend_unavailable"
    assert "exited" in result["content"][0]["text"]
    # the server was restarted and re-initialized behind the client's back
    ok = await gw.call(2, "echo", {"text": "after crash"})
    assert ok["result"]["content"][0]["text"] == "echo: after crash"
    # the breaker counts failures in a row (the echo above closed it again): three more open it
    for i in range(3):
        crashed = await gw.call(10 + i, "crash", {})
        assert crashed["result"]["_meta"]["dharma.gateway/decision"]["error_code"] == "backend_unavailable"
    fast = await gw.call(20, "echo", {"text": "x"})
    assert fast["result"]["isError"] is True
    assert fast["result"]["_meta"]["dharma.gateway/decision"]["error_code"] == "backend_unavailable"
    crashes = [r for r in ledger_records(state) if r["tool"] == "crash"]
    records = [r for r in crashes if r.get("kind") != "decision"]  # one outcome (or single) record per call
    assert len(records) == 4 and all(r["error_code"] == "backend_unavailable" for r in records)
    # each call the breaker let through was decided (and recorded) before it was sent
    decided = {r["seq"] for r in crashes if r.get("kind") == "decision"}
    assert decided and decided == {r["decision_seq"] for r in records if r.get("kind") == "outcome"}
    # a pass-through request still works (only governed calls go through the breaker)
    await gw.send({"jsonrpc": "2.0", "id": 30, "method": "ping"})
    assert (await gw.response(30))["result"] == {}


async def test_backend_that_never_answers_times_out(raw_gateway, tmp_path: Path, state: Path) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    with anyio.fail_after(10):
        answer = await gw.call(1, "slow", {"seconds": 30})
    result = answer["result"]
    assert result["isError"] is True
    assert result["_meta"]["dharma.gateway/decision"]["error_code"] == "timeout"
    assert result["_meta"]["dharma.gateway/decision"]["retryable"] is True
    ok = await gw.call(2, "echo", {"text": "alive"})
    assert ok["result"]["content"][0]["text"] == "echo: alive"
    record = next(r for r in ledger_records(state) if r["tool"] == "slow" and r.get("kind") != "decision")
    assert record["status"] == "error" and record["error_code"] == "timeout"


def test_server_started_early_is_stopped_when_the_gateway_cannot_open(tmp_path: Path) -> None:
    """`dharma stdio` starts its server while it loads; a policy that does not load ends the
    command with a clear error (exit 2) and the server it started does not outlive it."""
    import os
    import subprocess
    import sys
    import time

    marker = f"dharma-early-server-{os.getpid()}-{tmp_path.name}"
    started = tmp_path / "started"
    # a server that does not exit when its stdin closes: only being stopped ends it
    server = f"import sys, time; open({str(started)!r}, 'w').close(); sys.stdin.read(); time.sleep(600)  # {marker}"
    bad = tmp_path / "broken.yaml"
    bad.write_text("apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: x\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_")}
    done = subprocess.run([sys.executable, "-m", "gateway", "--state-root", str(tmp_path / "state"), "stdio",
                           "--policy", str(bad), "--", sys.executable, "-c", server],
                          stdin=subprocess.PIPE, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "broken.yaml" in done.stderr and "Traceback" not in done.stderr

    def still_running() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(entry.name)
            except OSError:
                continue
        return found

    deadline = time.monotonic() + 60
    while still_running():
        assert time.monotonic() < deadline, f"the server outlived dharma stdio: {still_running()}"
        time.sleep(0.05)


def test_stdin_from_dev_null_ends_cleanly(tmp_path: Path) -> None:
    """An agent that gives `dharma stdio` no input (stdin from /dev/null, which the event loop cannot
    watch) gets a clean end of input: the command exits, no traceback (it used to hang, logging one)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_")}
    with open(os.devnull, "rb") as devnull:
        done = subprocess.run([sys.executable, "-m", "gateway", "--state-root", str(tmp_path / "state"), "stdio",
                               "--policy", "policies/permissive.yaml", "--", sys.executable, "-c",
                               "import sys; sys.stdin.read()"],
                              stdin=devnull, capture_output=True, text=True, timeout=120, env=env,
                              cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stdout == ""
