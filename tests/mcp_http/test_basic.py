"""The official SDK client over Streamable HTTP, through the gateway, against the toy server
(both protocol eras): filtering, refusals, receipts, redaction, prefixes, progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.crypto.receipts import RECEIPT_META_KEY
from tests.mcp_http.conftest import call_raw, client, serve_gateway, upstream

MODES = ["legacy", "2026-07-28"]


@pytest.mark.parametrize("mode", MODES)
async def test_tools_filtered_and_calls_governed(toy_url: str, tmp_path: Path, mode: str) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with client(gw.url, "alice-key", mode=mode) as c:
            assert c.protocol_version == ("2025-11-25" if mode == "legacy" else mode)
            names = [t.name for t in (await c.list_tools()).tools]
            assert "echo" in names and "run_query" in names
            assert "admin_reset" not in names  # hidden from alice
            r = await c.call_tool("echo", {"message": "hi"})
            assert not r.is_error and r.content[0].text == "echo: hi"
            assert r.meta and r.meta[RECEIPT_META_KEY].count(".") == 2
            denied = await c.call_tool("echo", {"message": "/etc/passwd"})
            assert denied.is_error and "no /etc paths" in denied.content[0].text
            assert denied.meta["dharma.gateway/decision"]["error_code"] == "policy_blocked"
            leaked = await c.call_tool("read_config", {})
            assert "ghp_" not in leaked.content[0].text and "REDACTED" in leaked.content[0].text
            q = await c.call_tool("run_query", {"region": "eu-west", "query": "select 1"})
            assert q.content[0].text == "ran 'select 1' in eu-west", q
        async with client(gw.url, "admin-key", mode=mode) as c:
            assert "admin_reset" in [t.name for t in (await c.list_tools()).tools]


@pytest.mark.parametrize("mode", MODES)
async def test_hidden_tool_answers_like_unknown(toy_url: str, tmp_path: Path, mode: str) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with client(gw.url, "alice-key", mode=mode) as c:
            await c.list_tools()
            hidden = await call_raw(c, "admin_reset")
            unknown = await call_raw(c, "no_such_tool_at_all")
            assert hidden.replace("admin_reset", "X") == unknown.replace("no_such_tool_at_all", "X")


@pytest.mark.parametrize("mode", MODES)
async def test_progress_passes_through(toy_url: str, tmp_path: Path, mode: str) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with client(gw.url, "alice-key", mode=mode) as c:
            r = await c.call_tool("slow", {"steps": 3}, progress_callback=on_progress)
            assert r.content[0].text == "done after 3 steps"
    assert seen == [1, 2, 3]


@pytest.mark.parametrize("mode", MODES)
async def test_several_upstreams_with_prefixes(toy_url: str, fixture_url: str, tmp_path: Path, mode: str) -> None:
    ups = [upstream(toy_url, "toy", "fs_"), upstream(fixture_url, "fixture", "ev_")]
    async with serve_gateway(tmp_path, ups) as gw:
        async with client(gw.url, "admin-key", mode=mode) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            assert "fs_echo" in names and "ev_test_simple_text" in names and "echo" not in names
            r = await c.call_tool("fs_echo", {"message": "x"})
            assert r.content[0].text == "echo: x"
            r = await c.call_tool("ev_test_simple_text", {})
            assert not r.is_error and r.content[0].text
