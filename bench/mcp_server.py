"""The MCP backend of the MCP benchmarks: a server built with the official `mcp` SDK with one
trivial tool, `echo(text) -> "echo: <text>"`.

    python bench/mcp_server.py stdio                  # newline-delimited JSON-RPC on stdin/stdout
    python bench/mcp_server.py http --url-file F      # Streamable HTTP on 127.0.0.1:<free port>/mcp
                                                      # (SDK defaults: stateful sessions, SSE replies)
    python bench/mcp_server.py http --json --url-file F   # the same, every POST answered with JSON

The URL is written to F once the server listens. Loopback only.
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer


def build() -> MCPServer:
    mcp = MCPServer("dharma-bench-echo", log_level="WARNING")

    @mcp.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return f"echo: {text}"

    return mcp


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=("stdio", "http"))
    parser.add_argument("--url-file", help="http: where to write the URL once listening")
    parser.add_argument("--json", action="store_true", help="http: answer each POST with JSON, not an SSE stream")
    args = parser.parse_args()
    mcp = build()
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
