"""MCP support: strict JSON-RPC (`jsonrpc`), per-connection state (`session`), MCP governance
shared by the transports (`governance`) and tool pinning (`pins`). The MCP commands of the CLI
are in `gateway.cli.mcp`.
"""
