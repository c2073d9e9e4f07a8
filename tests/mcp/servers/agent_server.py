"""An MCP server (official `mcp` SDK, stdio) with the tools an agent chains in the sequence
tests: read_file, write_file, run_script and fetch. None of them touches the disk, runs anything
or opens a socket: each logs its name to $MCP_TEST_CALL_LOG and answers with a fixed text, so a
test can tell what reached the backend."""

from __future__ import annotations

import os

import mcp_types as types
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("dharma-agent-tools")
CALLS = os.environ.get("MCP_TEST_CALL_LOG")


def _log(name: str) -> None:
    if CALLS:
        with open(CALLS, "a", encoding="utf-8") as f:
            f.write(name + "\n")


@mcp.tool(description="Read a file.")
def read_file(path: str) -> str:
    _log("read_file")
    return f"(contents of {path})"


@mcp.tool(description="Write a file.")
def write_file(path: str, content: str) -> str:
    _log("write_file")
    return f"wrote {len(content)} characters to {path}"


@mcp.tool(description="Run a script file.")
def run_script(path: str) -> str:
    _log("run_script")
    return f"ran {path}"


@mcp.tool(description="Fetch a URL.", annotations=types.ToolAnnotations(openWorldHint=True))
def fetch(url: str) -> str:
    _log("fetch")
    return "fetched"


if __name__ == "__main__":
    mcp.run()
