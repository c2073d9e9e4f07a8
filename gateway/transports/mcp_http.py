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
  session's store of events the gateway governed and sent (`mcp_events`), and `Last-Event-ID` is
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

Several upstreams: each may have a tool-name `prefix`; `tools/list` merges them (every page of
each, one page to the client); `tools/call` routes by prefix; other requests go to the first
upstream. The client's credentials (Authorization, X-API-Key, cookies) are never forwarded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import structlog
from starlette.types import Receive, Scope, Send

from gateway.backends import BackendResult
from gateway.call import BlockClass, Credentials, Decision, Outcome, Principal, Status, ToolCall, ToolInfo
from gateway.errors import CallError, ErrorCode
from gateway.gateway import Gateway, new_request_id
from gateway.mcp import approval as ap
from gateway.mcp import governance as gov
from gateway.mcp import holding
from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Batch, Invalid, Notification, Request, Response
from gateway.mcp.pins import PinStore, observe_or_distrust
from gateway.mcp.versions import (
    BATCH_VERSIONS,
    HEADER_MISMATCH,
    ID_PREFIX,
    LEGACY_VERSIONS,
    META_CAPABILITIES,
    META_VERSION,
    MODERN_VERSIONS,
    UNSUPPORTED_VERSION,
    at_least,
)
from gateway.stages.tier_gate import is_granted, visible_tools
from gateway.transports import mcp_headers as mh
from gateway.transports.mcp_events import EventStore, StreamLog
from gateway.transports.upstream_http import UpstreamError, UpstreamReply

log = structlog.get_logger()

UNAUTHORIZED = -31002
#: Where the authentication middleware (`gateway.http_auth.HttpAuth`) leaves what it verified.
STATE_CREDENTIALS = "dharma.credentials"
#: The reconnection delay (ms) the gateway's priming events suggest to resuming clients.
RETRY_MS = 1000
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache, no-transform", "x-accel-buffering": "no"}
#: Client headers forwarded upstream (with the routing headers); nothing that authenticates the client.
FORWARDED = ("accept", "content-type", "mcp-protocol-version", "origin", "user-agent")


class Upstream(Protocol):
    """An upstream MCP server as `/mcp` uses it (`upstream_http.McpHttpUpstream`, `upstream_stdio.McpStdioUpstream`)."""

    id: str
    prefix: str
    forward_host: bool

    def post(self, body: bytes, headers: dict[str, str], *, expect_id: jsonrpc.RpcId | None = None) -> Any: ...
    def get(self, headers: dict[str, str]) -> Any: ...
    async def delete(self, headers: dict[str, str]) -> UpstreamReply: ...
    async def aclose(self) -> None: ...


# ---- what a handler produces for the ASGI writer -----------------------------------------


@dataclass(slots=True)
class _Head:
    status: int
    headers: dict[str, str]


@dataclass(slots=True)
class _Event:
    data: bytes
    id: str | None = None
    retry: int | None = None


@dataclass(slots=True)
class _Final:
    body: bytes | None
    status: int = 200
    headers: dict[str, str] | None = None


class Reply:
    """The answer to one HTTP request, produced while the handler runs: JSON, or an event stream
    that opens on the first event (or explicitly, to mirror an upstream that answered SSE).

    A resumable reply (`resumable`, legacy 2025-11-25+ clients) numbers its events with the
    gateway's own ids, primes its stream (an id, `retry:`, empty data) and keeps every event it
    sends in the session's `EventStore`. `detach()` ends the HTTP response early, as the upstream
    did; the handler keeps running and its later events go to the store only, for the client to
    fetch with GET + `Last-Event-ID`.
    """

    def __init__(self, base_headers: dict[str, str] | None = None) -> None:
        self._send, self.stream = anyio.create_memory_object_stream[object](math.inf)
        self.sse = False
        self.done = False
        self.detached = False
        self.base_headers = base_headers or {}
        self.message: Any = None  # the last final JSON-RPC message (for batches)
        self.store: EventStore | None = None
        self.log: StreamLog | None = None

    def resumable(self, store: EventStore) -> None:
        """Number and keep this reply's events in `store` if it becomes an event stream."""
        if not self.sse:
            self.store = store

    async def open_sse(self, status: int = 200, headers: dict[str, str] | None = None, *, log: StreamLog | None = None) -> None:
        if not self.sse and not self.done:
            self.sse = True
            await self._send.send(_Head(status, {**SSE_HEADERS, **self.base_headers, **(headers or {})}))
            if self.store is not None:
                if log is not None:
                    self.log = log
                else:
                    self.log = self.store.open()
                    await self._send.send(_Event(b"", self.store.append(self.log, b""), RETRY_MS))

    async def event(self, data: bytes) -> None:
        if self.done:
            return
        await self.open_sse()
        event_id = self.store.append(self.log, data) if self.store is not None and self.log is not None else None
        if not self.detached:
            await self._send.send(_Event(data, event_id))

    async def resend(self, event_id: str, data: bytes) -> None:
        """Send an event again with its original id (a replay from the store; not stored twice)."""
        if not self.done and not self.detached:
            await self.open_sse()
            await self._send.send(_Event(data, event_id))

    async def detach(self) -> None:
        """End the client's event stream now (the upstream closed its own early); keep governing."""
        if self.sse and self.log is not None and not self.done and not self.detached:
            self.detached = True
            await self._send.send(_Final(None))

    async def final(self, body: bytes | dict[str, Any] | None, status: int = 200, headers: dict[str, str] | None = None) -> None:
        if self.done:
            return
        data = jsonrpc.dumps(body) if isinstance(body, dict) else body
        if isinstance(body, dict):
            self.message = body
        if self.sse:
            if data:
                await self.event(data)
            self.done = True
            if not self.detached:
                await self._send.send(_Final(None))
        else:
            self.done = True
            hdrs = {**self.base_headers, **(headers or {})}
            if data and "content-type" not in hdrs:
                hdrs["content-type"] = "application/json"
            await self._send.send(_Final(data, status, hdrs))
        self.close()

    def close(self) -> None:
        self._send.close()
        if self.store is not None and self.log is not None:
            self.store.finish(self.log)


