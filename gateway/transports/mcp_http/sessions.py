"""Legacy (2024-11-05 … 2025-11-25) sessions on `/mcp`: `initialize` opens one (the gateway's own
id, bound to the principal, the upstreams' ids kept behind it), GET streams every upstream's events
and resumes from the gateway's own event store, DELETE ends the session everywhere.

`LegacySessions` keeps the sessions in a `SessionStore` (`gateway.stores`: this process's memory,
or Redis shared by every replica, so any replica serves any request) and this replica's `Local`
part of each; `on_signal` applies what other replicas send (answers, cancels, stale catalogs,
ends). The values of one session are in `state`.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any

import anyio
import structlog

from gateway.core.gateway import Gateway
from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Request
from gateway.stores.base import SessionSignal, SessionStore, StoreUnavailable, StreamLog
from gateway.transports.mcp_http.relay import Relay, unavailable
from gateway.transports.mcp_http.reply import Reply
from gateway.transports.mcp_http.state import (
    Ctx,
    HttpSession,
    Local,
    Upstream,
    obj,
    resumable_version,
)
from gateway.transports.upstreams.replies import UpstreamError, UpstreamReply

log = structlog.get_logger()


#: How often a request sweeps the idle `Local` parts of other sessions (memory only: the session a
#: request names is checked on the spot). A sweep on every request cost O(sessions) each.
SWEEP_SECONDS = 1.0


class LegacySessions:
    """`initialize`, GET and DELETE of legacy sessions (see the module docstring)."""

    def __init__(self, gateway: Gateway, relay: Relay, store: SessionStore) -> None:
        self.gateway = gateway
        self.relay = relay
        self.store = store
        self.local: dict[str, Local] = {}
        self._swept = time.monotonic()  # when idle `Local` parts were last dropped

    async def find(self, sid: str, principal: str) -> HttpSession | None:
        """The session `sid` if `principal` opened it (another principal's id is as good as unknown).

        Raises `StoreUnavailable` when the shared store cannot be asked (the caller refuses the request).
        """
        facts = await self.store.load(sid)
        if facts is None or facts.principal != principal:
            return None
        now = time.monotonic()
        idle = self.store.idle_seconds
        if now - self._swept >= SWEEP_SECONDS:
            self._swept = now
            for old in [k for k, v in self.local.items() if now - v.used >= idle and not v.busy()]:
                del self.local[old]
        local = self.local.get(sid)
        if local is None or (now - local.used >= idle and not local.busy()):  # this one: exactly at its limit
            local = self.local[sid] = Local()
        local.used = now
        return HttpSession.of(facts, local, self.store.events(sid), self.store.replica)

    def on_signal(self, signal: SessionSignal) -> None:
        """Apply another replica's signal to this replica's part of the session (if it has one)."""
        local = self.local.get(signal.session)
        if local is None:
            return
        if signal.kind == "answer" and isinstance(signal.key, str) and signal.message is not None:
            waiter = local.waiters.get(signal.key)
            if waiter is not None:
                waiter.value = signal.message
                waiter.event.set()
        elif signal.kind == "cancel":
            scope = local.holds.get(("c", signal.key))
            if scope is not None:
                scope.cancel()
        elif signal.kind == "stale" and isinstance(signal.key, str):
            local.catalog.stale.add(signal.key)
        elif signal.kind == "end":
            for scope in list(local.holds.values()):
                scope.cancel()
            del self.local[signal.session]

    async def initialize(self, ctx: Ctx, reply: Reply, req: Request, data: bytes) -> None:
        params = obj(req.params)
        sid = "dgs_" + secrets.token_urlsafe(32)
        local = self.local[sid] = Local()
        session = HttpSession(id=sid, principal=ctx.principal.id, events=self.store.events(sid), replica=self.store.replica, local=local)
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

        opened = False

        async def on_head(up: UpstreamReply) -> dict[str, str]:
            nonlocal opened
            if up.status != 200:
                return {}
            session.upstream_sids[self.relay.primary.id] = up.session_id
            await self.store.create(session.facts())
            opened = True
            return {"mcp-session-id": session.id}

        async def on_answer(msg: dict[str, Any]) -> dict[str, Any]:
            result = msg.get("result")
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                session.version = result["protocolVersion"]
                session.upstream_versions[self.relay.primary.id] = result["protocolVersion"]
                if opened:  # before the client sees the answer, so its next request finds the version anywhere
                    await self.store.save(session.facts())
                if others_have_tools and not isinstance((result.get("capabilities") or {}).get("tools"), dict):
                    caps = dict(result.get("capabilities") or {})
                    caps["tools"] = {"listChanged": True}
                    return {**msg, "result": {**result, "capabilities": caps}}
            return msg

        try:
            await self.relay.relay(ctx, reply, self.relay.primary, data, req.message, expect_id=req.id, on_answer=on_answer, on_head=on_head)
        except StoreUnavailable as exc:
            await reply.final(unavailable(exc), 503)
        if not opened:
            self.local.pop(sid, None)
            with contextlib.suppress(StoreUnavailable):
                await self.store.end(sid)
            return
        log.info("mcp_http.session_opened", session=session.id[:12], principal=ctx.principal.id, version=session.version)

    async def _session(self, ctx: Ctx, reply: Reply) -> HttpSession | None:
        """The request's session for GET and DELETE, or None once the refusal is answered."""
        sid = ctx.headers.get("mcp-session-id")
        if sid is None:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return None
        try:
            session = await self.find(sid, ctx.principal.id)
        except StoreUnavailable as exc:
            await reply.final(unavailable(exc), 503)
            return None
        if session is None:
            await reply.final(jsonrpc.error(None, -32001, "Session not found"), 404)
        return session

    async def get(self, ctx: Ctx, reply: Reply) -> None:
        session = await self._session(ctx, reply)
        if session is None:
            return
        ctx.session = session
        # Last-Event-ID never goes upstream: a resume replays the gateway's own store (only events it
        # governed and sent on this session); an id it did not issue here resumes nothing.
        last = ctx.headers.get("last-event-id")
        stream: StreamLog | None = None
        try:
            found = await session.events.find(last) if last else None
            if found is not None:
                stream, after = found
                reply.resumable(session.events)
                await reply.open_sse(200, self.relay.session_header(ctx), log=stream)
                async for event_id, data in session.events.follow(stream, after, wait=not stream.standalone):
                    await reply.resend(event_id, data)
                if not stream.standalone:
                    await reply.final(None)
                    return
                # New events go on a stream of this replica's own: one writer per stream, on any replica.
                stream = reply.log = session.events.open(standalone=True)
        except StoreUnavailable as exc:
            await reply.final(unavailable(exc), 503)
            return
        if found is None and resumable_version(ctx.version):
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
        session = await self._session(ctx, reply)
        if session is None:
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
            try:
                await self.store.end(session.id)
            except StoreUnavailable as exc:
                await reply.final(unavailable(exc), 503)
                return
            self.on_signal(SessionSignal(kind="end", session=session.id))
        await reply.final(body or None, status, hdrs)

