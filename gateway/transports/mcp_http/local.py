"""The gateway's own MCP server: the tools of its python and HTTP backends (`type: python | http`)
as an in-process upstream of `/mcp`, with the `Upstream` interface of the real ones.

`/mcp` governs it exactly as it governs a remote MCP server: `tools/list` is filtered per principal
and group, `tools/call` goes through the one flow (`gateway.mcp.calls`), and only an allowed call
reaches `post`, which calls the tool's `Backend`. When no MCP upstream is configured it is the only
(primary) upstream, so `/mcp` is a complete MCP server for every revision the gateway supports:
`initialize` and `ping` (legacy revisions: the client's when supported, else the newest),
`server/discover` and the `_meta` envelope (2026-07-28), `tools/list`, `tools/call`; any other method gets
-32601, a notification or a client's answer 202, GET 405 (no server-initiated messages).

A tool's answer becomes a CallToolResult: a value that already is one (`content` a list) as is,
else one text block of its JSON (a string as it is) and, for an object, `structuredContent`. A
backend's own failure is `isError: true` (MCP's tool error); a timeout or an unreachable backend is
an `UpstreamError`, which the governed call reports as `timeout` / `backend_unavailable`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.core.backends import BackendResult
from gateway.core.call import ToolInfo
from gateway.core.errors import CallError, ErrorCode
from gateway.core.gateway import Gateway
from gateway.mcp import jsonrpc
from gateway.mcp.versions import LEGACY_VERSIONS, META_CAPABILITIES, META_VERSION, MODERN_VERSIONS, UNSUPPORTED_VERSION
from gateway.transports.upstreams.replies import UpstreamError, UpstreamReply

#: The id `/mcp` knows the gateway's own server by (in logs and the catalog; never a tool's backend on the record).
LOCAL_ID = "dharma"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
_JSON = {"content-type": "application/json"}
_CAPABILITIES = {"tools": {"listChanged": False}}


def definition(info: ToolInfo) -> dict[str, Any]:
    """A catalog tool as an MCP tool definition (an object schema when none was configured)."""
    tool: dict[str, Any] = {"name": info.name, "description": info.description,
                            "inputSchema": info.input_schema if info.input_schema is not None else {"type": "object"}}
    if info.output_schema is not None:
        tool["outputSchema"] = info.output_schema
    if info.annotations:
        tool["annotations"] = dict(info.annotations)
    return tool


def call_result(answer: BackendResult) -> dict[str, Any]:
    """A backend's answer as a CallToolResult (see the module docstring)."""
    value = answer.result
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        return {**value, "isError": True} if answer.is_error else value
    text = value if isinstance(value, str) else jsonrpc.dumps(value).decode()
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if isinstance(value, dict):
        out["structuredContent"] = value
    if answer.is_error:
        out["isError"] = True
    return out