class _Collect(Reply):
    """A Reply for one element of a batch: only the final message matters."""

    async def event(self, data: bytes) -> None:
        return None

    async def open_sse(self, status: int = 200, headers: dict[str, str] | None = None, *, log: StreamLog | None = None) -> None:
        return None

    async def final(self, body: bytes | dict[str, Any] | None, status: int = 200, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, dict):
            self.message = body
        elif body:
            try:
                self.message = jsonrpc.loads(body)
            except ValueError:
                self.message = None
        self.done = True


# ---- per-session and per-request state ---------------------------------------------------


class _Waiter:
    def __init__(self) -> None:
        self.event = anyio.Event()
        self.value: dict[str, Any] | None = None


@dataclass(slots=True)
class Catalog:
    """Tool definitions seen, by the name the client sees: (upstream, definition as the upstream sent it)."""

    tools: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    loaded: set[str] = field(default_factory=set)


@dataclass(slots=True)
class HttpSession:
    """A legacy session as the gateway keeps it: never leaves this process (see module docstring)."""

    id: str
    principal: str
    nonce: str = field(default_factory=lambda: secrets.token_hex(6))
    version: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    upstream_sids: dict[str, str | None] = field(default_factory=dict)
    upstream_versions: dict[str, str] = field(default_factory=dict)
    catalog: Catalog = field(default_factory=Catalog)
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    holds: dict[Any, anyio.CancelScope] = field(default_factory=dict)
    events: EventStore = field(default_factory=EventStore)
    last_used: float = field(default_factory=time.monotonic)
    counter: int = 0

    def originate(self) -> str:
        self.counter += 1
        return f"{ID_PREFIX}{self.nonce}/{self.counter}"


@dataclass(slots=True)
class Ctx:
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    credentials: Credentials
    principal: Principal
    modern: bool
    version: str | None
    session: HttpSession | None = None
    meta: dict[str, Any] = field(default_factory=dict)


# ---- the app ------------------------------------------------------------------------------


