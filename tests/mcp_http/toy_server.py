"""A small MCP server (official `mcp` SDK, both protocol eras over Streamable HTTP) for the
gateway's HTTP tests: a tool that leaks a credential (redaction), one that needs approval, one
that never answers, one that kills the server mid-call, one with an `x-mcp-header` argument, and
one that answers the `_meta` it received (trace context).

Event ids are sequential ("1", "2", ...) and every event is kept, so a test can try to resume
(`Last-Event-ID`) a stream it never saw an id on: the replay hole the gateway must close.

    python toy_server.py --url-file F     # serves http://127.0.0.1:<free port>/mcp
    python toy_server.py --url-file F --no-delete   # answers every DELETE 405, as a server that
                                                    # lets no client end its session may
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from pydantic import Field

SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


class SequentialEventStore(EventStore):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.ids = itertools.count(1)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = str(next(self.ids))
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        index = next((i for i, e in enumerate(self.events) if e[0] == last_event_id), None)
        if index is None:
            return None
        stream = self.events[index][1]
        for event_id, stream_id, message in self.events[index + 1:]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


def build() -> MCPServer:
    mcp = MCPServer("toy-server")

    @mcp.tool()
    def echo(message: str) -> str:
        """Echo the message back."""
        return f"echo: {message}"

    @mcp.tool()
    def read_config(name: str = "app") -> str:
        """Read a configuration; it happens to contain a credential."""
        return f"config {name}: token={SECRET} region=eu"

    @mcp.tool()
    async def read_polled(ctx: Context, seconds: float = 0.2) -> str:
        """Close the SSE stream mid-call (2025-11-25 polling), then answer `seconds` later with the credential."""
        await anyio.sleep(0.05)
        await ctx.close_sse_stream()
        await anyio.sleep(seconds)
        return f"config polled: token={SECRET} region=eu"

    @mcp.tool()
    def read_meta(ctx: Context) -> str:
        """Answer the `_meta` this call arrived with (to see the trace context the gateway sent)."""
        params = ctx.request_context.params or {}
        return json.dumps(params.get("_meta") or {}, sort_keys=True)

    @mcp.tool()
    def delete_file(path: str) -> str:
        """Delete a file (needs a human's approval under the test policy)."""
        return f"deleted {path}"

    @mcp.tool()
    def admin_reset() -> str:
        """A tool only admins see."""
        return "reset done"

    @mcp.tool()
    async def slow(steps: int, ctx: Context) -> str:
        """Report progress `steps` times, then answer."""
        for i in range(steps):
            await ctx.report_progress(i + 1, steps)
            await anyio.sleep(0.02)
        return f"done after {steps} steps"

    @mcp.tool()
    async def hang() -> str:
        """Never answers."""
        await anyio.sleep(3600)
        return "unreachable"

    @mcp.tool()
    def crash() -> str:
        """Kill the server in the middle of the call."""
        os._exit(3)

    @mcp.tool()
    def run_query(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], query: str) -> str:
        """Run a query in a region (the region is mirrored into Mcp-Param-Region on 2026-07-28)."""
        return f"ran {query!r} in {region}"

    return mcp


def refusing_delete(app: Any) -> Any:
    """`app`, answering every DELETE 405 Method Not Allowed."""
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "DELETE":
            await send({"type": "http.response.start", "status": 405, "headers": [(b"allow", b"GET, POST")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)
    return guarded


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url-file", required=True)
    parser.add_argument("--no-delete", action="store_true", help="answer DELETE 405 (the spec allows it)")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    app = build().streamable_http_app(event_store=SequentialEventStore(), retry_interval=100)
    if args.no_delete:
        app = refusing_delete(app)

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            with open(args.url_file, "w", encoding="utf-8") as fh:
                fh.write(url)

    server = Announcing(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1))
    anyio.run(lambda: server.serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
