"""The Backend an allowed `tools/call` on `/mcp` is forwarded through (`_Forwarder`: one upstream
POST, its intermediate messages streamed to the client as they come) and the rendering of a governed
outcome with the HTTP status it mirrors (`_render`).
"""

from __future__ import annotations

from typing import Any

import anyio

from gateway.core.backends import BackendResult
from gateway.core.call import Outcome, ToolInfo
from gateway.core.errors import CallError, ErrorCode
from gateway.core.gateway import Gateway
from gateway.mcp import governance as gov
from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Request
from gateway.transports.mcp_http.relay import McpHttpRelay
from gateway.transports.mcp_http.reply import Reply
from gateway.transports.mcp_http.state import Ctx, Upstream
from gateway.transports.upstreams.mcp_http import UpstreamError


class _Forwarder(gov.AnswerRecorder):
    """The Backend `Gateway.govern` forwards an allowed call through: one upstream POST, whose
    intermediate messages (progress, logs, server requests) stream to the client as they come."""

    def __init__(self, app: McpHttpRelay, ctx: Ctx, reply: Reply, req: Request, upstream: Upstream, upstream_name: str,
                 info: ToolInfo | None) -> None:
        self.app, self.ctx, self.reply, self.req = app, ctx, reply, req
        self.upstream, self.upstream_name, self.info = upstream, upstream_name, info
        self.id = upstream.id
        super().__init__()
        self.status = 200

    async def send(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> BackendResult:
        req, ctx, app = self.req, self.ctx, self.app
        params = dict(req.params) if isinstance(req.params, dict) else {}
        params["name"] = self.upstream_name
        if "arguments" in params or arguments:
            params["arguments"] = arguments
        message = {**req.message, "params": params}
        schema = self.info.input_schema if self.info is not None else None
        headers = app._up_headers(ctx, self.upstream, message, schema)
        response: dict[str, Any] | None = None
        try:
            with anyio.fail_after(timeout):
                cm = self.upstream.post(jsonrpc.dumps(message), headers, expect_id=req.id)
                up = await cm.__aenter__()
            try:
                self.status = up.status
                if up.sse:
                    await self.reply.open_sse(200, app._session_header(ctx))
                    up.on_pause = self.reply.detach
                stream = up.messages().__aiter__()
                while response is None:
                    with anyio.fail_after(timeout):
                        try:
                            chunk = await stream.__anext__()
                        except StopAsyncIteration:
                            break
                    try:
                        msg = jsonrpc.loads(chunk)
                    except ValueError:
                        continue
                    if isinstance(msg, dict) and msg.get("id") == req.id and ("result" in msg or "error" in msg) and "method" not in msg:
                        response = msg
                        break
                    out = await app._from_upstream(ctx, self.upstream, chunk, None, None)
                    if out is not None:
                        await self.reply.event(out)
            finally:
                with anyio.CancelScope(shield=True):
                    await cm.__aexit__(None, None, None)
        except TimeoutError:
            raise CallError(ErrorCode.TIMEOUT, f"the MCP server {self.upstream.id} did not answer within {timeout:g}s") from None
        except UpstreamError as exc:
            code = ErrorCode.TIMEOUT if exc.kind == "timeout" else ErrorCode.BACKEND_UNAVAILABLE
            raise CallError(code, exc.message) from None
        if response is None:
            raise CallError(ErrorCode.BACKEND_ERROR, f"the MCP server {self.upstream.id} answered HTTP {self.status} without a result")
        return self.record(response)


def _render(outcome: Outcome, forwarder: _Forwarder, info: ToolInfo | None, modern: bool,
            probe: tuple[str, dict[str, Any] | None, int] | None, gateway: Gateway) -> tuple[str, dict[str, Any], int]:
    """("result" | "error", body, HTTP status): the shared rendering, with the status HTTP mirrors."""
    probe_name, template, probe_status = probe or ("", None, 400 if modern else 200)
    kind, body = gov.render_outcome(
        outcome, raw_result=forwarder.raw_result, raw_error=forwarder.raw_error, tool=info, modern=modern,
        unknown_template=template, probe=probe_name,
        no_information=[r.no_information_response for r in gateway.policy.disclosure_rules_for(outcome.tool)])
    if outcome.error_code is ErrorCode.TOOL_NOT_FOUND:
        return kind, body, probe_status if kind == "result" or template is not None else (400 if modern else 200)
    if kind == "error":
        return kind, body, forwarder.status if forwarder.status >= 400 else 200
    return kind, body, 200
