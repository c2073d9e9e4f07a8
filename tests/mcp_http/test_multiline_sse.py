"""SSE events whose data spans several `data:` lines survive the relay through `/mcp` whole.

Per the SSE spec a receiver joins an event's `data:` lines with "\\n", so an upstream may send a
JSON-RPC message pretty-printed over several lines. The gateway must hand its client the whole
message, both live and when a client resumes the stream from the gateway's own event store
(GET + `Last-Event-ID`): each line of the data goes out as its own `data:` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.mcp_http.conftest import serve_asgi, serve_gateway, upstream
from tests.mcp_http.raw import Raw, messages, sse_messages

TOOL = {"name": "echo", "description": "Echo the message back.",
        "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}


def _log(text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "logger": "multiline", "data": {"text": text, "lines": ["one", "two", "three"]}}}


def _sse(*events: dict[str, Any]) -> Response:
    """An event stream whose every message is pretty-printed, so its data spans several lines."""
    body = "".join(f"id: {i}\n" + "".join(f"data: {line}\n" for line in json.dumps(e, indent=2).split("\n")) + "\n"
                   for i, e in enumerate(events, 1))
    return Response(body, media_type="text/event-stream")


async def _mcp(request: Request) -> Response:
    """A minimal Streamable HTTP MCP server that answers tools/call and resources/read as multi-line SSE."""
    if request.method != "POST":
        return Response(status_code=405, headers={"allow": "POST"})
    msg = json.loads(await request.body())
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        return Response(status_code=202)
    if method == "initialize":
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}, "resources": {}, "logging": {}},
            "serverInfo": {"name": "multiline", "version": "1"}}}, headers={"mcp-session-id": "up-session"})
    if method == "tools/list":
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": {"tools": [TOOL]}})
    if method == "tools/call":
        text = msg["params"]["arguments"]["message"]
        return _sse(_log(f"calling echo with {text}"),
                    {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": f"echo: {text}"}]}})
    if method == "resources/read":
        return _sse(_log("reading"), {"jsonrpc": "2.0", "id": rid, "result": {"contents": [
            {"uri": msg["params"]["uri"], "mimeType": "text/plain", "text": "first line\nsecond line"}]}})
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})


def _event_ids(text: str) -> list[str]:
    return [line[3:].strip() for line in text.splitlines() if line.startswith("id:")]


async def test_multiline_sse_data_is_relayed_and_replayed_whole(tmp_path: Path) -> None:
    app = Starlette(routes=[Route("/mcp", _mcp, methods=["GET", "POST", "DELETE"])])
    async with serve_asgi(app) as up_base, serve_gateway(tmp_path, [upstream(up_base + "/mcp", id="multi")]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            # tools/call: the upstream's log notification passes through unchanged, with all its lines.
            r = await c.call("echo", {"message": "hi"})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            got = messages(r)
            assert _log("calling echo with hi") in got
            assert [m for m in got if m.get("id") == c.next_id][0]["result"]["content"][0]["text"] == "echo: hi"
            # A relayed request: the upstream's multi-line answer itself reaches the client whole.
            c.next_id += 1
            read = {"jsonrpc": "2.0", "id": c.next_id, "method": "resources/read", "params": {"uri": "file:///notes.txt"}}
            r = await c.post(read)
            got = messages(r)
            assert _log("reading") in got
            assert {"jsonrpc": "2.0", "id": c.next_id, "result": {"contents": [
                {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "first line\nsecond line"}]}} in got
            # Resuming from the gateway's priming id replays the same events from its store, still whole.
            primed = _event_ids(r.text)[0]
            status, replay = await c.fetch({"last-event-id": primed})
            assert status == 200 and sse_messages(replay) == got
