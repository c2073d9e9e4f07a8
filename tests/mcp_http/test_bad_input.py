"""Bad input over HTTP: the right JSON-RPC error, the endpoint keeps serving, the ledger records it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.mcp_http.conftest import serve_gateway, toy_server, upstream, write_profile
from tests.mcp_http.raw import Raw, answer, ledger_text

CASES = [
    ("invalid json", b'{"jsonrpc": "2.0", "id": 1, "method": ', 400, -32700, "Parse error"),
    ("not an object", b'"tools/call"', 400, -32600, "must be an object"),
    ("number", b"42", 400, -32600, "must be an object"),
    ("missing jsonrpc", b'{"id": 1, "method": "tools/call", "params": {"name": "echo"}}', 400, -32600, '"jsonrpc" must be "2.0"'),
    ("wrong jsonrpc", b'{"jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}', 400, -32600, '"jsonrpc" must be "2.0"'),
    ("call without name", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}}', 400, -32602, "needs `name`"),
    ("arguments not an object", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": [1]}}',
     400, -32602, "`arguments` must be an object"),
]


async def test_bad_messages_get_clear_errors_and_are_recorded(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            for label, body, status, code, text in CASES:
                r = await c.post(body)
                assert r.status_code == status, label
                error = answer(r)["error"]
                assert error["code"] == code and text in error["message"], (label, error)
            huge = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"message":"' + b"x" * 2_200_000 + b'"}}}'
            r = await c.post(huge)
            assert r.status_code == 413 and answer(r)["error"]["code"] == -32600 and "exceeds" in answer(r)["error"]["message"]
            assert answer(r)["id"] == 5
            unknown = await c.post({"jsonrpc": "2.0", "id": 6, "method": "no/such/method"})
            assert answer(unknown)["error"]["code"] == -32601
            ok = await c.call("echo", {"message": "fine"})
            assert "echo: fine" in ok.text
    ledger = ledger_text(tmp_path / "state")
    assert ledger.count('"stage":"mcp"') >= len(CASES) + 1


async def test_upstream_crash_mid_call_is_an_error_and_counts_against_the_breaker(tmp_path: Path) -> None:
    with toy_server(tmp_path) as (url, proc):
        async with serve_gateway(tmp_path, [upstream(url)]) as gw:
            async with Raw(gw.url) as c:
                await c.initialize()
                r = await c.call("crash")
                result = answer(r)["result"]
                assert result["isError"] is True
                assert result["_meta"]["dharma.gateway/decision"]["error_code"] in ("backend_unavailable", "backend_error")
                proc.wait(5)
                again = await c.call("echo", {"message": "x"})  # the upstream is gone: a second failure
                assert answer(again)["result"]["isError"] is True
                third = await c.call("echo", {"message": "x"})  # the breaker is open now
                assert answer(third)["result"]["_meta"]["dharma.gateway/decision"]["error_code"] == "backend_unavailable"
                health = await c.http.get(gw.base + "/healthz")
                assert health.status_code == 200  # still serving
    assert '"tool":"crash"' in ledger_text(tmp_path / "state")


async def test_upstream_that_never_answers_times_out(toy_url: str, tmp_path: Path) -> None:
    policy = write_profile(tmp_path / "policy", backend_timeout_seconds=1.0)
    async with serve_gateway(tmp_path, [upstream(toy_url)], policy) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            r = await c.call("hang")
            result = answer(r)["result"]
            assert result["isError"] is True and result["_meta"]["dharma.gateway/decision"]["error_code"] == "timeout"
            assert "the MCP server toy did not answer within 1s" in result["content"][0]["text"], result
            ok = await c.call("echo", {"message": "after"})
            assert "echo: after" in ok.text
    assert '"error_code":"timeout"' in ledger_text(tmp_path / "state")


async def test_a_client_that_hangs_up_cancels_its_call(toy_url: str, tmp_path: Path) -> None:
    """A client that disconnects mid-call cancels the handler and so the upstream request: the call
    that would have timed out after 1 s never gets a timeout outcome (a handler left running would
    record one), and the endpoint goes on serving."""
    policy = write_profile(tmp_path / "policy", backend_timeout_seconds=1.0)
    async with serve_gateway(tmp_path, [upstream(toy_url)], policy) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            pending = asyncio.ensure_future(c.call("hang"))
            deadline = time.monotonic() + 30
            while '"tool":"hang"' not in ledger_text(tmp_path / "state", wait=0.1):  # its decision record: forwarded
                assert time.monotonic() < deadline and not pending.done(), "the hang call was never forwarded"
                await asyncio.sleep(0.05)
            pending.cancel()  # httpx closes the connection: uvicorn reports http.disconnect
            await asyncio.gather(pending, return_exceptions=True)
        window = time.monotonic() + 4.0  # four backend timeouts: a handler still running would record one
        while time.monotonic() < window:
            assert '"error_code":"timeout"' not in ledger_text(tmp_path / "state", wait=0.1)
            await asyncio.sleep(0.1)
        async with Raw(gw.url) as c:
            await c.initialize()
            assert "echo: after" in (await c.call("echo", {"message": "after"})).text


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_modern_is_post_only(toy_url: str, tmp_path: Path, method: str) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            r = await c.http.request(method, gw.url, headers={"mcp-protocol-version": "2026-07-28"})
            assert r.status_code == 405


async def test_unauthenticated_gets_401(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url, key="wrong") as c:
            r = await c.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert r.status_code == 401 and "www-authenticate" in r.headers


async def test_foreign_origin_is_refused_before_the_endpoint(toy_url: str, tmp_path: Path) -> None:
    """/mcp is served without Starlette's layers, but still behind the one authentication guard:
    a browser Origin the gateway does not trust gets 403 (DNS rebinding), a loopback one passes."""
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            message = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            refused = await c.post(message, {"origin": "https://evil.example"})
            assert refused.status_code == 403 and refused.json()["error_code"] == "forbidden", refused.text
            local = await c.post(message, {"origin": gw.base})
            assert local.status_code != 403, local.text


async def test_the_principal_the_auth_guard_resolved_is_not_resolved_again(toy_url: str, tmp_path: Path) -> None:
    """/mcp takes the caller's principal from the authentication guard (`dharma.principal`, resolved
    from the same credentials a moment before) instead of resolving the API key again; the session
    is still bound to that principal, and a wrong key is still refused before the endpoint."""
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            real = gw.gateway.principal_for
            asked: list[object] = []
            gw.gateway.principal_for = lambda credentials: asked.append(credentials) or real(credentials)
            try:
                r = await c.post({"jsonrpc": "2.0", "id": 7, "method": "ping"})
            finally:
                del gw.gateway.principal_for
            assert r.status_code == 200 and answer(r)["id"] == 7 and "result" in answer(r)
            assert asked == []
        async with Raw(gw.url, key="wrong") as c:
            r = await c.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert r.status_code == 401