class LocalServer:
    """The gateway's own backends as an MCP upstream of `/mcp` (see the module docstring)."""

    prefix = ""
    forward_host = False
    originates = False  # never sends a request to the client: its ids need no namespace

    def __init__(self, gateway: Gateway, *, id: str = LOCAL_ID, version: str = "0") -> None:
        self.id = id
        self.gateway = gateway
        self.info = {"name": "dharma-gateway", "version": version}
        self.names = frozenset(info.name for info in gateway.catalog())
        self._tools = [definition(info) for info in gateway.catalog()]

    def serves(self, name: str) -> bool:
        return name in self.names

    def tool_info(self, name: str) -> ToolInfo | None:
        """The catalog's own definition of `name`: what `/v1` governs it as, so both decide alike."""
        served = self.gateway.served(name)
        return served[0] if served is not None else None

    @contextlib.asynccontextmanager
    async def post(self, body: bytes, headers: Mapping[str, str], *, expect_id: jsonrpc.RpcId | None = None) -> AsyncIterator[UpstreamReply]:
        try:
            msg = jsonrpc.loads(body)
        except ValueError:
            yield _reply(jsonrpc.error(None, jsonrpc.PARSE_ERROR, "Parse error"), 400)
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("method"), str) or "id" not in msg:
            yield UpstreamReply(202, {}, False)  # a notification or a client's answer: nothing to do
            return
        yield _reply(await self.answer(msg["id"], msg["method"], msg.get("params")))

    async def answer(self, rpc_id: jsonrpc.RpcId, method: str, params: Any) -> dict[str, Any]:
        """The JSON-RPC answer to one request."""
        params = params if isinstance(params, dict) else {}
        meta = params.get("_meta")
        modern = isinstance(meta, dict) and META_VERSION in meta
        if modern:
            assert isinstance(meta, dict)
            if META_CAPABILITIES not in meta:
                return jsonrpc.error(rpc_id, jsonrpc.INVALID_PARAMS, f"Invalid params: _meta must carry '{META_CAPABILITIES}'")
            if meta[META_VERSION] not in MODERN_VERSIONS:
                return jsonrpc.error(rpc_id, UNSUPPORTED_VERSION, "Unsupported protocol version",
                                     {"supported": sorted(MODERN_VERSIONS), "requested": meta[META_VERSION]})
        if method == "initialize" and not modern:
            asked = params.get("protocolVersion")
            version = asked if asked in LEGACY_VERSIONS else max(LEGACY_VERSIONS)
            return jsonrpc.result(rpc_id, {"protocolVersion": version, "capabilities": _CAPABILITIES, "serverInfo": self.info})
        if method == "server/discover" and modern:
            return self._modern(rpc_id, {"supportedVersions": sorted(MODERN_VERSIONS), "capabilities": _CAPABILITIES})
        if method == "ping" and not modern:  # 2026-07-28 has no ping
            return jsonrpc.result(rpc_id, {})
        if method == "tools/list":
            return self._modern(rpc_id, {"tools": self._tools}) if modern else jsonrpc.result(rpc_id, {"tools": self._tools})
        if method == "tools/call":
            result = await self._call(params)
            if "error" in result:
                return {"jsonrpc": "2.0", "id": rpc_id, **result}
            return self._modern(rpc_id, result) if modern else jsonrpc.result(rpc_id, result)
        return jsonrpc.error(rpc_id, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")

    def _modern(self, rpc_id: jsonrpc.RpcId, result: dict[str, Any]) -> dict[str, Any]:
        """A 2026-07-28 result: `resultType`, the caching fields of a listing, the server's stamp."""
        out = {**result, "resultType": "complete"}
        if "tools" in result or "supportedVersions" in result:
            out.update(ttlMs=0, cacheScope="private")
        meta = out.get("_meta")
        out["_meta"] = {**(meta if isinstance(meta, dict) else {}), SERVER_INFO_META: dict(self.info)}
        return jsonrpc.result(rpc_id, out)

    async def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        """Call the tool's backend: a CallToolResult, or {"error": ...} for an unknown tool or bad arguments."""
        name = params.get("name")
        served = self.gateway.served(name) if isinstance(name, str) and name in self.names else None
        if served is None:
            return {"error": {"code": jsonrpc.INVALID_PARAMS, "message": f"Unknown tool: {name}"}}
        arguments = params.get("arguments")
        try:
            answer = await served[1].send(str(name), arguments if isinstance(arguments, dict) else {},
                                          timeout=self.gateway.policy.backend_timeout_seconds)
        except CallError as exc:
            if exc.code is ErrorCode.TIMEOUT:
                raise UpstreamError("timeout", exc.message) from None
            if exc.code is ErrorCode.BACKEND_UNAVAILABLE:
                raise UpstreamError("unavailable", exc.message) from None
            if exc.code in (ErrorCode.INVALID_PARAMS, ErrorCode.TOOL_NOT_FOUND):
                return {"error": {"code": jsonrpc.INVALID_PARAMS, "message": f"Invalid params: {exc.message}"}}
            return {"content": [{"type": "text", "text": exc.message}], "isError": True}
        return call_result(answer)

    @contextlib.asynccontextmanager
    async def get(self, headers: Mapping[str, str]) -> AsyncIterator[UpstreamReply]:
        yield UpstreamReply(405, {"allow": "POST, DELETE"}, False)

    async def delete(self, headers: Mapping[str, str]) -> UpstreamReply:
        return UpstreamReply(200, {}, False)

    async def aclose(self) -> None:
        return None


def _reply(message: dict[str, Any], status: int = 200) -> UpstreamReply:
    return UpstreamReply(status, dict(_JSON), False, body=jsonrpc.dumps(message))
