"""Hostile bodies against `/mcp` and the HTTP tool API (issue 12): never a 500, always the right
4xx / JSON-RPC error, the endpoint keeps serving, and no refused tool reaches the server.

`/mcp` fronts the stdio test server of tests/mcp (its call log shows what ran); the bodies are
the fixed corpus of tests/fuzz/strategies.py and seeded mutations of admin_reset calls, which
the test principal may not call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from gateway.crypto.strict_json import MAX_DEPTH
from tests.fuzz.strategies import HOSTILE_LINES, seeded_mutations
from tests.mcp.conftest import TEST_SERVER, backend_calls
from tests.mcp_http.conftest import serve_gateway
from tests.mcp_http.raw import Raw, messages

#: Bodies whose answer is known exactly: (HTTP status, JSON-RPC id, code, words in the message).
EXPECTED = {
    "deep-array": (400, None, -32700, f"nest deeper than {MAX_DEPTH} levels"),
    "deep-params": (400, None, -32700, "(the limit)"),
    "surrogate-id": (400, None, -32600, "lone surrogate"),
    "surrogate-id-call": (400, None, -32600, "lone surrogate"),
    "surrogate-argument": (400, 2, -32600, "lone surrogate"),
    "duplicate-in-batch": (400, None, -32600, "duplicate key"),
    "float-overflow": (400, None, -32700, "range of a double"),
    "huge-integer-id": (400, None, -32700, "4300 digits"),
    "bom": (400, None, -32700, "byte order mark"),
    "nan": (400, None, -32700, "NaN"),
}


async def test_mcp_endpoint_survives_every_hostile_body(tmp_path: Path) -> None:
    ups = [{"id": "py", "type": "mcp_stdio", "command": sys.executable, "args": [str(TEST_SERVER)],
            "env": {"MCP_TEST_CALL_LOG": str(tmp_path / "calls.log")}}]
    bodies = [(label, body) for label, body in HOSTILE_LINES.items() if body.strip()]
    bodies += [(f"mutation-{i}", body) for i, body in enumerate(seeded_mutations(40))]
    async with serve_gateway(tmp_path, ups) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            for n, (label, body) in enumerate(bodies):
                r = await c.post(body)
                assert r.status_code < 500, (label, r.status_code, r.text[:300])
                if label in EXPECTED:
                    status, rpc_id, code, words = EXPECTED[label]
                    (error,) = [m for m in messages(r) if "error" in m]
                    assert (r.status_code, error["id"], error["error"]["code"]) == (status, rpc_id, code), (label, error)
                    assert words in error["error"]["message"], (label, error)
                pong = await c.post({"jsonrpc": "2.0", "id": f"ping-{n}", "method": "ping"})
                assert pong.status_code == 200 and messages(pong)[-1] == {"jsonrpc": "2.0", "id": f"ping-{n}", "result": {}}, label
            ok = await c.call("echo", {"text": "still here"})
            assert "echo: still here" in ok.text
    assert "admin_reset" not in backend_calls(tmp_path)


TOOL_API_EXPECTED = {
    "deep-array": f"nest deeper than {MAX_DEPTH} levels",
    "surrogate-argument": "lone surrogate",
    "bom": "byte order mark",
    "duplicate-name": "duplicate JSON key 'name'",
    "float-overflow": "range of a double",
    "huge-integer-id": "4300 digits",
}


async def test_tool_api_answers_hostile_bodies_with_400(demo_gateway) -> None:
    """`POST /v1/tools/{name}:call`: every malformed body is a recorded 400 invalid_params naming
    the problem, never a 500."""
    from gateway.transports.http_api.app import build_app

    app = build_app(demo_gateway, max_body_bytes=2_000_000)
    bodies = list(HOSTILE_LINES.items()) + [(f"mutation-{i}", b) for i, b in enumerate(seeded_mutations(40))]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as http:
        for label, body in bodies:
            r = await http.post("/v1/tools/read_file:call", content=body, headers={"x-api-key": "operator-key"})
            assert r.status_code < 500, (label, r.text[:300])
            env = r.json()
            if r.status_code == 400:
                assert env["error_code"] == "invalid_params" and env["message"], (label, env)
            if label in TOOL_API_EXPECTED:
                assert r.status_code == 400 and TOOL_API_EXPECTED[label] in env["message"], (label, env)
        ok = await http.post("/v1/tools/list_directory:call", json={"arguments": {}}, headers={"x-api-key": "operator-key"})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("tail", [
    "[" * 5000,
    '"\\ud800"', "1e400", "NaN", '{"a":1,"a":2}',
])
async def test_a_client_answer_with_a_hostile_namespaced_id_is_survived(tmp_path: Path, tail: str) -> None:
    """Answers to server→client requests carry the gateway's namespaced id, whose tail is the
    upstream's original id as JSON, chosen by whoever writes the answer: none may crash /mcp."""
    ups = [{"id": "py", "type": "mcp_stdio", "command": sys.executable, "args": [str(TEST_SERVER)]}]
    async with serve_gateway(tmp_path, ups) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            r = await c.post({"jsonrpc": "2.0", "id": f"dharma.gateway/u/py/{tail}", "result": {}})
            assert r.status_code < 500, (r.status_code, r.text[:200])
            pong = await c.post({"jsonrpc": "2.0", "id": "after", "method": "ping"})
            assert messages(pong)[-1] == {"jsonrpc": "2.0", "id": "after", "result": {}}
