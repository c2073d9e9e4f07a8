"""The Backend an allowed `tools/call` on `/mcp` is forwarded through: one upstream POST, its
intermediate messages streamed to the client as they come."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio

from gateway.core.backends import BackendResult
from gateway.core.errors import CallError, ErrorCode
from gateway.core.gateway import CallTracer
from gateway.mcp import governance as gov
from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Request
from gateway.transports.mcp_http.relay import Relay
from gateway.transports.mcp_http.reply import Reply
from gateway.transports.mcp_http.state import Ctx, Upstream
from gateway.transports.upstreams.mcp_http import Exchange
from gateway.transports.upstreams.replies import UpstreamError


class HttpForwarder(gov.AnswerRecorder):
    """The Backend `Gateway.govern` forwards an allowed call through: one upstream POST, whose
    intermediate messages (progress, logs, server requests) stream to the client as they come."""

    def __init__(self, relay: Relay, ctx: Ctx, reply: Reply, req: Request, upstream: Upstream, upstream_name: str,
                 schema: dict[str, Any] | None, tracer: CallTracer | None) -> None:
        self.relay, self.ctx, self.reply, self.req = relay, ctx, reply, req
        self.upstream, self.upstream_name = upstream, upstream_name
        self.schema = schema  # the tool's input schema, for the 2026 `Mcp-Param-*` headers
        self.tracer = tracer
        self.id = upstream.id
        super().__init__()
        self.status = 200

    async def send(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> BackendResult:
        req, ctx, relay = self.req, self.ctx, self.relay
        params = dict(req.params) if isinstance(req.params, dict) else {}
        params["name"] = self.upstream_name
        if "arguments" in params or arguments:
            params["arguments"] = arguments
        message = gov.with_trace_context({**req.message, "params": params}, self.tracer)
        headers = relay.up_headers(ctx, self.upstream, message, self.schema)
        response: dict[str, Any] | None = None
        # asyncio.timeout, not anyio.fail_after: `dharma serve` runs on asyncio only, and an anyio
        # cancel scope per call cost ~4 % of its CPU. One timeout covers the request and a JSON
        # answer (read whole before the head is handed back); an event stream gets one per message.
        try:
            async with asyncio.timeout(timeout):
                cm = self.upstream.post(jsonrpc.dumps(message), headers, expect_id=req.id)
                up = await cm.__aenter__()
            try:
                self.status = up.status
                if not up.sse:
                    if up.body.strip():
                        response = await self._take(up.body)
                else:
                    await self.reply.open_sse(200, relay.session_header(ctx))
                    up.on_pause = self.reply.detach
                    stream = up.messages().__aiter__()
                    while response is None:
                        async with asyncio.timeout(timeout):
                            try:
                                chunk = await stream.__anext__()
                            except StopAsyncIteration:
                                break
                        response = await self._take(chunk)
            finally:
                if isinstance(cm, Exchange):
                    cm.close()  # synchronous: a cancellation cannot cut it short
                else:
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

    async def _take(self, chunk: bytes) -> dict[str, Any] | None:
        """The upstream's answer to this call if `chunk` is it; any other message is relayed to the
        client (a progress note, a log, a server request), and what is not JSON is skipped."""
        try:
            msg = jsonrpc.loads(chunk)
        except ValueError:
            return None
        if isinstance(msg, dict) and msg.get("id") == self.req.id and ("result" in msg or "error" in msg) and "method" not in msg:
            return msg
        out = await self.relay.from_upstream(self.ctx, self.upstream, chunk, None, None)
        if out is not None:
            await self.reply.event(out)
        return None
