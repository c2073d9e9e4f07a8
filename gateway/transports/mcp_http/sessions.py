"""Legacy (2024-11-05 … 2025-11-25) sessions on `/mcp`: `initialize` opens one (the gateway's own
id, bound to the principal, the upstreams' ids kept behind it), GET streams every upstream's events
and resumes from the gateway's own event store, DELETE ends the session everywhere.

`LegacySessions` keeps the sessions; the values of one are in `state`.
"""

from __future__ import annotations

import secrets
from typing import Any

import anyio
import structlog

from gateway.core.gateway import Gateway
from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Request
from gateway.transports.mcp_http.events import StreamLog
from gateway.transports.mcp_http.relay import Relay
from gateway.transports.mcp_http.reply import Reply
from gateway.transports.mcp_http.state import (
    Ctx,
    HttpSession,
    Upstream,
    obj,
    resumable_version,
)
from gateway.transports.upstreams.mcp_http import UpstreamError, UpstreamReply

log = structlog.get_logger()


class LegacySessions:
    """`initialize`, GET and DELETE of legacy sessions (see the module docstring)."""

    def __init__(self, gateway: Gateway, relay: Relay) -> None:
        self.gateway = gateway
        self.relay = relay
        self.by_id: dict[str, HttpSession] = {}

    def find(self, sid: str, principal: str) -> HttpSession | None:
        """The session `sid` if `principal` opened it (another principal's id is as good as unknown)."""
        session = self.by_id.get(sid)
        return session if session is not None and session.principal == principal else None

    async def initialize(self, ctx: Ctx, reply: Reply, req: Request, data: bytes) -> None:
        params = obj(req.params)
        session = HttpSession(id="dgs_" + secrets.token_urlsafe(32), principal=ctx.principal.id)
        caps = params.get("capabilities")
        session.capabilities = dict(caps) if isinstance(caps, dict) else {}
        ctx.session = session
        requested = params.get("protocolVersion")
        if isinstance(requested, str) and resumable_version(requested):
            reply.resumable(session.events)
        others_have_tools = False
        for other in self.relay.upstreams[1:]:
            rid = session.originate()
            message = jsonrpc.request(rid, "initialize", params)
            try:
                answer, up = await self.relay.request(ctx, other, message, timeout=self.gateway.policy.backend_timeout_seconds)
            except (UpstreamError, TimeoutError) as exc:
                log.warning("upstream.initialize_failed", upstream=other.id, error=str(exc))
                continue
            session.upstream_sids[other.id] = up.session_id
            result = answer.get("result")
            if isinstance(result, dict):
                if isinstance(result.get("protocolVersion"), str):
                    session.upstream_versions[other.id] = result["protocolVersion"]
                others_have_tools = others_have_tools or isinstance((result.get("capabilities") or {}).get("tools"), dict)
            note = jsonrpc.dumps(jsonrpc.notification("notifications/initialized"))
            try:
                async with other.post(note, self.relay.up_headers(ctx, other)) as _up:
                    pass
            except UpstreamError:
                pass

        def on_head(up: UpstreamReply) -> dict[str, str]:
            if up.status != 200:
                return {}
            session.upstream_sids[self.relay.primary.id] = up.session_id
            self.by_id[session.id] = session
            return {"mcp-session-id": session.id}

        async def on_answer(msg: dict[str, Any]) -> dict[str, Any]:
            result = msg.get("result")
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                session.version = result["protocolVersion"]
                session.upstream_versions[self.relay.primary.id] = result["protocolVersion"]
                if others_have_tools and not isinstance((result.get("capabilities") or {}).get("tools"), dict):
                    caps = dict(result.get("capabilities") or {})
                    caps["tools"] = {"listChanged": True}
                    return {**msg, "result": {**result, "capabilities": caps}}
            return msg

        await self.relay.relay(ctx, reply, self.relay.primary, data, req.message, expect_id=req.id, on_answer=on_answer, on_head=on_head)
        log.info("mcp_http.session_opened", session=session.id[:12], principal=ctx.principal.id, version=session.version)

    async def get(self, ctx: Ctx, reply: Reply) -> None:
        sid = ctx.headers.get("mcp-session-id")
        session = self.by_id.get(sid) if sid else None
        if sid is not None and (session is None or session.principal != ctx.principal.id):
            await reply.final(jsonrpc.error(None, -32001, "Session not found"), 404)
            return
        if session is None:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return
        ctx.session = session
        # Last-Event-ID never goes upstream: a resume replays the gateway's own store (only events it
        # governed and sent on this session); an id it did not issue here resumes nothing.
        last = ctx.headers.get("last-event-id")
        found = session.events.find(last) if last else None
        stream: StreamLog | None = None
        if found is not None:
            stream, after = found
            reply.resumable(session.events)
            await reply.open_sse(200, self.relay.session_header(ctx), log=stream)
            async for event_id, data in session.events.follow(stream, after, wait=not stream.standalone):
                await reply.resend(event_id, data)
            if not stream.standalone:
                await reply.final(None)
                return
        elif resumable_version(ctx.version):
            reply.resumable(session.events)
            stream = session.events.open(standalone=True)
        async with anyio.create_task_group() as tg:
            async def pump(upstream: Upstream, primary: bool) -> None:
                headers = self.relay.up_headers(ctx, upstream)
                headers["accept"] = "text/event-stream"
                headers.pop("content-type", None)
                try:
                    async with upstream.get(headers) as up:
                        if not up.sse:
                            if primary:  # after a replay the stream is open already: it just ends
                                await reply.final(None if reply.sse else up.body or None, up.status,
                                                  {k: v for k, v in up.headers.items() if k in ("content-type", "allow")})
                                tg.cancel_scope.cancel()
                            return
                        await reply.open_sse(200, self.relay.session_header(ctx), log=stream)
                        async for chunk in up.messages():
                            out = await self.relay.from_upstream(ctx, upstream, chunk, None, None)
                            if out is not None:
                                await reply.event(out)
                except UpstreamError as exc:
                    log.warning("upstream.get_failed", upstream=upstream.id, error=exc.message)
                    if primary:
                        await reply.final(jsonrpc.error(None, jsonrpc.BACKEND_FAILED, f"Dharma Gateway: {exc.message}"), 502)
                        tg.cancel_scope.cancel()

            for i, upstream in enumerate(self.relay.upstreams):
                tg.start_soon(pump, upstream, i == 0)
        await reply.final(None)

    async def delete(self, ctx: Ctx, reply: Reply) -> None:
        sid = ctx.headers.get("mcp-session-id")
        session = self.by_id.get(sid) if sid else None
        if session is None or session.principal != ctx.principal.id:
            status, error = (404, jsonrpc.error(None, -32001, "Session not found")) if sid else (400, jsonrpc.error(None, -32000, "Bad Request: Missing session ID"))
            await reply.final(error, status)
            return
        ctx.session = session
        status, body, hdrs = 200, b"", {}
        for i, upstream in enumerate(self.relay.upstreams):
            headers = self.relay.up_headers(ctx, upstream)
            headers.pop("content-type", None)
            try:
                up = await upstream.delete(headers)
            except UpstreamError as exc:
                log.warning("upstream.delete_failed", upstream=upstream.id, error=exc.message)
                continue
            if i == 0:
                status, body = up.status, up.body
                if body and "content-type" in up.headers:
                    hdrs["content-type"] = up.headers["content-type"]
        if status < 400:
            self.by_id.pop(session.id, None)
            for scope in list(session.holds.values()):
                scope.cancel()
        await reply.final(body or None, status, hdrs)