class McpHttpApp:
    """The `/mcp` endpoint (pure ASGI). See the module docstring."""

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
        session_idle_seconds: float = 1800.0,
    ) -> None:
        if not upstreams:
            raise ValueError("the MCP endpoint needs at least one upstream")
        self.gateway = gateway
        self.upstreams = list(upstreams)
        self.by_id = {u.id: u for u in self.upstreams}
        self.primary = self.upstreams[0]
        self.multi = len(self.upstreams) > 1
        self.pins = pins
        self.max_body_bytes = max_body_bytes
        self.anonymous_user = anonymous_user
        self.hold_seconds = hold_seconds
        self.progress_interval = progress_interval
        self.session_idle_seconds = session_idle_seconds
        self.sessions: dict[str, HttpSession] = {}
        self.modern_catalog = Catalog()
        self._sealer = ap.StateSealer(secrets.token_bytes(32))
        self._counter = 0
        self._by_prefix = sorted(self.upstreams, key=lambda u: len(u.prefix), reverse=True)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The endpoint's lifetime (the app's lifespan): background pumps of stdio upstreams run
        in this task group; on exit every upstream is closed."""
        async with anyio.create_task_group() as tg:
            for upstream in self.upstreams:
                if hasattr(upstream, "task_group"):
                    upstream.task_group = tg
            try:
                yield
            finally:
                await self.aclose()
                tg.cancel_scope.cancel()

    async def aclose(self) -> None:
        for upstream in self.upstreams:
            try:
                await upstream.aclose()
            except Exception as exc:  # closing is best effort
                log.warning("upstream.close_failed", upstream=upstream.id, error=str(exc))

    # ---- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        raw_headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        headers = dict(raw_headers)
        credentials = self._credentials(scope, headers)
        principal = self.gateway.principal_for(credentials)
        if principal is None:
            await _plain(send, 401, jsonrpc.error(None, UNAUTHORIZED, "Unauthorized: present an API key (Authorization: Bearer <key> or X-API-Key)"),
                         {"www-authenticate": 'Bearer realm="dharma-gateway"'})
            return
        version = headers.get(mh.PROTOCOL_VERSION)
        if method == "POST":
            await self._post(scope, receive, send, headers, raw_headers, credentials, principal)
        elif method in ("GET", "DELETE"):
            if version in MODERN_VERSIONS:
                await _plain(send, 405, jsonrpc.error(None, jsonrpc.INVALID_REQUEST, f"Method Not Allowed: {method} is not part of protocol revision {version}"), {"allow": "POST"})
                return
            ctx = Ctx(headers, raw_headers, credentials, principal, False, version)
            if method == "GET":
                await self._run(receive, send, lambda reply: self._get(ctx, reply), {})
            else:
                await self._run(receive, send, lambda reply: self._delete(ctx, reply), {})
        else:
            await _plain(send, 405, jsonrpc.error(None, jsonrpc.INVALID_REQUEST, f"Method Not Allowed: {method}"), {"allow": "GET, POST, DELETE"})

    def _credentials(self, scope: Scope, headers: dict[str, str]) -> Credentials:
        """The seam for the authentication middleware: `scope["state"]["dharma.credentials"]` (set by
        `gateway.http_auth`, which also strips the credential headers) wins over the headers."""
        state = scope.get("state") or {}
        given = state.get(STATE_CREDENTIALS, state.get("credentials")) if isinstance(state, dict) else None
        if isinstance(given, Credentials) and given != Credentials():
            return given
        key = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if not key and auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
        if key:
            return Credentials(api_key=key)
        if self.anonymous_user is not None:
            return Credentials(local_user=self.anonymous_user)
        return Credentials()

    async def _run(self, receive: Receive, send: Send, work: Callable[[Reply], Awaitable[None]], base: dict[str, str],
                   store: EventStore | None = None) -> None:
        """Run a handler and stream its Reply; a client disconnect cancels the handler (and so the
        upstream request), unless the reply was detached: then the handler finishes into the store."""
        reply = Reply(base)
        if store is not None:
            reply.resumable(store)

        async def run() -> None:
            try:
                await work(reply)
            except Exception:
                log.exception("mcp_http.handler_failed")
                await reply.final(jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this request"), 500)
            finally:
                reply.close()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not reply.detached:
                        tg.cancel_scope.cancel()
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            tg.start_soon(watch)
            try:
                await _write(reply, send)
            except OSError:
                pass
            if not reply.detached:
                tg.cancel_scope.cancel()

    # ---- POST ---------------------------------------------------------------------------

    async def _post(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str],
                    raw_headers: list[tuple[str, str]], credentials: Credentials, principal: Principal) -> None:
        body, too_big = await _read_body(receive, self.max_body_bytes)
        version = headers.get(mh.PROTOCOL_VERSION)
        ctx = Ctx(headers, raw_headers, credentials, principal, version in MODERN_VERSIONS, version)
        if too_big is not None:
            reason = f"Invalid Request: message of {too_big} bytes exceeds the gateway's limit of {self.max_body_bytes} bytes"
            await self._record_refusal(ctx, "", "oversized", reason)
            await _plain(send, 413, jsonrpc.error(jsonrpc.sniff_id(body), jsonrpc.INVALID_REQUEST, reason))
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
                session = self.sessions.get(sid)
                if session is None or session.principal != principal.id:
                    await _plain(send, 404, jsonrpc.error(None, -32001, "Session not found"))
                    return
                session.last_used = time.monotonic()
                ctx.session = session
        store = ctx.session.events if ctx.session is not None and resumable_version(version) else None
        await self._run(receive, send, lambda reply: self._message(ctx, reply, parsed, body), {}, store)

    async def _message(self, ctx: Ctx, reply: Reply, parsed: jsonrpc.Parsed, raw: bytes) -> None:
        if isinstance(parsed, Batch):
            revision = ctx.session.version if ctx.session is not None else ctx.version
            if ctx.modern or revision not in BATCH_VERSIONS:
                reason = (f"Invalid Request: JSON-RPC batches are not allowed on protocol revision {revision or 'none negotiated'} "
                          "(only 2025-03-26 has them)")
                await self._record_refusal(ctx, "", "batch", reason)
                await reply.final(jsonrpc.error(None, jsonrpc.INVALID_REQUEST, reason), 400)
                return
            answers = []
            for item in parsed.items:
                part = _Collect()
                await self._single(ctx, part, item, None)
                if isinstance(part.message, dict) and ("result" in part.message or "error" in part.message):
                    answers.append(part.message)
            if answers:
                await reply.final(jsonrpc.dumps(answers), 200)
            else:
                await reply.final(None, 202)
            return
        await self._single(ctx, reply, parsed, raw)

    async def _single(self, ctx: Ctx, reply: Reply, item: Any, raw: bytes | None) -> None:
        data = raw if raw is not None else jsonrpc.dumps(getattr(item, "message", {}))
        if isinstance(item, Invalid):
            await self._record_refusal(ctx, "", item.method or "jsonrpc", item.reason)
            await reply.final(jsonrpc.error(item.id, item.code, item.reason), 400)
            return
        if isinstance(item, Response):
            await self._client_response(ctx, reply, item, data)
            return
        if isinstance(item, Notification):
            if item.method == "tools/call":
                reason = "Invalid Request: tools/call must be a request with an id, not a notification"
                await self._record_refusal(ctx, "", "tools/call", reason)
                await reply.final(jsonrpc.error(None, jsonrpc.INVALID_REQUEST, reason), 400)
                return
            await self._client_notification(ctx, reply, item, data)
            return
        assert isinstance(item, Request)
        if not ctx.modern and item.method != "initialize" and ctx.session is None:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return
        if ctx.modern:
            params = _obj(item.params)
            ctx.meta = _obj(params.get("_meta"))
            enveloped = META_VERSION in ctx.meta and META_CAPABILITIES in ctx.meta
            # Same order as the SDK's ladder: a request without the envelope is the upstream's to refuse.
            problem = mh.check(ctx.raw_headers, item.message) if item.method != "tools/call" and enveloped else None
            if problem is not None:
                await self._record_refusal(ctx, "", item.method, problem)
                await reply.final(jsonrpc.error(item.id, HEADER_MISMATCH, problem), 400)
                return
        if item.method == "initialize" and not ctx.modern:
            await self._initialize(ctx, reply, item, data)
        elif item.method == "tools/list":
            await self._tools_list(ctx, reply, item, data)
        elif item.method == "tools/call":
            await self._tools_call(ctx, reply, item)
        else:
            await self._relay(ctx, reply, self.primary, data, item.message, expect_id=item.id)

    # ---- headers and relaying -------------------------------------------------------------

    def _up_headers(self, ctx: Ctx, upstream: Upstream, message: dict[str, Any] | None = None, schema: Any = None) -> dict[str, str]:
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

    def _session_header(self, ctx: Ctx) -> dict[str, str]:
        return {"mcp-session-id": ctx.session.id} if ctx.session is not None else {}

    async def _relay(
        self,
        ctx: Ctx,
        reply: Reply,
        upstream: Upstream,
        data: bytes,
        message: dict[str, Any] | None,
        *,
        expect_id: jsonrpc.RpcId | None,
        on_answer: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
        on_head: Callable[[UpstreamReply], dict[str, str]] | None = None,
    ) -> None:
        """Forward one message and mirror the upstream's answer (status, JSON or SSE)."""
        # The message goes on unchanged, so the client's routing headers go on unchanged too (the
        # upstream validates them itself); only rewritten or gateway-made messages get new ones.
        try:
            async with upstream.post(data, self._up_headers(ctx, upstream), expect_id=expect_id) as up:
                extra = on_head(up) if on_head is not None else self._session_header(ctx)
                if up.sse:
                    await reply.open_sse(up.status, extra)
                    up.on_pause = reply.detach
                    async for chunk in up.messages():
                        out = await self._from_upstream(ctx, upstream, chunk, expect_id, on_answer)
                        if out is not None:
                            await reply.event(out)
                    await reply.final(None)
                    return
                body = up.body
                if on_answer is not None and body.strip():
                    out = await self._from_upstream(ctx, upstream, body, expect_id, on_answer)
                    body = out if out is not None else body
                hdrs = dict(extra)
                if "content-type" in up.headers and body:
                    hdrs["content-type"] = up.headers["content-type"]
                if "allow" in up.headers:
                    hdrs["allow"] = up.headers["allow"]
                await reply.final(body or None, up.status, hdrs)
        except UpstreamError as exc:
            await reply.final(jsonrpc.error(expect_id, jsonrpc.BACKEND_FAILED, f"Dharma Gateway: {exc.message}"), 502)

    async def _from_upstream(
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
            self._catalog(ctx).stale.add(upstream.id)
        if "id" in msg and self.multi:
            msg = {**msg, "id": f"{ID_PREFIX}u/{upstream.id}/{json.dumps(msg['id'])}"}
            return jsonrpc.dumps(msg)
        return data

    async def _client_response(self, ctx: Ctx, reply: Reply, item: Response, data: bytes) -> None:
        rid = item.id
        session = ctx.session
        if isinstance(rid, str) and rid.startswith(ID_PREFIX) and session is not None:
            waiter = session.waiters.get(rid)
            if waiter is not None:
                waiter.value = item.message
                waiter.event.set()
                await reply.final(None, 202)
                return
            prefix = f"{ID_PREFIX}u/"
            if rid.startswith(prefix):
                uid, _, original = rid[len(prefix):].partition("/")
                upstream = self.by_id.get(uid)
                if upstream is not None:
                    try:
                        restored = json.loads(original)
                    except ValueError:
                        restored = None
                    if jsonrpc.valid_id(restored):
                        message = {**item.message, "id": restored}
                        await self._relay(ctx, reply, upstream, jsonrpc.dumps(message), None, expect_id=None)
                        return
        if session is None and not ctx.modern:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return
        await self._relay(ctx, reply, self.primary, data, None, expect_id=None)

    async def _client_notification(self, ctx: Ctx, reply: Reply, item: Notification, data: bytes) -> None:
        session = ctx.session
        if item.method == "notifications/cancelled" and session is not None and isinstance(item.params, dict):
            scope = session.holds.get(("c", item.params.get("requestId")))
            if scope is not None:
                scope.cancel()
                await reply.final(None, 202)
                return
        if not ctx.modern and session is None:
            await reply.final(jsonrpc.error(None, -32000, "Bad Request: Missing session ID"), 400)
            return
        if self.multi and not ctx.modern:
            for other in self.upstreams[1:]:
                try:
                    async with other.post(data, self._up_headers(ctx, other)) as _up:
                        pass
                except UpstreamError as exc:
                    log.warning("upstream.notification_failed", upstream=other.id, error=exc.message)
        await self._relay(ctx, reply, self.primary, data, item.message, expect_id=None)

    # ---- initialize, GET, DELETE -----------------------------------------------------------

    async def _initialize(self, ctx: Ctx, reply: Reply, req: Request, data: bytes) -> None:
        params = _obj(req.params)
        session = HttpSession(id="dgs_" + secrets.token_urlsafe(32), principal=ctx.principal.id)
        caps = params.get("capabilities")
        session.capabilities = dict(caps) if isinstance(caps, dict) else {}
        ctx.session = session
        requested = params.get("protocolVersion")
        if isinstance(requested, str) and resumable_version(requested):
            reply.resumable(session.events)
        others_have_tools = False
        for other in self.upstreams[1:]:
            rid = session.originate()
            message = jsonrpc.request(rid, "initialize", params)
            try:
                answer, up = await self._request(ctx, other, message, timeout=self.gateway.policy.backend_timeout_seconds)
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
                async with other.post(note, self._up_headers(ctx, other)) as _up:
                    pass
            except UpstreamError:
                pass

        def on_head(up: UpstreamReply) -> dict[str, str]:
            if up.status != 200:
                return {}
            session.upstream_sids[self.primary.id] = up.session_id
            self.sessions[session.id] = session
            return {"mcp-session-id": session.id}

        async def on_answer(msg: dict[str, Any]) -> dict[str, Any]:
            result = msg.get("result")
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                session.version = result["protocolVersion"]
                session.upstream_versions[self.primary.id] = result["protocolVersion"]
                if others_have_tools and not isinstance((result.get("capabilities") or {}).get("tools"), dict):
                    caps = dict(result.get("capabilities") or {})
                    caps["tools"] = {"listChanged": True}
                    return {**msg, "result": {**result, "capabilities": caps}}
            return msg

        await self._relay(ctx, reply, self.primary, data, req.message, expect_id=req.id, on_answer=on_answer, on_head=on_head)
        log.info("mcp_http.session_opened", session=session.id[:12], principal=ctx.principal.id, version=session.version)

    async def _get(self, ctx: Ctx, reply: Reply) -> None:
        sid = ctx.headers.get("mcp-session-id")
        session = self.sessions.get(sid) if sid else None
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
            await reply.open_sse(200, self._session_header(ctx), log=stream)
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
                headers = self._up_headers(ctx, upstream)
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
                        await reply.open_sse(200, self._session_header(ctx), log=stream)
                        async for chunk in up.messages():
                            out = await self._from_upstream(ctx, upstream, chunk, None, None)
                            if out is not None:
                                await reply.event(out)
                except UpstreamError as exc:
                    log.warning("upstream.get_failed", upstream=upstream.id, error=exc.message)
                    if primary:
                        await reply.final(jsonrpc.error(None, jsonrpc.BACKEND_FAILED, f"Dharma Gateway: {exc.message}"), 502)
                        tg.cancel_scope.cancel()

            for i, upstream in enumerate(self.upstreams):
                tg.start_soon(pump, upstream, i == 0)
        await reply.final(None)

    async def _delete(self, ctx: Ctx, reply: Reply) -> None:
        sid = ctx.headers.get("mcp-session-id")
        session = self.sessions.get(sid) if sid else None
        if session is None or session.principal != ctx.principal.id:
            status, error = (404, jsonrpc.error(None, -32001, "Session not found")) if sid else (400, jsonrpc.error(None, -32000, "Bad Request: Missing session ID"))
            await reply.final(error, status)
            return
        ctx.session = session
        status, body, hdrs = 200, b"", {}
        for i, upstream in enumerate(self.upstreams):
            headers = self._up_headers(ctx, upstream)
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
            self.sessions.pop(session.id, None)
            for scope in list(session.holds.values()):
                scope.cancel()
        await reply.final(body or None, status, hdrs)

    # ---- upstream requests the gateway makes itself ----------------------------------------

    async def _request(self, ctx: Ctx, upstream: Upstream, message: dict[str, Any], *, timeout: float,
                       schema: Any = None) -> tuple[dict[str, Any], UpstreamReply]:
        """Send a request and return its answer (other messages on its stream are dropped)."""
        headers = self._up_headers(ctx, upstream, message, schema)
        if ctx.modern and "mcp-protocol-version" not in {k.lower() for k in headers}:
            headers["mcp-protocol-version"] = ctx.version or "2026-07-28"
        with anyio.fail_after(timeout):
            async with upstream.post(jsonrpc.dumps(message), headers, expect_id=message["id"]) as up:
                async for chunk in up.messages():
                    try:
                        msg = jsonrpc.loads(chunk)
                    except ValueError:
                        continue
                    if isinstance(msg, dict) and msg.get("id") == message["id"] and ("result" in msg or "error" in msg):
                        return msg, up
                raise UpstreamError("unavailable", f"upstream {upstream.id} answered HTTP {up.status} without a JSON-RPC answer")

    def _next_id(self, ctx: Ctx) -> str:
        if ctx.session is not None:
            return ctx.session.originate()
        self._counter += 1
        return f"{ID_PREFIX}m/{self._counter}"

    def _catalog(self, ctx: Ctx) -> Catalog:
        return ctx.session.catalog if ctx.session is not None else self.modern_catalog

    def _client_name(self, upstream: Upstream, name: str) -> str | None:
        """The name the client sees, or None when it would shadow another upstream's prefix."""
        if not upstream.prefix:
            for other in self.upstreams:
                if other.prefix and name.startswith(other.prefix):
                    log.warning("mcp_http.tool_shadowed", upstream=upstream.id, tool=name, prefix_of=other.id)
                    return None
        return upstream.prefix + name

    def _route(self, name: str) -> tuple[Upstream, str] | None:
        for upstream in self._by_prefix:
            if name.startswith(upstream.prefix):
                return upstream, name[len(upstream.prefix):]
        return None

    def _record(self, catalog: Catalog, upstream: Upstream, tools: list[dict[str, Any]], *, first_page: bool) -> list[tuple[str, dict[str, Any]]]:
        if first_page:
            catalog.tools = {k: v for k, v in catalog.tools.items() if v[0] is not upstream}
            catalog.stale.discard(upstream.id)
            catalog.loaded.add(upstream.id)
        named = []
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            cname = self._client_name(upstream, tool["name"])
            if cname is None:
                continue
            catalog.tools[cname] = (upstream, tool)
            named.append((cname, tool))
        return named

    async def _refresh(self, ctx: Ctx, upstream: Upstream) -> None:
        """Load every page of an upstream's tools/list into the catalog (gateway-originated)."""
        catalog = self._catalog(ctx)
        cursor: str | None = None
        first = True
        for _ in range(100):
            params: dict[str, Any] = {}
            if ctx.modern:
                params["_meta"] = {k: v for k, v in ctx.meta.items() if k.startswith("io.modelcontextprotocol/")}
            if cursor:
                params["cursor"] = cursor
            message = jsonrpc.request(self._next_id(ctx), "tools/list", params or None)
            try:
                answer, _up = await self._request(ctx, upstream, message, timeout=self.gateway.policy.backend_timeout_seconds)
            except (UpstreamError, TimeoutError) as exc:
                log.warning("catalog.refresh_failed", upstream=upstream.id, error=str(exc) or type(exc).__name__)
                return
            result = answer.get("result")
            if not isinstance(result, dict):
                return
            tools = [t for t in result.get("tools") or [] if isinstance(t, dict)]
            self._record(catalog, upstream, tools, first_page=first)
            observe_or_distrust(self.pins, upstream.id, tools)
            first = False
            cursor = result.get("nextCursor") if isinstance(result.get("nextCursor"), str) else None
            if not cursor:
                return

    def _visible(self, principal: Principal, upstream: Upstream, named: list[tuple[str, dict[str, Any]]]) -> set[str]:
        changed = observe_or_distrust(self.pins, upstream.id, [t for _, t in named])
        infos = [gov.tool_info({**t, "name": cname}, upstream.id, changed=changed.get(t["name"], False)) for cname, t in named]
        return {t.name for t in visible_tools(self.gateway.policy, principal, infos)}

    # ---- tools/list ---------------------------------------------------------------------

    async def _tools_list(self, ctx: Ctx, reply: Reply, req: Request, data: bytes) -> None:
        catalog = self._catalog(ctx)
        if not self.multi:
            upstream = self.primary
            first_page = not (isinstance(req.params, dict) and req.params.get("cursor"))

            async def on_answer(msg: dict[str, Any]) -> dict[str, Any]:
                result = msg.get("result")
                if not isinstance(result, dict):
                    return msg
                tools = [t for t in result.get("tools") or [] if isinstance(t, dict)]
                named = self._record(catalog, upstream, tools, first_page=first_page)
                visible = self._visible(ctx.principal, upstream, named)
                renamed = dict(result)
                renamed["tools"] = [{**t, "name": cname} if cname != t["name"] else t for cname, t in named]
                return {**msg, "result": gov.filter_list_result(renamed, visible, modern=ctx.modern)}

            await self._relay(ctx, reply, upstream, data, req.message, expect_id=req.id, on_answer=on_answer)
            return
        merged: list[dict[str, Any]] = []
        base: dict[str, Any] = {}
        for upstream in self.upstreams:
            await self._refresh(ctx, upstream)
            named = [(c, t) for c, (u, t) in catalog.tools.items() if u is upstream]
            visible = self._visible(ctx.principal, upstream, named)
            merged.extend({**t, "name": c} for c, t in named if c in visible)
        if ctx.modern:
            base = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
        await reply.final(jsonrpc.result(req.id, {"tools": merged, **base}))

    # ---- tools/call ---------------------------------------------------------------------

    def _call(self, ctx: Ctx, name: str, arguments: Any, meta: Any, method: str = "tools/call") -> ToolCall:
        return gov.tool_call(
            name, arguments, meta, request_id=new_request_id(), credentials=ctx.credentials, method=method,
            protocol_version=ctx.session.version if ctx.session is not None and ctx.session.version else ctx.version,
            session_id=ctx.session.id if ctx.session is not None else None)

    async def _record_refusal(self, ctx: Ctx, name: str, method: str, reason: str, code: int = jsonrpc.INVALID_REQUEST) -> None:
        """Bad input goes in the ledger like any other decision."""
        call = self._call(ctx, name, None, None, method=method or "jsonrpc")
        error = {"code": code, "message": reason}
        refusal = Decision.block(ErrorCode.INVALID_PARAMS, reason, BlockClass.SAFETY_CONTENT, stage="mcp_http")
        try:
            await self.gateway.govern(call, render=lambda _o: {"error": error}, refusal=refusal, request={"jsonrpc_error": error})
        except Exception:
            log.exception("mcp.refusal_not_recorded")

    async def _refuse(self, ctx: Ctx, reply: Reply, req: Request, name: str, code: int, reason: str, status: int = 400,
                      data: Any = None) -> None:
        await self._record_refusal(ctx, name, "tools/call", reason, code)
        await reply.final(jsonrpc.error(req.id, code, reason, data), status)

    async def _tools_call(self, ctx: Ctx, reply: Reply, req: Request) -> None:
        params = req.params if isinstance(req.params, dict) else None
        name = params.get("name") if params is not None else None
        if not isinstance(name, str) or not name:
            await self._refuse(ctx, reply, req, "", jsonrpc.INVALID_PARAMS, "Invalid params: tools/call needs `name`, a non-empty string")
            return
        assert params is not None
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            await self._refuse(ctx, reply, req, name, jsonrpc.INVALID_PARAMS,
                               f"Invalid params: `arguments` must be an object, not {jsonrpc.kind(arguments)}")
            return
        meta = params.get("_meta")
        if ctx.modern:
            if not isinstance(meta, dict) or META_VERSION not in meta or META_CAPABILITIES not in meta:
                await self._refuse(ctx, reply, req, name, jsonrpc.INVALID_PARAMS,
                                   f"params._meta must be an object carrying the required '{META_VERSION}' and "
                                   f"'{META_CAPABILITIES}' envelope keys")
                return
            if meta[META_VERSION] not in MODERN_VERSIONS:
                problem = mh.check(ctx.raw_headers, req.message)
                if problem is not None:
                    await self._refuse(ctx, reply, req, name, HEADER_MISMATCH, problem)
                    return
                await self._refuse(ctx, reply, req, name, UNSUPPORTED_VERSION, "Unsupported protocol version",
                                   data={"supported": sorted(MODERN_VERSIONS), "requested": meta[META_VERSION]})
                return
        catalog = self._catalog(ctx)
        route = self._route(name)
        if route is not None and (route[0].id in catalog.stale or route[0].id not in catalog.loaded or name not in catalog.tools):
            await self._refresh(ctx, route[0])
        entry = catalog.tools.get(name)
        if ctx.modern:
            schema = entry[1].get("inputSchema") if entry is not None else None
            problem = mh.check(ctx.raw_headers, req.message, schema)
            if problem is not None:
                await self._refuse(ctx, reply, req, name, HEADER_MISMATCH, problem)
                return
        approval_id: str | None = None
        if isinstance(params.get("requestState"), str) and params["requestState"].startswith(ap.STATE_PREFIX):
            opened = await holding.apply_state(self.gateway, self._sealer, params, principal=ctx.principal.id, tool=name,
                                               arguments=arguments, now=time.time())
            if isinstance(opened, tuple):
                await self._refuse(ctx, reply, req, name, jsonrpc.INVALID_PARAMS, opened[0])
                return
            approval_id = opened
            stripped = ap.strip_state(_obj(req.params))
            req = Request(req.id, req.method, stripped, {**req.message, "params": stripped})
        upstream, upstream_name = (entry[0], route[1]) if entry is not None and route is not None else (route or (self.primary, name))
        info: ToolInfo | None = None
        if entry is not None:
            changed = observe_or_distrust(self.pins, upstream.id, [entry[1]]).get(entry[1]["name"], True)
            info = gov.tool_info({**entry[1], "name": name}, upstream.id, changed=changed)
        policy = self.gateway.policy
        visible = info is not None and is_granted(policy, ctx.principal, name, policy.annotations_for(name, info.annotations))
        probe: tuple[str, dict[str, Any] | None, int] | None = None
        if not visible:
            alike = gov.lookalike_of(name, set(catalog.tools))
            if alike is not None:
                log.warning("mcp.lookalike_tool_name", name=name, imitates=alike)
            probe = await self._probe_unknown(ctx, upstream, req)
        call = self._call(ctx, name, arguments, meta)
        if approval_id is not None:
            call = dataclasses.replace(call, approval_id=approval_id)
        task = visible and gov.runs_as_task(params, modern=ctx.modern)
        refusal = gov.task_refusal(name) if task and gov.task_conflicts(policy, name) else None
        can_elicit = ap.can_elicit(meta.get(META_CAPABILITIES) if ctx.modern and isinstance(meta, dict) else (ctx.session.capabilities if ctx.session else {}))
        outcome, message, status = await self._govern_once(ctx, reply, call, req, info, upstream, upstream_name, probe,
                                                           mrtr=ctx.modern and can_elicit, refusal=refusal)
        if outcome.status is Status.PENDING_APPROVAL and outcome.approval_id and task:
            await self.gateway.approvals.expire(outcome.approval_id)  # a task cannot wait for a human
            call = dataclasses.replace(call, request_id=new_request_id())
            outcome, message, status = await self._govern_once(ctx, reply, call, req, info, upstream, upstream_name, probe,
                                                               mrtr=False, refusal=gov.task_refusal(name))
        elif outcome.status is Status.PENDING_APPROVAL and outcome.approval_id and not (ctx.modern and can_elicit):
            waited = await self._wait_for_approval(ctx, reply, req, outcome, name, arguments, can_elicit)
            if not waited:
                return
            call = dataclasses.replace(call, approval_id=outcome.approval_id, request_id=new_request_id())
            outcome, message, status = await self._govern_once(ctx, reply, call, req, info, upstream, upstream_name, probe, mrtr=False)
        await reply.final(message, status)

    async def _govern_once(self, ctx: Ctx, reply: Reply, call: ToolCall, req: Request, info: ToolInfo | None,
                           upstream: Upstream, upstream_name: str, probe: tuple[str, dict[str, Any] | None, int] | None,
                           *, mrtr: bool, refusal: Decision | None = None) -> tuple[Outcome, dict[str, Any], int]:
        forwarder = _Forwarder(self, ctx, reply, req, upstream, upstream_name, info)
        rendered: dict[str, Any] = {}

        def render(outcome: Outcome) -> dict[str, Any]:
            if mrtr and outcome.status is Status.PENDING_APPROVAL and outcome.approval_id:
                body = self._input_required(ctx, outcome, call)
                rendered.update(kind="result", body=body, status=200)
                return body
            kind, body, status = _render(outcome, forwarder, info, ctx.modern, probe, self.gateway)
            rendered.update(kind=kind, body=body, status=status)
            return body

        params = _obj(req.params)
        governed = await self.gateway.govern(call, render=render, request={"method": "tools/call", "params": params},
                                             refusal=refusal, tool=info, backend=forwarder if info is not None else None)
        if rendered.get("kind") == "error":
            return governed.outcome, {"jsonrpc": "2.0", "id": req.id, "error": rendered["body"]["error"]}, rendered["status"]
        if "body" not in rendered:  # the ledger failed: govern rendered the failure itself
            return governed.outcome, jsonrpc.result(req.id, gov.refusal_result(governed.outcome, modern=ctx.modern)), 200
        return governed.outcome, jsonrpc.result(req.id, gov.with_receipt(rendered["body"], governed.outcome.receipt)), rendered["status"]

    async def _probe_unknown(self, ctx: Ctx, upstream: Upstream, req: Request) -> tuple[str, dict[str, Any] | None, int]:
        """Ask the upstream about a name no server has, so a hidden tool gets the unknown-tool answer."""
        probe = gov.probe_name()
        params = dict(req.params) if isinstance(req.params, dict) else {}
        params["name"] = probe
        params["arguments"] = {}
        for key in ("requestState", "inputResponses"):
            params.pop(key, None)
        meta = params.get("_meta")
        if isinstance(meta, dict):
            params["_meta"] = {k: v for k, v in meta.items() if k != "progressToken"}
        message = jsonrpc.request(self._next_id(ctx), "tools/call", params)
        try:
            answer, up = await self._request(ctx, upstream, message, timeout=self.gateway.policy.backend_timeout_seconds)
            return probe, answer, up.status
        except (UpstreamError, TimeoutError):
            return probe, None, 400 if ctx.modern else 200

    # ---- approvals ----------------------------------------------------------------------

    def _input_required(self, ctx: Ctx, outcome: Outcome, call: ToolCall) -> dict[str, Any]:
        return self._sealer.input_required(outcome, principal=ctx.principal.id, tool=call.tool, arguments=call.arguments,
                                           expires=time.time() + self.hold_seconds * 6,
                                           decision_meta={gov.DECISION_META_KEY: gov.decision_meta(outcome)})

    async def _wait_for_approval(self, ctx: Ctx, reply: Reply, req: Request, outcome: Outcome, name: str,
                                 arguments: Any, can_elicit: bool) -> bool:
        approval_id = outcome.approval_id
        assert approval_id is not None
        log.warning("approval.pending", approval_id=approval_id, tool=name, reason=outcome.message,
                    hint=f"dharma approvals approve {approval_id}")
        params = _obj(req.params)
        meta = _obj(params.get("_meta"))
        token = meta.get("progressToken")
        scope = anyio.CancelScope()
        session = ctx.session
        if session is not None:
            session.holds[("c", req.id)] = scope
        try:
            with scope:
                if session is not None and can_elicit:
                    verdict = await self._elicit(session, reply, outcome, name, arguments)
                    await holding.settle(self.gateway, approval_id, verdict, by=f"mcp-elicitation:{ctx.principal.id}")
                else:
                    await holding.hold(self.gateway, approval_id, token, lambda note: reply.event(jsonrpc.dumps(note)),
                                       seconds=self.hold_seconds, interval=self.progress_interval)
        finally:
            if session is not None:
                session.holds.pop(("c", req.id), None)
        if scope.cancelled_caught:
            with anyio.CancelScope(shield=True):
                await self.gateway.approvals.expire(approval_id)
            await reply.final(jsonrpc.error(req.id, jsonrpc.REQUEST_CANCELLED, "Request cancelled"), 200)
            return False
        return True

    async def _elicit(self, session: HttpSession, reply: Reply, outcome: Outcome, name: str, arguments: Any) -> bool | None:
        params = ap.approval_form(outcome, name, arguments, version=session.version)
        rid = session.originate()
        waiter = session.waiters[rid] = _Waiter()
        try:
            await reply.event(jsonrpc.dumps(jsonrpc.request(rid, "elicitation/create", params)))
            with anyio.move_on_after(self.hold_seconds):
                await waiter.event.wait()
                result = (waiter.value or {}).get("result")
                return ap.accepted(result)
            return None
        finally:
            session.waiters.pop(rid, None)


class _Forwarder(gov.AnswerRecorder):
    """The Backend `Gateway.govern` forwards an allowed call through: one upstream POST, whose
    intermediate messages (progress, logs, server requests) stream to the client as they come."""

    def __init__(self, app: McpHttpApp, ctx: Ctx, reply: Reply, req: Request, upstream: Upstream, upstream_name: str,
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


# ---- helpers --------------------------------------------------------------------------------


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


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, int | None]:
    """The request body, or its first bytes and total size when it is over `limit` (not kept)."""
    chunks: list[bytes] = []
    size = 0
    over = False
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            if not over:
                chunks = [b"".join(chunks)[:4096]]
            over = True
        elif not over:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks), (size if over else None)


