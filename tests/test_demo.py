"""`make run`: the demo serves the HTTP tool API and MCP at /mcp, and its printed stdio snippet works."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.mcp_http.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


async def test_make_run_serves_mcp_and_the_printed_stdio_snippet_works(tmp_path):
    import httpx2
    from mcp import Client, ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    env = {**os.environ, "DHARMA_STATE_ROOT": str(tmp_path / "state"), "DHARMA_DEMO_SANDBOX": str(tmp_path / "sandbox")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "examples.run_demo", "--port", str(port)],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(f"{base}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("the demo did not start")
        http = httpx2.AsyncClient(headers={"X-API-Key": "demo-reader-key"})
        async with Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["read_file", "list_directory", "search"]  # the reader tier's view
            ok = await client.call_tool("read_file", {"path": "README.txt"})
            assert not ok.is_error and "demo sandbox" in ok.content[0].text
            assert "dharma.gateway/receipt" in (ok.meta or {})
            denied = await client.call_tool("read_file", {"path": "../../etc/passwd"})
            assert denied.is_error and "policy_blocked" in denied.content[0].text
    finally:
        demo.terminate()
        banner = demo.communicate(timeout=20)[1]
    snippet = json.loads(re.search(r'(\{\n  "mcpServers".*?\n\})\n', banner, re.S).group(1))["mcpServers"]["dharma-demo"]
    assert snippet["command"].endswith("dharma") and snippet["args"][0] == "stdio"
    params = StdioServerParameters(
        command=snippet["command"], args=snippet["args"], cwd=str(tmp_path), env={**env, **snippet["env"]}
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        assert "read_file" in [t.name for t in (await session.list_tools()).tools]
        denied = await session.call_tool("read_file", {"path": "../x"})
        assert denied.is_error and "policy_blocked" in denied.content[0].text
