"""`dharma stdio` answers the agent's handshake while the gateway loads, and governs everything
else only once it has: the policy is read from a FIFO here, so the load stays blocked until the
test writes it (no timing involved)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from gateway.crypto.receipts import RECEIPT_META_KEY
from tests.mcp.conftest import REPO, TEST_PROFILE, backend_calls, ledger_records

NO_WATCH = "reload: {watch: false}\n"  # the watcher would read the FIFO again


def fifo_policy(mcp_policy: Path) -> tuple[Path, str]:
    """A FIFO next to the test profile (its rule files resolve the same way), and the text to write into it."""
    fifo = mcp_policy.parent / "slow-profile.yaml"
    os.mkfifo(fifo)
    return fifo, TEST_PROFILE % {"timeout": 10, "mcp_rules": REPO / "rules" / "mcp.yaml"}


def feed(fifo: Path, text: str) -> None:
    with open(fifo, "w", encoding="utf-8") as out:  # blocks until the gateway opens it
        out.write(text)


async def test_initialize_is_answered_before_the_policy_is_read_and_a_call_waits_for_it(
        raw_gateway: Any, mcp_policy: Path, tmp_path: Path, state: Path) -> None:
    fifo, text = fifo_policy(mcp_policy)
    config = tmp_path / "dharma.yaml"
    config.write_text(NO_WATCH)
    gw = await raw_gateway("--config", str(config), policy=fifo)
    hello = await gw.initialize()  # the policy has not been read: nobody has written the FIFO
    assert hello["result"]["serverInfo"]["name"], hello
    await gw.send(b"[" * 20_000 + b"]" * 20_000)  # too deep for any JSON parser: refused once loaded
    await gw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "early"}}})
    assert backend_calls(tmp_path) == [] and not (state / "ledger.db").exists()
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, feed, fifo, text)
        answer = await gw.response(2, timeout=60)
    assert any(isinstance(m, dict) and m.get("error", {}).get("code") == -32700 for m in gw.seen), gw.seen
    result = answer["result"]
    assert result["content"][0]["text"] == "echo: early" and RECEIPT_META_KEY in result["_meta"], answer
    assert backend_calls(tmp_path) == ["echo"]
    decided = [r for r in ledger_records(state) if r["tool"] == "echo" and r.get("kind") == "decision"]
    assert len(decided) == 1 and decided[0]["decision"] == "allow", decided


async def test_a_policy_that_does_not_load_lets_no_call_through(raw_gateway: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: x\n", encoding="utf-8")
    gw = await raw_gateway(policy=broken)
    await gw.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "0"}}})
    await gw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}})
    with anyio.fail_after(60):
        code = await gw.proc.wait()
    assert code == 2
    assert backend_calls(tmp_path) == []
    assert "broken.yaml" in (tmp_path / "gateway0.log").read_text()


async def test_loading_while_the_server_boots_runs_at_a_lower_priority_and_reports_failures() -> None:
    """A polite step runs in a thread of its own at LOADER_NICENESS (the pooled threads, which the
    ledger and later work use, keep their priority); its exception reaches the caller."""
    import threading

    import pytest

    from gateway.transports.mcp_stdio.proxy import LOADER_NICENESS, run_off_loop

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base = await run_off_loop(niceness, polite=False)
    assert await run_off_loop(niceness, polite=True) == min(base + LOADER_NICENESS, 19)
    assert await run_off_loop(niceness, polite=False) == base
    with pytest.raises(ZeroDivisionError):
        await run_off_loop(lambda: 1 / 0, polite=True)


def test_dharma_stdio_runs_on_uvloop_when_piped(monkeypatch: Any, tmp_path: Path) -> None:
    """`dharma stdio` moves every message through its event loop: on an agent's pipes it uses
    uvloop's (C) loop, as `dharma serve` does, not asyncio's pure-Python selector loop; on
    anything else (a terminal, a file) asyncio's, which sees a terminal's end of input."""
    import asyncio
    import sys

    import uvloop

    from gateway.cli.main import main
    from gateway.transports.mcp_stdio import proxy

    seen: list[asyncio.AbstractEventLoop] = []

    async def fake_serve_stdio(load_settings: Any, command: Any, **options: Any) -> int:
        seen.append(asyncio.get_running_loop())
        return 0

    monkeypatch.setattr(proxy, "serve_stdio", fake_serve_stdio)
    read_end, write_end = os.pipe()
    with open(read_end, "rb") as stdin, open(write_end, "wb") as stdout:
        monkeypatch.setattr(sys, "stdin", stdin)
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["stdio", "--", "true"]) == 0
    with open(tmp_path / "in", "wb+") as stdin, open(tmp_path / "out", "wb") as stdout:
        monkeypatch.setattr(sys, "stdin", stdin)
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["stdio", "--", "true"]) == 0
    assert len(seen) == 2 and isinstance(seen[0], uvloop.Loop) and not isinstance(seen[1], uvloop.Loop)


def test_dharma_stdio_on_a_terminal_answers_and_exits_cleanly(tmp_path: Path, state: Path, mcp_policy: Path) -> None:
    """Run by hand in a terminal, stdin and stdout are one tty: on uvloop its read and write
    transports must both work on it (a duplicated descriptor for each did not: the write side
    swallowed the input), and at end of input (^D) the command exits 0 without a traceback
    (the loop closing its transports must not close `sys.stdout`, which the exit flushes)."""
    import json
    import os
    import pty
    import select
    import subprocess
    import termios
    import time

    from tests.mcp.conftest import gateway_command, gateway_env, test_server_command

    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # no \r\n on output
    attrs[3] &= ~termios.ECHO  # the input is not echoed back to us
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    env = {**os.environ, **gateway_env(tmp_path)}
    proc = subprocess.Popen(gateway_command(state, mcp_policy, test_server_command()), stdin=slave, stdout=slave,
                            stderr=subprocess.PIPE, env=env, cwd=REPO)
    os.close(slave)
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        os.write(master, json.dumps(hello).encode() + b"\n")
        received = b""
        deadline = time.monotonic() + 60
        while b"\n" not in received:
            assert time.monotonic() < deadline, f"no answer on the terminal; got {received!r}"
            if select.select([master], [], [], 1)[0]:
                received += os.read(master, 65536)
        answer = json.loads(received.split(b"\n")[0])
        assert answer["id"] == 1 and "protocolVersion" in answer["result"]
        os.write(master, b"\x04")  # ^D at the start of a line: end of input
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert proc.returncode == 0, err.decode(errors="replace")
    assert b"Traceback" not in err