async def _plain(send: Send, status: int, body: dict[str, Any] | None, headers: dict[str, str] | None = None) -> None:
    data = jsonrpc.dumps(body) if body is not None else b""
    hdrs = [(b"content-type", b"application/json")] if data else []
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    hdrs.append((b"content-length", str(len(data)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})


async def _write(reply: Reply, send: Send) -> None:
    """Turn the Reply's items into ASGI messages: a JSON answer, or an event stream (no ids)."""
    started = False
    async with reply.stream:
        async for item in reply.stream:
            if isinstance(item, _Head):
                await send({"type": "http.response.start", "status": item.status,
                            "headers": [(k.encode(), v.encode()) for k, v in item.headers.items()]})
                started = True
            elif isinstance(item, _Event):
                if not started:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(k.encode(), v.encode()) for k, v in SSE_HEADERS.items()]})
                    started = True
                await send({"type": "http.response.body", "body": _sse_bytes(item), "more_body": True})
            elif isinstance(item, _Final):
                if started:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                data = item.body or b""
                headers = dict(item.headers or {})
                headers["content-length"] = str(len(data))
                await send({"type": "http.response.start", "status": item.status,
                            "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
                await send({"type": "http.response.body", "body": data})
                return
    if started:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        await _plain(send, 500, jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, "Dharma Gateway produced no answer"))


def _sse_bytes(event: _Event) -> bytes:
    """One event on the wire: a priming event is only an id (and `retry:`), with empty data."""
    head = b"id: " + event.id.encode() + b"\n" if event.id is not None else b""
    if event.retry is not None:
        head += b"retry: " + str(event.retry).encode() + b"\n"
    if not event.data:
        return head + b"data: \n\n"
    return head + b"event: message\ndata: " + event.data + b"\n\n"


def resumable_version(version: str | None) -> bool:
    """Whether a legacy client at `version` can resume a stream (it parses priming events): 2025-11-25 on."""
    return at_least(version, "2025-11-25")


def build_mcp_app(gateway: Gateway, settings: Any, *, max_body_bytes: int) -> McpHttpApp | None:
    """The /mcp app for the MCP upstreams in `settings` (None when there are none)."""
    from gateway.transports.upstream_http import McpHttpUpstream

    configs = [u for u in settings.upstreams if u.is_mcp]
    if not configs:
        return None
    upstreams: list[Upstream] = []
    for cfg in configs:
        if cfg.type == "mcp_http":
            upstreams.append(McpHttpUpstream(cfg.id, cfg.url, prefix=cfg.prefix, headers=cfg.headers, forward_host=cfg.forward_host))
        else:
            from gateway.transports.upstream_stdio import McpStdioUpstream

            upstreams.append(McpStdioUpstream(cfg.id, [cfg.command, *cfg.args], env=cfg.env, prefix=cfg.prefix))
    mcp = settings.mcp
    return McpHttpApp(
        gateway,
        upstreams,
        pins=PinStore(settings.state_dir),
        max_body_bytes=max_body_bytes,
        anonymous_user=mcp.anonymous_user,
        hold_seconds=mcp.hold_seconds,
        progress_interval=mcp.progress_interval,
        session_idle_seconds=mcp.session_idle_seconds,
    )


def _obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}
