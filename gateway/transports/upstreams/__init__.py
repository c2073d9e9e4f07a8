"""Upstreams the gateway forwards to: Python callables (`python`), plain HTTP tool APIs
(`http_api`), MCP servers over Streamable HTTP (`mcp_http`) and over stdio (`mcp_stdio`)."""
