"""An MCP server (official `mcp` SDK) whose catalog holds two tools whose names differ only in
separator style (`get_total` and `get-total`) beside an ordinary one (`get-echo`): tool globs fold
the two to one name, so the gateway must refuse both (tests/mcp/test_tool_name_styles.py)."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("dharma-clash-server")
CALLS = os.environ.get("MCP_TEST_CALL_LOG")


def _log(name: str) -> None:
    if CALLS:
        with open(CALLS, "a", encoding="utf-8") as f:
            f.write(name + "\n")


def total_snake(a: int, b: int) -> str:
    _log("get_total")
    return str(a + b)


def total_kebab(a: int, b: int) -> str:
    _log("get-total")
    return str(a - b)


def echo(text: str) -> str:
    _log("get-echo")
    return text


mcp.add_tool(total_snake, name="get_total", description="Add two numbers.")
mcp.add_tool(total_kebab, name="get-total", description="Subtract two numbers.")
mcp.add_tool(echo, name="get-echo", description="Echo a text.")

if __name__ == "__main__":
    mcp.run("stdio")
