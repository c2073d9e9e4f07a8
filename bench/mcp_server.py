"""The MCP backend of the MCP benchmarks: a server built with the official `mcp` SDK with one
trivial tool, `echo(text) -> "echo: <text>"`.

    python bench/mcp_server.py stdio                  # newline-delimited JSON-RPC on stdin/stdout
    python bench/mcp_server.py http --url-file F      # Streamable HTTP on 127.0.0.1:<free port>/mcp
                                                      # (SDK defaults: stateful sessions, SSE replies)
    python bench/mcp_server.py http --json --url-file F   # the same, every POST answered with JSON
    ... --shape plain|record                          # echo's answer: text only (no structuredContent,
                                                      # no outputSchema), or a small object (below)

The URL is written to F once the server listens. Loopback only.
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

from pydantic import BaseModel

from mcp.server.mcpserver import MCPServer

#: echo's answer shapes: the SDK's default for a `str` return (a text block, plus `structuredContent`
#: `{"result": ...}` and an `outputSchema`); text only; a small object with its output schema.
SHAPES = ("default", "plain", "record")


class Echoed(BaseModel):
    """echo's answer in the `record` shape: a few fields of the kinds real tools return."""

    text: str
    length: int
    words: list[str]
    meta: dict[str, str]


def build(shape: str = "default") -> MCPServer:
    mcp = MCPServer("dharma-bench-echo", log_level="WARNING")

    if shape == "record":
        @mcp.tool(name="echo", description="Echo the text back.")
        def echo_record(text: str) -> Echoed:
            return Echoed(text=f"echo: {text}", length=len(text), words=text.split(), meta={"source": "bench"})
    else:
        @mcp.tool(description="Echo the text back.", structured_output=False if shape == "plain" else None)
        def echo(text: str) -> str:
            return f"echo: {text}"

    return mcp


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=("stdio", "http"))
    parser.add_argument("--url-file", help="http: where to write the URL once listening")
    parser.add_argument("--json", action="store_true", help="http: answer each POST with JSON, not an SSE stream")
    parser.add_argument("--shape", choices=SHAPES, default="default", help="echo's answer shape (see SHAPES)")
    args = parser.parse_args()
    mcp = build(args.shape)
    if args.transport == "stdio":
        mcp.run("stdio")
        return 0
    import anyio
    import uvicorn

    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket's proto is IPPROTO_TCP; with socket.socket()'s proto 0, every keep-alive
    # reply waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    app = mcp.streamable_http_app(json_response=args.json)

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if args.url_file:
                with open(args.url_file, "w", encoding="utf-8") as fh:
                    fh.write(url)

    server = Announcing(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1))
    anyio.run(lambda: server.serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
