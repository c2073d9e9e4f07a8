"""Relaying between a client and the upstreams of `/mcp`: the headers that go upstream, mirroring an
upstream's answer (status, JSON or SSE), server→client messages on their way back, client answers
and notifications routed to their upstream, and the requests the gateway makes upstream itself.

`Relay` owns the upstreams; the session and tool handlers are given it. No governance here (`tools`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Notification, Response
from gateway.mcp.versions import ID_PREFIX
from gateway.stores.base import SessionSignal, SessionStore, StoreUnavailable
from gateway.transports.mcp_http import headers as mh
from gateway.transports.mcp_http.reply import Reply
from gateway.transports.mcp_http.state import Catalog, Ctx, Upstream
from gateway.transports.upstreams.replies import UpstreamError, UpstreamReply

log = structlog.get_logger()

#: Client headers forwarded upstream (with the routing headers); nothing that authenticates the client.
FORWARDED = ("accept", "content-type", "mcp-protocol-version", "origin", "user-agent")


def unavailable(exc: StoreUnavailable) -> dict[str, Any]:
    """The JSON-RPC error of a request refused because the session store is down (fail closed)."""
    return jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, f"Dharma Gateway cannot reach its session store, so it refuses "
                         f"this request: {exc}. Retry once it is back.", data={"error_code": "backend_unavailable"})


class Relay:
    """The upstreams of `/mcp` and the relaying to and from them (see the module docstring)."""

    def __init__(self, upstreams: Sequence[Upstream], store: SessionStore) -> None:
        if not upstreams:
            raise ValueError("the MCP endpoint needs at least one upstream")
        self.store = store  # for signals to the replica that holds a session's waiter, hold or catalog
        self.upstreams = list(upstreams)
        self.by_id = {u.id: u for u in self.upstreams}
        self.primary = self.upstreams[0]
        self.multi = len(self.upstreams) > 1
        #: Server→client request ids are namespaced when more than one upstream can send requests
        #: (the gateway's own server, `originates = False`, never does).
        self.namespaced = sum(getattr(u, "originates", True) for u in self.upstreams) > 1
        self.by_prefix = sorted(self.upstreams, key=lambda u: len(u.prefix), reverse=True)
        self.modern_catalog = Catalog()
        self._counter = 0

    # ---- headers and relaying -------------------------------------------------------------

    def up_headers(self, ctx: Ctx, upstream: Upstream, message: dict[str, Any] | None = None, schema: Any = None) -> dict[str, str]:
        h = {k: v for k, v in ctx.headers.items() if k in FORWARDED or k.startswith(mh.PARAM_PREFIX) or k in (mh.METHOD, mh.NAME)}
        h.setdefault("accept", "application/json, text/event-stream")
        h["content-type"] = "application/json"
        if upstream.forward_host and "host" in ctx.headers:
            h["host"] = ctx.headers["host"]
        if ctx.session is not None:
            sid = ctx.session.upstream_sids.get(upstream.id)
            if sid:
                h["mcp-session-id"] = sid
            negotiated = ctx.session.upstream_versions.get(upstream.id)
            if negotiated and "mcp-protocol-version" in h:
                h["mcp-protocol-version"] = negotiated
        if ctx.modern and message is not None:
            h = mh.forwarded(h, message, schema)
        return h

    def session_header(self, ctx: Ctx) -> dict[str, str]:
        return {"mcp-session-id": ctx.session.id} if ctx.session is not None else {}

    async def relay(
        self,
        ctx: Ctx,
        reply: Reply,
        upstream: Upstream,
        data: bytes,
        message: dict[str, Any] | None,
        *,
        expect_id: jsonrpc.RpcId | None,
        on_answer: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
        on_head: Callable[[UpstreamReply], Awaitable[dict[str, str]]] | None = None,
    ) -> None:
        """Forward one message and mirror the upstream's answer (status, JSON or SSE)."""
        # The message goes on unchanged, so the client's routing headers go on unchanged too (the
        # upstream validates them itself); only rewritten or gateway-made messages get new ones.
        try:
            async with upstream.post(data, self.up_headers(ctx, upstream), expect_id=expect_id) as up:
                extra = await on_head(up) if on_head is not None else self.session_header(ctx)
                if up.sse:
                    await reply.open_sse(up.status, extra)
                    up.on_pause = reply.detach
                    async for chunk in up.messages():
                        out = await self.from_upstream(ctx, upstream, chunk, expect_id, on_answer)
                        if out is not None:
                            await reply.event(out)
                    await reply.final(None)
                    return
                body = up.body
                if on_answer is not None and body.strip():
                    out = await self.from_upstream(ctx, upstream, body, expect_id, on_answer)
                    body = out if out is not None else body
                hdrs = dict(extra)
                if "content-type" in up.headers and body:
                    hdrs["content-type"] = up.headers["content-type"]
                if "allow" in up.headers:
                    hdrs["allow"] = up.headers["allow"]
                await reply.final(body or None, up.status, hdrs)
        except UpstreamError as exc:
            await reply.final(jsonrpc.error(expect_id, jsonrpc.BACKEND_FAILED, f"Dharma Gateway: {exc.message}"), 502)

    async def from_upstream(
        self,
        ctx: Ctx,
        upstream: Upstream,
        data: bytes,
        expect_id: jsonrpc.RpcId | None,
        on_answer: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None,
    ) -> bytes | None:
        """One upstream message on its way to the client: the awaited answer may be transformed,
        server→client request ids are namespaced when several upstreams share the session."""
        try:
            msg = jsonrpc.loads(data)
        except ValueError:
            log.warning("upstream.bad_message", upstream=upstream.id)
            return None
        if not isinstance(msg, dict):
            return data
        if ("result" in msg or "error" in msg) and "method" not in msg:
            if on_answer is not None and msg.get("id") == expect_id:
                return jsonrpc.dumps(await on_answer(msg))
            return data
        method = msg.get("method")
        if method == "notifications/tools/list_changed":
            self.catalog(ctx).stale.add(upstream.id)
            if ctx.session is not None:
                try:
                    await self.store.publish(SessionSignal(kind="stale", session=ctx.session.id, key=upstream.id))
                except StoreUnavailable as exc:
                    log.error("mcp_http.stale_not_shared", upstream=upstream.id, error=str(exc))
        if "id" in msg and self.namespaced:
            msg = {**msg, "id": f"{ID_PREFIX}u/{upstream.id}/{json.dumps(msg['id'])}"}
            return jsonrpc.dumps(msg)
        return data

    async def client_response(self, ctx: Ctx, reply: Reply, item: Response, data: bytes) -> None:
        rid = item.id
        session = ctx.session
        if isinstance(rid, str) and rid.startswith(ID_PREFIX) and session is not None:
            waiter = session.waiters.get(rid)
            if waiter is not None:
                waiter.value = item.message
                waiter.event.set()
                await reply.final(None, 202)
                return
            if session.originated(rid):  # asked by another replica: the answer goes to the one waiting
                try:
                    await self.store.publish(SessionSignal(kind="answer", session=session.id, key=rid, message=item.message))
                except StoreUnavailable as exc:
                    await reply.final(unavailable(exc), 503)
                    return
                await reply.final(None, 202)
                return
            prefix = f"{ID_PREFIX}u/"
            if rid.startswith(prefix):
                uid, _, original = rid[len(prefix):].partition("/")
                upstream = self.by_id.get(uid)
                if upstream is not None:
                    try:
                        restored = jsonrpc.loads(original)
                    except ValueError:
                        restored = None
                    if jsonrpc.valid_id(restored):
                        message = {**item.message, "id": restored}
                        await self.relay(ctx, reply, upstream, jsonrpc.dumps(message), None, expect_id=None)
                        return
        if session is None and not ctx.modern:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return
        await self.relay(ctx, reply, self.primary, data, None, expect_id=None)

    async def client_notification(self, ctx: Ctx, reply: Reply, item: Notification, data: bytes) -> None:
        session = ctx.session
        if item.method == "notifications/cancelled" and session is not None and isinstance(item.params, dict):
            request_id = item.params.get("requestId")
            scope = session.holds.get(("c", request_id))
            if scope is not None:
                scope.cancel()
                await reply.final(None, 202)
                return
            if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
                try:  # the call may be held on another replica; it may also be at the upstream (below)
                    await self.store.publish(SessionSignal(kind="cancel", session=session.id, key=request_id))
                except StoreUnavailable as exc:
                    await reply.final(unavailable(exc), 503)
                    return
        if not ctx.modern and session is None:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return
        if self.multi and not ctx.modern:
            for other in self.upstreams[1:]:
                try:
                    async with other.post(data, self.up_headers(ctx, other)) as _up:
                        pass
                except UpstreamError as exc:
                    log.warning("upstream.notification_failed", upstream=other.id, error=exc.message)
        await self.relay(ctx, reply, self.primary, data, item.message, expect_id=None)

    # ---- upstream requests the gateway makes itself ----------------------------------------

    async def request(self, ctx: Ctx, upstream: Upstream, message: dict[str, Any], *, timeout: float,
                       schema: Any = None, on_head: Callable[[UpstreamReply], None] | None = None) -> tuple[dict[str, Any], UpstreamReply]:
        """Send a request and return its answer (other messages on its stream are dropped); `on_head`
        sees the upstream's reply as soon as it began (its session id, before the answer)."""
        headers = self.up_headers(ctx, upstream, message, schema)
        if ctx.modern and "mcp-protocol-version" not in {k.lower() for k in headers}:
            headers["mcp-protocol-version"] = ctx.version or "2026-07-28"
        async with asyncio.timeout(timeout):  # asyncio only (see forward.py): cheaper than an anyio scope per request
            async with upstream.post(jsonrpc.dumps(message), headers, expect_id=message["id"]) as up:
                if on_head is not None:
                    on_head(up)
                async for chunk in up.messages():
                    try:
                        msg = jsonrpc.loads(chunk)
                    except ValueError:
                        continue
                    if isinstance(msg, dict) and msg.get("id") == message["id"] and ("result" in msg or "error" in msg):
                        return msg, up
                raise UpstreamError("unavailable", f"upstream {upstream.id} answered HTTP {up.status} without a JSON-RPC answer")

    def next_id(self, ctx: Ctx) -> str:
        if ctx.session is not None:
            return ctx.session.originate()
        self._counter += 1
        return f"{ID_PREFIX}m/{self._counter}"

    def catalog(self, ctx: Ctx) -> Catalog:
        return ctx.session.catalog if ctx.session is not None else self.modern_catalog
