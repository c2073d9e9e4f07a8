"""The demo backend as an MCP server (built with the `mcp` SDK): the same file tools in a
sandbox, search and synthetic health records as `examples/demo_backend.py`.

    python -m examples.demo_mcp_server            # stdio
    python -m examples.demo_mcp_server --port 0   # Streamable HTTP on 127.0.0.1
    python -m examples.demo_mcp_server --port 9000 --host 0.0.0.0   # in a container (examples/deploy)
"""

from __future__ import annotations

import argparse
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from examples import demo_backend as demo

server = MCPServer("dharma-demo", version="0.1.0")
READ_ONLY = ToolAnnotations(readOnlyHint=True, destructiveHint=False, openWorldHint=False)
WRITES = ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False)


def _text(result: dict[str, Any]) -> str:
    return "\n".join(item["text"] for item in result["content"])


@server.tool(annotations=READ_ONLY)
def read_file(path: str) -> str:
    """Read a text file in the sandbox."""
    return _text(demo.read_file(path))


@server.tool(annotations=WRITES)
def write_file(path: str, content: str) -> str:
    """Write a text file in the sandbox."""
    return _text(demo.write_file(path, content))


@server.tool(annotations=READ_ONLY)
def list_directory(path: str = ".") -> str:
    """List a sandbox directory."""
    return _text(demo.list_directory(path))


@server.tool(annotations=WRITES)
def delete_file(path: str) -> str:
    """Delete a file in the sandbox."""
    return _text(demo.delete_file(path))


@server.tool(annotations=READ_ONLY)
def search(query: str, depth: str = "shallow") -> str:
    """Search the demo documents (depth: shallow or deep)."""
    return _text(demo.search(query, depth))


@server.tool(annotations=READ_ONLY)
def health_records(patient_id: str) -> str:
    """Look up a patient's health record (synthetic data), e.g. p-1001."""
    return _text(demo.health_records(patient_id))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, help="serve Streamable HTTP on HOST:PORT instead of stdio")
    parser.add_argument("--host", default="127.0.0.1", help="address for --port (default 127.0.0.1)")
    args = parser.parse_args()
    demo.backend()  # seed the sandbox
    if args.port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
