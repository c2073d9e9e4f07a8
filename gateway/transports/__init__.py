"""Transports: how governed calls arrive (MCP over stdio, MCP over HTTP, the HTTP tool API)."""
