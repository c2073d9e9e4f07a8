"""One catalog on every transport, and named tool groups (virtual servers), against real servers:
the official SDK client over `dharma serve`'s app, a python backend and a plain HTTP tool API (a
real server on a socket) served over MCP at `/mcp`, server-everything's kebab-case tools behind a
prefix, groups at `/mcp/{group}` and `/v1/groups/{group}/...`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.crypto.receipts import RECEIPT_META_KEY
from tests.mcp.conftest import ledger_records
from tests.mcp_http.conftest import call_raw, client, serve_asgi, serve_gateway, upstream, write_profile
from tests.mcp_http.native_tools import CITY_TOOL, http_api

MODES = ["legacy", "2026-07-28"]
CALC = {"id": "calc", "type": "python", "target": "tests.mcp_http.native_tools:backend"}
TIERS = [
    {"name": "user", "grants": [{"tools": ["add_numbers", "lookup_city", "ev_get-*", "ev_echo"]}]},
    {"name": "admin", "grants": [{"tools": ["*"]}]},
]
GROUPS = [
    {"name": "kebab", "description": "server-everything's get-* tools and the adder", "tools": ["ev_get-*", "add_numbers"]},
    {"name": "ops", "tools": ["*"], "roles": ["admin"]},
    {"name": "natives", "tools": ["add_numbers", "lookup_city", "admin_wipe"]},
]


@contextlib.asynccontextmanager
async def gateway_with(tmp: Path, *mcp_upstreams: dict[str, Any]) -> AsyncIterator[Any]:
    """`dharma serve`'s app with the python backend, the HTTP tool API (served here) and `mcp_upstreams`."""
    async with serve_asgi(http_api()) as api:
        cities = {"id": "cities", "type": "http", "url": api, "tools": [CITY_TOOL]}
        policy = write_profile(tmp / "policy", tiers=TIERS)
        async with serve_gateway(tmp, [*mcp_upstreams, CALC, cities], policy, config={"groups": GROUPS}) as gw:
            yield gw


@pytest.mark.parametrize("mode", MODES)
async def test_python_and_http_tools_over_mcp_without_an_mcp_upstream(tmp_path: Path, mode: str) -> None:
    async with gateway_with(tmp_path) as gw:
        async with client(gw.url, "alice-key", mode=mode) as c:
            assert c.protocol_version == ("2025-11-25" if mode == "legacy" else mode)
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == {"add_numbers", "lookup_city"}  # admin_wipe: not alice's
            add = tools["add_numbers"]
            assert add.description == "Add two integers." and add.input_schema["required"] == ["a", "b"]
            assert add.annotations is not None and add.annotations.read_only_hint is True
            assert tools["lookup_city"].annotations.open_world_hint is True
            r = await c.call_tool("add_numbers", {"a": 2, "b": 3})
            assert not r.is_error and r.structured_content == {"sum": 5}, r
            assert r.meta and r.meta[RECEIPT_META_KEY].count(".") == 2
            city = await c.call_tool("lookup_city", {"name": "Paris"})
            assert not city.is_error and city.structured_content == {"city": "Paris", "country": "FR"}, city
            hidden = await call_raw(c, "admin_wipe")
            unknown = await call_raw(c, "no_such_tool")
            assert hidden.replace("admin_wipe", "X") == unknown.replace("no_such_tool", "X")
            assert "Unknown tool" in unknown
        async with client(gw.url + "/kebab", "alice-key", mode=mode) as c:  # a group over the gateway's own server
            assert [t.name for t in (await c.list_tools()).tools] == ["add_numbers"]
            outside = await call_raw(c, "lookup_city", {"name": "Paris"})
            assert outside.replace("lookup_city", "X") == (await call_raw(c, "no_such_tool", {"name": "Paris"})).replace("no_such_tool", "X")
        async with client(gw.url, "admin-key", mode=mode) as c:
            assert (await c.call_tool("admin_wipe", {})).content[0].text == "wiped"
    calls = [r for r in ledger_records(tmp_path / "state") if r.get("tool") == "add_numbers" and r.get("status") == "ok"]
    assert calls and calls[-1]["backend"] == "calc" and calls[-1]["method"] == "tools/call"


