"""Tool poisoning over /mcp (issue 10): the shipped tool_definitions rules hide a poisoned tool
from `tools/list` and answer a call to it like an unknown tool, for one upstream and for several
(prefixed) ones, in both protocol eras; an injected result is withheld. The generous backend
timeout covers two stdio upstreams starting at once on a loaded machine. The upstream is the
real SDK server tests/mcp/servers/poison_server.py, launched over stdio behind /mcp."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.mcp_http.conftest import client, serve_gateway, write_profile

SERVER = REPO / "tests" / "mcp" / "servers" / "poison_server.py"
RULES = [str(REPO / "rules" / "tool_definitions.yaml"), str(REPO / "rules" / "mcp.yaml")]


def poison_upstream(id: str, prefix: str = "") -> dict[str, object]:
    return {"id": id, "type": "mcp_stdio", "command": sys.executable, "args": [str(SERVER)], "prefix": prefix}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("prefixes", [[""], ["a_", "b_"]], ids=["one-upstream", "two-upstreams"])
async def test_poisoned_tool_is_hidden_over_http(tmp_path: Path, mode: str, prefixes: list[str]) -> None:
    grants = [{"tools": [f"{p}get_*" for p in prefixes] + [f"{p}search_*" for p in prefixes]}]
    policy = write_profile(tmp_path / "policy", backend_timeout_seconds=30.0, tiers=[{"name": "user", "grants": grants}, {"name": "admin", "grants": [{"tools": ["*"]}]}], rule_sets=RULES)
    ups = [poison_upstream(f"up{i}", p) for i, p in enumerate(prefixes)]
    async with serve_gateway(tmp_path, ups, policy) as gw:
        async with client(gw.url, "alice-key", mode=mode) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            for p in prefixes:
                assert {f"{p}get_echo", f"{p}get_time", f"{p}search_web"} <= names
                assert f"{p}get_sum" not in names
            p = prefixes[-1]
            hidden = await c.call_tool(f"{p}get_sum", {"a": 1, "b": 2})
            unknown = await c.call_tool(f"{p}get_sux", {"a": 1, "b": 2})
            assert hidden.is_error and unknown.is_error
            assert hidden.content[0].text.replace("get_sum", "NAME") == unknown.content[0].text.replace("get_sux", "NAME")
            assert (await c.call_tool(f"{p}get_echo", {"text": "hi"})).content[0].text == "echo: hi"
            withheld = await c.call_tool(f"{p}search_web", {"query": "weather"})
            assert not withheld.is_error and [x.text for x in withheld.content] == ["No matching records found."]
