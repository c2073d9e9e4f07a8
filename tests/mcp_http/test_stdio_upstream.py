"""An upstream launched over stdio behind /mcp (the conformance fixture in --stdio mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.mcp_http.conftest import CONFORMANCE, client, serve_gateway

MODES = ["legacy", "2026-07-28"]


@pytest.mark.parametrize("mode", MODES)
async def test_stdio_upstream_through_http(tmp_path: Path, mode: str) -> None:
    script = CONFORMANCE / "fixture_server.py"
    if not script.exists():
        pytest.skip(f"the conformance fixture is not at {script}")
    ups = [{"id": "fx", "type": "mcp_stdio", "command": sys.executable, "args": [str(script), "--stdio"]}]
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async with serve_gateway(tmp_path, ups) as gw:
        async with client(gw.url, "alice-key", mode=mode) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            assert "test_simple_text" in names
            r = await c.call_tool("test_simple_text", {})
            assert not r.is_error and r.content[0].text
            r = await c.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
            assert not r.is_error
    assert progress