async def test_own_server_answers_other_methods_as_mcp_says(tmp_path: Path) -> None:
    """Alone, the gateway's own server refuses a method it does not serve with -32601, and answers
    GET (no server-initiated stream) with 405."""
    async with gateway_with(tmp_path) as gw:
        headers = {"X-API-Key": "alice-key", "accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient(headers=headers) as http:
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
            opened = await http.post(gw.url, json=init)
            assert opened.status_code == 200 and opened.json()["result"]["protocolVersion"] == "2025-06-18"
            assert opened.json()["result"]["capabilities"]["tools"] == {"listChanged": False}
            sid = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
            pong = await http.post(gw.url, json={"jsonrpc": "2.0", "id": "p", "method": "ping"}, headers=sid)
            assert pong.json() == {"jsonrpc": "2.0", "id": "p", "result": {}}, pong.text
            prompts = await http.post(gw.url, json={"jsonrpc": "2.0", "id": 2, "method": "prompts/list"}, headers=sid)
            assert prompts.json()["error"]["code"] == -32601, prompts.text
            assert (await http.get(gw.url, headers=sid)).status_code == 405


async def test_group_over_server_everything_and_a_python_tool(everything_url: str, tmp_path: Path) -> None:
    async with gateway_with(tmp_path, upstream(everything_url, "everything", "ev_")) as gw:
        async with client(gw.url, "alice-key") as c:
            everything = {t.name for t in (await c.list_tools()).tools}
            assert {"ev_echo", "ev_get-sum", "add_numbers", "lookup_city"} <= everything
        async with client(gw.url + "/kebab", "alice-key") as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "ev_get-sum" in names and "add_numbers" in names, names
            assert names == {n for n in everything if n.startswith("ev_get-") or n == "add_numbers"}
            got = await c.call_tool("ev_get-sum", {"a": 2, "b": 40})
            assert not got.is_error and "42" in got.content[0].text, got
            assert (await c.call_tool("add_numbers", {"a": 1, "b": 1})).structured_content == {"sum": 2}
            outside = await call_raw(c, "ev_echo", {"message": "hi"})
            unknown = await call_raw(c, "ev_no-such-tool", {"message": "hi"})
            assert outside.replace("ev_echo", "X") == unknown.replace("ev_no-such-tool", "X"), (outside, unknown)
            native_outside = await call_raw(c, "lookup_city", {"name": "Paris"})
            native_unknown = await call_raw(c, "lookup_nothing", {"name": "Paris"})
            assert native_outside.replace("lookup_city", "X") == native_unknown.replace("lookup_nothing", "X")
        async with client(gw.url, "alice-key") as c:  # the same tool straight at /mcp still works
            assert "hi" in (await c.call_tool("ev_echo", {"message": "hi"})).content[0].text
    records = [r for r in ledger_records(tmp_path / "state") if r.get("tool") == "ev_get-sum" and "status" in r]
    assert records and records[-1]["group"] == "kebab"
    refused = [r for r in ledger_records(tmp_path / "state") if r.get("tool") == "ev_echo" and r.get("group") == "kebab"]
    assert refused and refused[-1]["error_code"] == "tool_not_found"


async def test_unknown_and_restricted_groups_are_404(tmp_path: Path) -> None:
    async with gateway_with(tmp_path) as gw:
        headers = {"accept": "application/json, text/event-stream"}
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        async with httpx.AsyncClient(headers=headers) as http:
            nowhere = await http.post(gw.url + "/nowhere", json=init, headers={"X-API-Key": "alice-key"})
            restricted = await http.post(gw.url + "/ops", json=init, headers={"X-API-Key": "alice-key"})
            assert nowhere.status_code == restricted.status_code == 404
            assert nowhere.json()["error"]["message"].replace("nowhere", "X") == restricted.json()["error"]["message"].replace("ops", "X")
            assert (await http.post(gw.url + "/ops", json=init, headers={"X-API-Key": "admin-key"})).status_code == 200
            assert (await http.post(gw.url + "/ops/deeper", json=init, headers={"X-API-Key": "admin-key"})).status_code == 404
            assert (await http.post(gw.url + "/nowhere", json=init)).status_code == 401  # who asks comes first


async def test_groups_on_v1(tmp_path: Path) -> None:
    async with gateway_with(tmp_path) as gw:
        async with httpx.AsyncClient(base_url=gw.base, headers={"X-API-Key": "alice-key"}) as http:
            everything = (await http.get("/v1/tools")).json()
            assert {t["name"] for t in everything["tools"]} == {"add_numbers", "lookup_city"}
            listed = await http.get("/v1/groups/kebab/tools")
            assert listed.status_code == 200 and [t["name"] for t in listed.json()["tools"]] == ["add_numbers"]
            done = await http.post("/v1/groups/kebab/tools/add_numbers:call", json={"arguments": {"a": 4, "b": 5}})
            assert done.status_code == 200 and done.json()["result"] == {"sum": 9}, done.text
            outside = await http.post("/v1/groups/kebab/tools/lookup_city:call", json={"arguments": {"name": "Paris"}})
            unknown = await http.post("/v1/tools/lookup_nothing:call", json={"arguments": {"name": "Paris"}})
            assert outside.status_code == unknown.status_code == 404
            volatile = ("request_id", "timestamp", "receipt")
            same = {k: v for k, v in outside.json().items() if k not in volatile}
            assert repr(same).replace("lookup_city", "X") == repr({k: v for k, v in unknown.json().items() if k not in volatile}).replace("lookup_nothing", "X")
            assert outside.json()["message"] == "Unknown tool: lookup_city"
            assert (await http.get("/v1/groups/nowhere/tools")).status_code == 404
            assert (await http.get("/v1/groups/ops/tools")).status_code == 404
            assert (await http.post("/v1/groups/ops/tools/add_numbers:call", json={})).status_code == 404
            admin = {"X-API-Key": "admin-key"}
            assert {t["name"] for t in (await http.get("/v1/groups/ops/tools", headers=admin)).json()["tools"]} == {
                "add_numbers", "lookup_city", "admin_wipe"}
            assert (await http.get("/v1/groups/kebab/tools", headers={"X-API-Key": "nobody"})).status_code == 401
    grouped = [r for r in ledger_records(tmp_path / "state") if r.get("group") == "kebab"]
    assert {(r["tool"], r.get("status")) for r in grouped if "status" in r} >= {("add_numbers", "ok"), ("lookup_city", "blocked")}
    plain = [r for r in ledger_records(tmp_path / "state") if r.get("tool") == "lookup_nothing"]
    assert plain and all("group" not in r for r in plain)
