"""A server that boots slower than the profile's backend timeout (an `npx` download, a loaded
machine) is not mistaken for one without the tool: the first spawn gets the restart grace, so the
first 2026-07-28 call, which makes the gateway list the server's tools, waits for it."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.mcp.conftest import TEST_SERVER, backend_calls

#: Seconds the wrapped server sleeps before it reads its stdin: twice the test profile's 1.5 s timeout.
BOOT_SECONDS = 3.0
SLOW_SERVER = [sys.executable, "-c",
               f"import runpy, sys, time; time.sleep({BOOT_SECONDS}); sys.argv = [{str(TEST_SERVER)!r}]; "
               f"runpy.run_path({str(TEST_SERVER)!r}, run_name='__main__')"]
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


async def test_first_2026_call_waits_for_a_slow_server_to_boot(raw_gateway, tmp_path: Path) -> None:
    gw = await raw_gateway(server=SLOW_SERVER)
    first = await gw.call(1, "echo", {"text": "cold"}, _meta=META)
    assert "error" not in first, first
    assert first["result"]["content"][0]["text"] == "echo: cold"
    assert backend_calls(tmp_path) == ["echo"]
