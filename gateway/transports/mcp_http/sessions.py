"""Legacy (2024-11-05 … 2025-11-25) sessions on `/mcp`: `initialize` opens one (the gateway's own
id, bound to the principal, the upstreams' ids kept behind it), GET streams every upstream's events
and resumes from the gateway's own event store, DELETE ends the session everywhere.

`LegacySessions` keeps the sessions in a `SessionStore` (`gateway.stores`: this process's memory,
or Redis shared by every replica, so any replica serves any request) and this replica's `Local`
part of each; `on_signal` applies what other replicas send (answers, cancels, stale catalogs,
ends). The values of one session are in `state`.

Bounded (docs/mcp-http.md "Limits"): the store refuses a session beyond `mcp.max_sessions_per_principal`
or `mcp.max_sessions` before any upstream is asked (so no server process starts), a stdio upstream
refuses one process beyond `mcp.max_stdio_processes`, and a session holds at most
`mcp.max_streams_per_session` GET streams here, each for at most `session_idle_seconds`; every such
refusal is a `LimitReached` the endpoint answers 429. `reap_forever` (the endpoint's lifespan) keeps
sessions with a request in flight here alive and ends the upstream sessions of expired ones, which
stops their server processes. A dropped connection ends no legacy session (the spec lets a client
reconnect and resume); an `initialize` that fails or whose client goes before the answer does.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog

from gateway.core.errors import LimitReached
from gateway.core.gateway import Gateway
from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Request
from gateway.stores.base import SessionFacts, SessionSignal, SessionStore, StoreUnavailable, StreamLog
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
#: The reaper's period at most (a quarter of `session_idle_seconds` when that is shorter).
REAP_SECONDS = 10.0
#: How long ending one expired session's upstream session may take before the reaper moves on.
END_UPSTREAM_SECONDS = 10.0
STREAMS = "mcp.max_streams_per_session"


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
        """Open a session: counted in the store first (`LimitReached` propagates, nothing started),
        then initialized on every upstream. It is open once the primary upstream accepted it (the
        client has its id from then on, even if it hangs up before the answer). If it does not open
        (an upstream refused or failed, an upstream's limit was reached, the client went), every
        upstream session it started is ended again and its slot freed."""
        sid = "dgs_" + secrets.token_urlsafe(32)
        facts = SessionFacts(id=sid, principal=ctx.principal.id, nonce=secrets.token_hex(6))
        try:
            await self.store.create(facts)
        except StoreUnavailable as exc:
            await reply.final(unavailable(exc), 503)
            return
        local = self.local[sid] = Local()
        session = HttpSession.of(facts, local, self.store.events(sid), self.store.replica)
        ctx.session = session
        params = obj(req.params)
        caps = params.get("capabilities")
        session.capabilities = dict(caps) if isinstance(caps, dict) else {}
        requested = params.get("protocolVersion")
        if isinstance(requested, str) and resumable_version(requested):
            reply.resumable(session.events)
        opened = False

        async def on_head(up: UpstreamReply) -> dict[str, str]:
            nonlocal opened
            if up.status != 200:
                return {}
            session.upstream_sids[self.relay.primary.id] = up.session_id
            await self.store.save(session.facts())
            opened = True
            return {"mcp-session-id": session.id}

        try:
            others_have_tools = await self._initialize_others(ctx, session, params)
            on_answer = self._on_answer(session, others_have_tools, lambda: opened)
            try:
                await self.relay.relay(ctx, reply, self.relay.primary, data, req.message, expect_id=req.id,
                                       on_answer=on_answer, on_head=on_head)
            except StoreUnavailable as exc:
                await reply.final(unavailable(exc), 503)
        finally:
            if not opened:
                ctx.session = None
                with anyio.CancelScope(shield=True):
                    self.local.pop(sid, None)
                    await self._end_upstreams(session.facts())
                    with contextlib.suppress(StoreUnavailable):
                        await self.store.end(sid)
        if opened:
            log.info("mcp_http.session_opened", session=session.id[:12], principal=ctx.principal.id, version=session.version)

    async def _initialize_others(self, ctx: Ctx, session: HttpSession, params: dict[str, Any]) -> bool:
        """Initialize the session on every upstream but the primary (one that fails is left out);
        whether any of them has tools."""
        others_have_tools = False
        for other in self.relay.upstreams[1:]:
            rid = session.originate()
            message = jsonrpc.request(rid, "initialize", params)

            def started(up: UpstreamReply, upstream_id: str = other.id) -> None:  # known at once: ended if we stop here
                session.upstream_sids[upstream_id] = up.session_id

            try:
                answer, _up = await self.relay.request(ctx, other, message, timeout=self.gateway.policy.backend_timeout_seconds,
                                                       on_head=started)
            except (UpstreamError, TimeoutError) as exc:
                log.warning("upstream.initialize_failed", upstream=other.id, error=str(exc))
                await self._end_upstream(other, session.upstream_sids.pop(other.id, None), None)
                continue
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
        return others_have_tools

    def _on_answer(self, session: HttpSession, others_have_tools: bool,
                   opened: Callable[[], bool]) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
        """What the primary's `initialize` answer goes through: the negotiated version is kept (saved
        before the client sees it, so its next request finds it on any replica), and `tools` is
        declared when only another upstream has them."""

        async def on_answer(msg: dict[str, Any]) -> dict[str, Any]:
            result = msg.get("result")
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                session.version = result["protocolVersion"]
                session.upstream_versions[self.relay.primary.id] = result["protocolVersion"]
                if opened():
                    await self.store.save(session.facts())
                if others_have_tools and not isinstance((result.get("capabilities") or {}).get("tools"), dict):
                    caps = dict(result.get("capabilities") or {})
                    caps["tools"] = {"listChanged": True}
                    return {**msg, "result": {**result, "capabilities": caps}}
            return msg

        return on_answer

    async def _end_upstreams(self, facts: SessionFacts) -> None:
        """End the upstream sessions of a session that did not open or expired (a stdio upstream
        stops its process)."""
        for upstream in self.relay.upstreams:
            await self._end_upstream(upstream, facts.upstream_sids.get(upstream.id), facts.upstream_versions.get(upstream.id))

    async def _end_upstream(self, upstream: Upstream, sid: str | None, version: str | None) -> None:
        """DELETE upstream session `sid` (none: nothing to end), within `END_UPSTREAM_SECONDS`; a failure is logged."""
        if not sid:
            return
        headers = {"mcp-session-id": sid}
        if version:
            headers["mcp-protocol-version"] = version
        with anyio.move_on_after(END_UPSTREAM_SECONDS):
            try:
                await upstream.delete(headers)
            except Exception as exc:  # best effort, as closing is: the others are ended all the same
                log.warning("upstream.delete_failed", upstream=upstream.id, error=getattr(exc, "message", str(exc)))

    async def reap_forever(self) -> None:
        """The reaper (runs for the endpoint's lifetime): every quarter of `session_idle_seconds`
        (at most `REAP_SECONDS`) it renews the sessions with a request in flight on this replica and
        ends the upstream sessions of those that expired, stopping their server processes."""
        period = min(REAP_SECONDS, max(0.05, self.store.idle_seconds / 4))
        while True:
            await anyio.sleep(period)
            try:
                await self.reap()
            except StoreUnavailable as exc:
                log.warning("mcp_http.reap_failed", error=str(exc))
            except Exception:  # the next pass tries again; the endpoint must not stop over it
                log.exception("mcp_http.reap_failed")

    async def reap(self) -> None:
        """One pass of the reaper (O(sessions) here, never on a request's path)."""
        await self.store.touch([sid for sid, local in self.local.items() if local.busy()])
        expired = await self.store.reap()
        if not expired:
            return
        async with anyio.create_task_group() as tg:
            for facts in expired:
                local = self.local.pop(facts.id, None)
                for scope in list(local.holds.values()) if local is not None else ():
                    scope.cancel()
                tg.start_soon(self._end_upstreams, facts)
                log.info("mcp_http.session_expired", session=facts.id[:12], principal=facts.principal)

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
        """A GET stream of the session: at most `streams_per_session` at once here (one more raises
        `LimitReached`), each ended after `session_idle_seconds` (the client reconnects, as after any
        end of the stream; so a peer that vanished without a word holds its session at most about
        twice the idle time). The session is renewed when the stream ends, for the reconnect."""
        session = await self._session(ctx, reply)
        if session is None:
            return
        ctx.session = session
        local = session.local
        if local.streams >= self.store.limits.streams_per_session:
            raise LimitReached(STREAMS, f"stream limit reached: {local.streams} GET streams of this session are open "
                                        f"({STREAMS}); close one first", retry_after=1.0)
        local.streams += 1
        local.open += 1
        try:
            with anyio.move_on_after(self.store.idle_seconds):
                await self._stream(ctx, reply, session)
            await reply.final(None)
        finally:
            local.streams -= 1
            local.open -= 1
        # A full idle time from now for the client to reconnect (it was renewed only by the reaper meanwhile).
        await self.store.touch([session.id])

    async def _stream(self, ctx: Ctx, reply: Reply, session: HttpSession) -> None:
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
        # The client ends its session with the gateway whatever an upstream answered (405: it lets no
        # client end sessions; 404: it lost the session): the gateway's session, its slot under the
        # session limits and its stdio processes end here, and the client hears that it did.
        try:
            await self.store.end(session.id)
        except StoreUnavailable as exc:
            await reply.final(unavailable(exc), 503)
            return
        self.on_signal(SessionSignal(kind="end", session=session.id))
        if status >= 400:
            status, body, hdrs = 200, b"", {}
        await reply.final(body or None, status, hdrs)

