"""MCP Streamable HTTP at `/mcp`: a governing, otherwise transparent proxy in front of one or
more upstream MCP servers. A pure ASGI app (never buffers an event stream).

Both eras on one endpoint, told apart per request (`MCP-Protocol-Version` header, else the
body's `_meta` protocol version):

- **Legacy (2024-11-05 … 2025-11-25)**: sessions. The gateway mints its own opaque session id
  (`dgs_` + 32 random bytes, URL-safe) on a successful `initialize`, keeps the upstream's session
  ids behind it, and binds the session to the principal that opened it (another principal
  presenting the id gets 404, like an unknown session). POST replies mirror the upstream's shape
  (JSON or SSE); the GET stream merges every upstream's; DELETE ends the session everywhere.
  Event streams carry the **gateway's own** event ids (priming events with `retry:` for
  2025-11-25+ clients), never the upstream's; a GET with `Last-Event-ID` replays from the
  session's store of events the gateway governed and sent (`gateway.stores`: memory, or Redis
  shared by replicas), and `Last-Event-ID` is
  never forwarded, so a client cannot make an upstream replay an event the gateway did not
  govern. The gateway resumes upstream streams itself (`upstream_http`) and closes the client's
  stream when the upstream closes its own early (SSE polling).
  Server→client requests and notifications pass through on the stream they came on.
- **2026-07-28**: POST only (GET/DELETE 405). `Mcp-Method`/`Mcp-Name`/`Mcp-Param-*` are checked
  against the body (-32020, HTTP 400) and recomputed for what is forwarded. A client disconnect
  cancels the upstream request. `subscriptions/listen` streams through unbuffered.

Governance (same module as stdio, `gateway.mcp.governance`): `tools/list` filtered per principal
(`cacheScope: "private"` on 2026), `tools/call` through `Gateway.govern` (refusal = a normal
result with `isError` and the decision in `_meta`; hidden = exactly the upstream's unknown-tool
answer; the receipt in `result._meta["dharma.gateway/receipt"]`). Approvals: elicitation when
the client declared it (legacy `elicitation/create` on the call's stream; 2026 an
`input_required` result with a signed `requestState`), else a hold with progress notifications.

Limits (docs/mcp-http.md "Limits"): open legacy sessions per principal and in total, stdio
server processes per upstream and GET streams per session are bounded; one more is refused with
HTTP 429, `Retry-After` and a JSON-RPC error naming the setting (`_limit_refusal`), put on the
record and counted. A reaper in `running()` ends expired sessions and stops their processes.

One catalog: the gateway's own python and http tools are one more upstream, in process
(`mcp_http_local.LocalServer`, the only one when no MCP upstream is configured). Named groups
(`settings.groups`, `gateway.transports.groups`) are served at `{path}/{group}`: the same endpoint,
with the group on the request's `Ctx`, narrowing listings and calls to the group's tools (an
unknown group, or one the principal may not use, is 404).

Several upstreams: each may have a tool-name `prefix`; `tools/list` merges them (every page of
each, one page to the client); `tools/call` routes by prefix; other requests go to the first
upstream. The client's credentials (Authorization, X-API-Key, cookies) are never forwarded.

The endpoint is built from parts: `mcp_http_reply` (the ASGI writer, `Reply`, SSE framing),
`mcp_http_state` (session and request values, the `Upstream` protocol), `mcp_http_relay`
(forwarding to and from upstreams), `mcp_http_sessions` (legacy initialize/GET/DELETE),
`mcp_http_tools` (tools/list, tools/call, approvals) and `mcp_http_forward` (the governed call's
Backend). This module is the ASGI app itself and `build_mcp_app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import structlog
from starlette.types import Receive, Scope, Send

from gateway.core.call import Credentials, Principal
from gateway.core.errors import ConfigError, ErrorCode, LimitReached
from gateway.core.gateway import Gateway
from gateway.mcp import approval as ap
from gateway.mcp import calls, jsonrpc
from gateway.mcp.jsonrpc import Batch, Invalid, Notification, Request, Response
from gateway.mcp.pins import PinStore
from gateway.mcp.refusals import LimitRefusals
from gateway.mcp.session import CLIENT_METHODS
from gateway.mcp.versions import (
    BATCH_VERSIONS,
    HEADER_MISMATCH,
    LEGACY_VERSIONS,
    META_CAPABILITIES,
    META_VERSION,
    MODERN_VERSIONS,
)
from gateway.transports.groups import Group, group_for, groups_from
from gateway.transports.http_auth import STATE_PRINCIPAL, route_path
from gateway.transports.http_protocol import WatchedEvent
from gateway.transports.mcp_http import headers as mh
from gateway.stores.base import EventStore, SessionLimits, SessionStore, StoreUnavailable
from gateway.transports.mcp_http.relay import Relay, unavailable
from gateway.transports.mcp_http.reply import (
    AsgiWriter,
    Collect,
    Reply,
    plain_reply,
    read_body,
)
from gateway.transports.mcp_http.sessions import LegacySessions
from gateway.transports.mcp_http.state import (
    Ctx,
    Upstream,
    obj,
    resumable_version,
)
from gateway.transports.mcp_http.tools import HttpTools
from gateway.stores.memory_sessions import MemorySessionStore

log = structlog.get_logger()


UNAUTHORIZED = -31002
#: Where the authentication middleware (`gateway.transports.http_auth.HttpAuth`) leaves what it verified.
STATE_CREDENTIALS = "dharma.credentials"


class McpHttpApp:
    """The `/mcp` endpoint (pure ASGI), composed of its parts: the `Relay` to the upstreams, the
    `LegacySessions`, and the `HttpTools` that govern tools/list and tools/call. See the module docstring."""

    def __init__(
        self,
        gateway: Gateway,
        upstreams: Sequence[Upstream],
        *,
        pins: PinStore,
        max_body_bytes: int = 2_097_152,
        anonymous_user: str | None = None,
        hold_seconds: float = 50.0,
        progress_interval: float = 5.0,
        session_idle_seconds: float = 300.0,
        sessions: SessionStore | None = None,
        session_link: Any = None,
        limits: SessionLimits | None = None,
        path: str = "/mcp",
        groups: Mapping[str, Group] | None = None,
    ) -> None:
        self.gateway = gateway
        self.path = path
        self.groups = dict(groups or {})
        store = sessions if sessions is not None else MemorySessionStore(session_idle_seconds, limits=limits)
        self.relay = Relay(upstreams, store)
        self.sessions = LegacySessions(gateway, self.relay, store)
        self.session_link = session_link  # the Redis link of a shared store, closed with the endpoint
        flow = calls.ToolsCall(gateway, pins, ap.StateSealer(secrets.token_bytes(32)),
                               hold_seconds=hold_seconds, progress_interval=progress_interval, over_http=True)
        self.tools = HttpTools(gateway, self.relay, pins, flow)
        self.refusals = LimitRefusals(gateway)
        self.max_body_bytes = max_body_bytes
        self.anonymous_user = anonymous_user
        self._scope_class: Callable[..., anyio.CancelScope] | None = None  # the running anyio backend's CancelScope

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The endpoint's lifetime (the app's lifespan): background pumps of stdio upstreams and the
        session reaper run in this task group; on exit every upstream is closed (its processes stopped)."""
        async with anyio.create_task_group() as tg:
            for upstream in self.relay.upstreams:
                if hasattr(upstream, "task_group"):
                    upstream.task_group = tg
            tg.start_soon(self._signals)
            tg.start_soon(self.sessions.reap_forever)
            tg.start_soon(self._record_refusals)
            self.gateway.metrics.mcp_open = self._open_now
            try:
                yield
            finally:
                self.gateway.metrics.mcp_open = None
                await self.aclose()
                tg.cancel_scope.cancel()

    def _open_now(self) -> tuple[int | None, dict[str, int]]:
        """For /metrics: sessions open in this process's memory (None with a shared store) and session
        processes per stdio upstream."""
        store = self.sessions.store
        sessions = len(store) if isinstance(store, MemorySessionStore) else None
        return sessions, {u.id: u.processes for u in self.relay.upstreams if isinstance(getattr(u, "processes", None), int)}

    async def _limit_refusal(self, ctx: Ctx, reply: Reply, rpc_id: jsonrpc.RpcId | None, method: str, exc: LimitReached) -> None:
        """Refuse a request a limit does not let through: HTTP 429 with `Retry-After`, a JSON-RPC
        error whose message names the setting (and `data.limit`), put on the record as `rate_limited`
        (`gateway.mcp.refusals`: the first at once, a flood as counts) and counted in /metrics
        (`dharma_limit_refusals_total`)."""
        retry = max(1, math.ceil(exc.retry_after))
        self.gateway.metrics.limit_refused(exc.setting)
        log.debug("mcp_http.limit_reached", limit=exc.setting, principal=ctx.principal.id, method=method)
        await self.refusals.refused(self.tools.site(ctx), method, exc.setting)
        data = {"error_code": ErrorCode.RATE_LIMITED.value, "limit": exc.setting, "retry_after": retry}
        await reply.final(jsonrpc.error(rpc_id, jsonrpc.LIMIT_REACHED, exc.message, data=data), 429, {"retry-after": str(retry)})

    async def _stream(self, ctx: Ctx, reply: Reply) -> None:
        """GET: the session's stream, or a 429 when it has as many open as allowed."""
        try:
            await self.sessions.get(ctx, reply)
        except LimitReached as exc:
            await self._limit_refusal(ctx, reply, None, "GET", exc)

    async def _signals(self) -> None:
        """Apply other replicas' signals to the sessions this replica serves (none with one process)."""
        async for signal in self.sessions.store.signals():
            self.sessions.on_signal(signal)

    async def _record_refusals(self) -> None:
        """Put the counts of limit refusals on the record as their windows end."""
        while True:
            await anyio.sleep(self.refusals.window / 2)
            await self.refusals.flush()

    async def aclose(self) -> None:
        await self.refusals.flush(everything=True)
        for upstream in self.relay.upstreams:
            try:
                await upstream.aclose()
            except Exception as exc:  # closing is best effort
                log.warning("upstream.close_failed", upstream=upstream.id, error=str(exc))
        if self.session_link is not None:
            await self.session_link.aclose()

    # ---- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        raw_headers = [(k.decode("latin-1").lower(), v.decode("latin-1").strip(" \t")) for k, v in scope.get("headers", [])]
        headers = dict(raw_headers)
        credentials, resolved = self._credentials(scope, headers)
        principal = resolved if resolved is not None else self.gateway.principal_for(credentials)
        if principal is None:
            await plain_reply(send, 401, jsonrpc.error(None, UNAUTHORIZED, "Unauthorized: present an API key (Authorization: Bearer <key> or X-API-Key)"),
                         {"www-authenticate": 'Bearer realm="dharma-gateway"'})
            return
        group: Group | None = None
        path = route_path(scope)
        if path != self.path:
            group = group_for(self.groups, path[len(self.path) + 1:], principal) if path.startswith(self.path + "/") else None
            if group is None:  # unknown, or not this principal's to use: told apart by nobody
                await plain_reply(send, 404, jsonrpc.error(None, jsonrpc.INVALID_REQUEST, "Not Found: no such tool group"))
                return
        version = headers.get(mh.PROTOCOL_VERSION)
        if method == "POST":
            await self._post(scope, receive, send, headers, raw_headers, credentials, principal, group)
        elif method in ("GET", "DELETE"):
            if version in MODERN_VERSIONS:
                await plain_reply(send, 405, jsonrpc.error(None, jsonrpc.INVALID_REQUEST, f"Method Not Allowed: {method} is not part of protocol revision {version}"), {"allow": "POST"})
                return
            ctx = Ctx(headers, raw_headers, credentials, principal, False, version, group=group)
            if method == "GET":
                await self._run(receive, send, lambda reply: self._stream(ctx, reply), {})
            else:
                await self._run(receive, send, lambda reply: self.sessions.delete(ctx, reply), {})
        else:
            await plain_reply(send, 405, jsonrpc.error(None, jsonrpc.INVALID_REQUEST, f"Method Not Allowed: {method}"), {"allow": "GET, POST, DELETE"})

    def _credentials(self, scope: Scope, headers: dict[str, str]) -> tuple[Credentials, Principal | None]:
        """The seam for the authentication middleware: `scope["state"]["dharma.credentials"]` (set by
        `gateway.transports.http_auth`, which also strips the credential headers) wins over the headers.

        With them comes the principal the middleware resolved from them (`dharma.principal`, through
        this gateway's `principal_for` a moment ago, nothing awaited since): reused rather than
        resolved again, which for an API key is a digest compared with every key of the policy.
        None when the principal is still to be resolved."""
        state = scope.get("state") or {}
        given = state.get(STATE_CREDENTIALS, state.get("credentials")) if isinstance(state, dict) else None
        if isinstance(given, Credentials) and given != Credentials():
            resolved = state.get(STATE_PRINCIPAL)
            return given, resolved if isinstance(resolved, Principal) else None
        key = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if not key and auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
        if key:
            return Credentials(api_key=key), None
        if self.anonymous_user is not None:
            return Credentials(local_user=self.anonymous_user), None
        return Credentials(), None

    async def _run(self, receive: Receive, send: Send, work: Callable[[Reply], Awaitable[None]], base: dict[str, str],
                   store: EventStore | None = None) -> None:
        """Run a handler in this request's own task, its Reply written straight to `send`; a client
        disconnect cancels the handler (and so the upstream request), unless the reply was detached:
        then the handler finishes into the store.

        One cancel scope around the handler, and the disconnect noticed without a task of its own
        where `dharma serve`'s protocol runs the request (`http_protocol.WatchedEvent`: told when
        uvicorn's `receive()` would answer `http.disconnect`), else by a plain asyncio task
        watching `receive()`. An anyio task group cost about 90 µs of CPU per request; the watching
        task and a shielded scope for a reply already finished cost ~4.4 µs in a hot loop and
        ~40 µs a call in `dharma serve` (its creation, wake-ups, cancellation, and the running-loop
        lookups each makes, a `getpid` system call apiece). The scopes are made from the running
        backend's own class, found on the first request: `anyio.CancelScope()` asks sniffio which
        library runs on every call (~2.5 µs each).
        """
        writer = AsgiWriter(send)
        reply = Reply(base, writer)
        if store is not None:
            reply.resumable(store)
        scope_class = self._scope_class
        if scope_class is None:
            scope_class = self._scope_class = type(anyio.CancelScope())
        handler = scope_class()
        running = True

        def stop() -> None:
            if running and not reply.detached:
                handler.cancel()

        writer.on_broken = stop
        cycle = getattr(receive, "__self__", None)
        event = getattr(cycle, "message_event", None)
        watcher: asyncio.Future[None] | None = None
        if type(event) is WatchedEvent and not cycle.waiting_for_100_continue:  # type: ignore[union-attr]

            def gone() -> None:
                if cycle.disconnected or cycle.response_complete:  # type: ignore[union-attr]
                    stop()

            event.watcher = gone
            reply.loop = event.loop
            if cycle.disconnected or cycle.response_complete:  # type: ignore[union-attr]
                event.loop.call_soon(gone)
            else:
                cycle.flow.resume_reading()  # type: ignore[union-attr]  # as a `receive()` waiting would
        else:
            event = None

            async def watch() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        stop()
                        return

            watcher = asyncio.ensure_future(watch())
        try:
            try:
                with handler:
                    await work(reply)
            except Exception:
                log.exception("mcp_http.handler_failed")
                await reply.final(jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this request"), 500)
            finally:
                running = False
                if writer.ended and reply.settled:
                    await reply.aclose()  # nothing left that awaits: no shield needed
                else:
                    with scope_class(shield=True):
                        await reply.aclose()
                        await writer.finish()
        finally:
            if event is not None:
                event.watcher = None
            if watcher is not None:
                watcher.cancel()
        if watcher is not None and watcher.done() and not watcher.cancelled():
            watcher.result()  # a failure of receive() surfaces as it did from the task group

    # ---- POST ---------------------------------------------------------------------------

    async def _post(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str],
                    raw_headers: list[tuple[str, str]], credentials: Credentials, principal: Principal, group: Group | None) -> None:
        body, too_big = await read_body(receive, self.max_body_bytes)
        version = headers.get(mh.PROTOCOL_VERSION)
        ctx = Ctx(headers, raw_headers, credentials, principal, version in MODERN_VERSIONS, version, group=group)
        if too_big is not None:
            reason = f"Invalid Request: message of {too_big} bytes exceeds the gateway's limit of {self.max_body_bytes} bytes"
            await self.tools.record_refusal(ctx, "oversized", reason)
            await plain_reply(send, 413, jsonrpc.error(jsonrpc.sniff_id(body), jsonrpc.INVALID_REQUEST, reason))
            return
        parsed = jsonrpc.parse(body)
        if not ctx.modern and isinstance(parsed, Request) and isinstance(parsed.params, dict):
            meta = parsed.params.get("_meta")
            if isinstance(meta, dict) and isinstance(meta.get(META_VERSION), str) and version not in LEGACY_VERSIONS \
                    and meta[META_VERSION] not in LEGACY_VERSIONS:
                ctx.modern, ctx.version = True, meta[META_VERSION]
        if not ctx.modern:
            sid = headers.get("mcp-session-id")
            if sid is not None:
                try:
                    session = await self.sessions.find(sid, principal.id)
                except StoreUnavailable as exc:
                    log.warning("mcp_http.session_store_unavailable", error=str(exc))
                    await plain_reply(send, 503, unavailable(exc))
                    return
                if session is None:
                    await plain_reply(send, 404, jsonrpc.error(None, -32001, "Session not found"))
                    return
                ctx.session = session
        if ctx.session is None:
            await self._run(receive, send, lambda reply: self._message(ctx, reply, parsed, body), {})
            return
        store = ctx.session.events if resumable_version(version) else None
        local = ctx.session.local
        local.open += 1  # in flight: the reaper keeps the session alive meanwhile
        try:
            await self._run(receive, send, lambda reply: self._message(ctx, reply, parsed, body), {}, store)
        finally:
            local.open -= 1

    async def _message(self, ctx: Ctx, reply: Reply, parsed: jsonrpc.Parsed, raw: bytes) -> None:
        if isinstance(parsed, Batch):
            revision = ctx.session.version if ctx.session is not None else ctx.version
            if ctx.modern or revision not in BATCH_VERSIONS:
                reason = (f"Invalid Request: JSON-RPC batches are not allowed on protocol revision {revision or 'none negotiated'} "
                          "(only 2025-03-26 has them)")
                await self.tools.record_refusal(ctx, "batch", reason)
                await reply.final(jsonrpc.error(None, jsonrpc.INVALID_REQUEST, reason), 400)
                return
            answers = []
            for item in parsed.items:
                part = Collect()
                await self._safely(ctx, part, item, None)
                if isinstance(part.message, dict) and ("result" in part.message or "error" in part.message):
                    answers.append(part.message)
            if answers:
                await reply.final(jsonrpc.dumps(answers), 200)
            else:
                await reply.final(None, 202)
            return
        await self._safely(ctx, reply, parsed, raw)

    async def _safely(self, ctx: Ctx, reply: Reply, item: Any, raw: bytes | None) -> None:
        """Handle one message; a failure is logged and answered -32603 with the request's id (a
        batch's other messages and the endpoint go on)."""
        try:
            await self._single(ctx, reply, item, raw)
        except Exception:
            rpc_id = item.id if isinstance(item, Request) else None
            log.exception("mcp_http.message_failed", method=getattr(item, "method", None), request_id=rpc_id)
            await reply.final(jsonrpc.error(rpc_id, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this message"), 500)

    async def _single(self, ctx: Ctx, reply: Reply, item: Any, raw: bytes | None) -> None:
        data = raw if raw is not None else jsonrpc.dumps(getattr(item, "message", {}))
        if isinstance(item, Invalid):
            await self.tools.record_refusal(ctx, item.method or "jsonrpc", item.reason)
            await reply.final(jsonrpc.error(item.id, item.code, item.reason), 400)
            return
        if isinstance(item, Response):
            await self.relay.client_response(ctx, reply, item, data)
            return
        if isinstance(item, Notification):
            if item.method == "tools/call":
                reason = "Invalid Request: tools/call must be a request with an id, not a notification"
                await self.tools.record_refusal(ctx, "tools/call", reason)
                await reply.final(jsonrpc.error(None, jsonrpc.INVALID_REQUEST, reason), 400)
                return
            await self.relay.client_notification(ctx, reply, item, data)
            return
        assert isinstance(item, Request)
        if not ctx.modern and item.method != "initialize" and ctx.session is None:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return
        if ctx.modern:
            params = obj(item.params)
            ctx.meta = obj(params.get("_meta"))
            enveloped = META_VERSION in ctx.meta and META_CAPABILITIES in ctx.meta
            # Same order as the SDK's ladder: a request without the envelope is the upstream's to refuse.
            problem = mh.check(ctx.raw_headers, item.message) if item.method != "tools/call" and enveloped else None
            if problem is not None:
                await self.tools.record_refusal(ctx, item.method, problem)
                await reply.final(jsonrpc.error(item.id, HEADER_MISMATCH, problem), 400)
                return
        if item.method == "initialize" and not ctx.modern:
            try:
                await self.sessions.initialize(ctx, reply, item, data)
            except LimitReached as exc:
                await self._limit_refusal(ctx, reply, item.id, item.method, exc)
        elif item.method == "tools/list":
            await self.tools.tools_list(ctx, reply, item, data)
        elif item.method == "tools/call":
            await self.tools.tools_call(ctx, reply, item)
        else:
            if item.method not in CLIENT_METHODS:
                await calls.record_passthrough(self.gateway, self.tools.site(ctx), self.relay.primary.id, item.method)
            await self.relay.relay(ctx, reply, self.relay.primary, data, item.message, expect_id=item.id)


def build_mcp_app(gateway: Gateway, settings: Any, *, max_body_bytes: int) -> McpHttpApp | None:
    """The /mcp app for the MCP upstreams in `settings` and the gateway's own tools (its python and
    http backends, served by `LocalServer`: the only upstream when no MCP one is configured, else
    the last). None when there is nothing to serve."""
    from gateway.transports.upstreams.mcp_http import McpHttpUpstream

    configs = [u for u in settings.upstreams if u.is_mcp]
    if not configs and not gateway.catalog():
        return None
    store, link = session_store(settings, configs)
    upstreams: list[Upstream] = []
    for cfg in configs:
        if cfg.type == "mcp_http":
            upstreams.append(McpHttpUpstream(cfg.id, cfg.url, prefix=cfg.prefix, headers=cfg.headers, forward_host=cfg.forward_host))
        else:
            from gateway.transports.upstreams.mcp_stdio import McpStdioUpstream

            upstreams.append(McpStdioUpstream(cfg.id, [cfg.command, *cfg.args], env=cfg.env, prefix=cfg.prefix,
                                              max_processes=settings.mcp.max_stdio_processes,
                                              idle_seconds=settings.mcp.session_idle_seconds))
    if gateway.catalog():
        from gateway.transports.mcp_http.local import LocalServer

        upstreams.append(LocalServer(gateway, version=_version()))
    from gateway.runtime import pin_store_for

    mcp = settings.mcp
    return McpHttpApp(
        gateway,
        upstreams,
        pins=pin_store_for(gateway, settings),
        max_body_bytes=max_body_bytes,
        anonymous_user=mcp.anonymous_user,
        hold_seconds=mcp.hold_seconds,
        progress_interval=mcp.progress_interval,
        session_idle_seconds=mcp.session_idle_seconds,
        sessions=store,
        session_link=link,
        limits=mcp.session_limits(),
        path=mcp.path,
        groups=groups_from(settings),
    )


def _version() -> str:
    """The installed gateway's version (the `serverInfo` its own MCP server gives)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dharma-gateway")
    except PackageNotFoundError:
        return "0"


def session_store(settings: Any, configs: Sequence[Any]) -> tuple[SessionStore | None, Any]:
    """Where legacy sessions live: Redis shared by every replica when `redis.url` is set, else this
    process's memory (None: the app's default). Shared sessions with a stdio upstream are refused:
    each replica runs its own child process, so an upstream session cannot move between replicas."""
    if settings.redis.url is None:
        return None, None
    stdio = [u.id for u in configs if u.type == "mcp_stdio"]
    if stdio:
        raise ConfigError(
            f"upstreams {', '.join(stdio)}: an mcp_stdio upstream cannot serve MCP sessions shared through Redis "
            "(redis.url is set): each replica would run its own copy of the server, so a session opened on one "
            "replica could not continue on another. Reach the server over Streamable HTTP (type: mcp_http, one "
            "server every replica shares), or run a single replica without redis.url")
    from gateway.stores.redis import connect
    from gateway.stores.redis_sessions import RedisSessionStore

    link = connect(settings.redis)
    block = max(0.05, settings.redis.operation_timeout_seconds / 2)
    return RedisSessionStore(link, settings.mcp.session_idle_seconds, block_seconds=block, limits=settings.mcp.session_limits()), link
