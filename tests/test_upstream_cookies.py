"""Upstream clients keep no cookies: the gateway's client to an upstream is shared by every
caller, so a cookie an upstream sets while answering one caller must not go out with the next
caller's request (a session or CSRF cookie would carry one caller's server-side state to another).

The upstream is a real HTTP/1.1 server on a loopback socket that answers every request with a
`Set-Cookie` and records the `Cookie` header each request arrived with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.http_api import HttpBackend
from gateway.transports.upstreams.mcp_http import McpHttpUpstream

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@asynccontextmanager
async def cookie_setting_server() -> AsyncIterator[tuple[str, list[str | None]]]:
    """Yields the server's base URL and the Cookie header of each request (None when absent)."""
    seen: list[str | None] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                seen.append(fields.get("cookie"))
                request = json.loads(await reader.readexactly(int(fields.get("content-length", "0"))))
                rpc_id = request.get("id") if isinstance(request, dict) else None
                body = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": {"ok": True}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"set-cookie: session=caller-%d; Path=/\r\n" % len(seen)
                             + b"content-length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)  # localhost's IPv4 address
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://localhost:{port}", seen  # a host name: cookie jars (aiohttp's was one) ignore cookies from IP hosts
    finally:
        server.close()


async def test_mcp_http_upstream_does_not_replay_an_upstream_cookie() -> None:
    async with cookie_setting_server() as (url, seen):
        upstream = McpHttpUpstream("cookies", url + "/mcp")
        try:
            for i in range(2):
                body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {}}).encode()
                async with upstream.post(body, HEADERS, expect_id=i) as reply:
                    assert not reply.sse
        finally:
            await upstream.aclose()
    assert len(seen) == 2
    assert seen == [None, None], f"an upstream's cookie went out with a later request: {seen}"


async def test_http_tool_api_does_not_replay_an_upstream_cookie() -> None:
    async with cookie_setting_server() as (url, seen):
        backend = HttpBackend("cookies", url, [ToolSpec("echo", "echo", {"type": "object"})])
        try:
            for _ in range(2):
                await backend.send("echo", {"text": "hi"}, timeout=30.0)
        finally:
            await backend.aclose()
    assert len(seen) == 2
    assert seen == [None, None], f"an upstream's cookie went out with a later request: {seen}"
