"""MCP Streamable HTTP at `/mcp`: the ASGI endpoint (`app`) and its parts (see `app`'s docstring)."""
