"""`tools/list` and `tools/call` on `/mcp`: the catalog merged from every upstream (prefixes,
shadowing, pins), listings filtered per principal, and this transport's `CallPort` for the one
shared `tools/call` flow (`gateway.mcp.calls`): gateway-originated requests go to the upstream the
name routes to, notifications and elicitations go on the call's own stream, and the 2026 envelope
and `Mcp-*` headers are checked before anything goes upstream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
import structlog

from gateway.core.gateway import Gateway
from gateway.mcp import calls, jsonrpc
from gateway.mcp import governance as gov
from gateway.mcp.calls import CallSite, Refusal, ToolEntry
from gateway.mcp.jsonrpc import Request
from gateway.mcp.pins import PinStore
from gateway.mcp.versions import (
    HEADER_MISMATCH,
    META_CAPABILITIES,
    META_VERSION,
    MODERN_VERSIONS,
    UNSUPPORTED_VERSION,
)
from gateway.transports.mcp_http import headers as mh
from gateway.transports.mcp_http.forward import HttpForwarder
from gateway.transports.mcp_http.local import LocalServer
from gateway.transports.mcp_http.relay import Relay
from gateway.transports.mcp_http.reply import Reply
from gateway.transports.mcp_http.state import Catalog, Ctx, Upstream, Waiter, obj
from gateway.transports.upstreams.replies import UpstreamError

log = structlog.get_logger()


class HttpTools:
    """The tool catalog, `tools/list` and `tools/call` of `/mcp` (see the module docstring)."""

    def __init__(self, gateway: Gateway, relay: Relay, pins: PinStore, flow: calls.ToolsCall) -> None:
        self.gateway = gateway
        self.relay = relay
        self.pins = pins
        self.flow = flow
        self.local = next((u for u in relay.upstreams if isinstance(u, LocalServer)), None)
        #: More than one MCP upstream (the gateway's own server aside): listings are merged, not relayed.
        self.several = sum(u is not self.local for u in relay.upstreams) > 1

    # ---- the catalog ----------------------------------------------------------------------

    def client_name(self, upstream: Upstream, name: str) -> str | None:
        """The name the client sees, or None when it would shadow another upstream's prefix or one
        of the gateway's own tools (those are never shadowed: the operator configured them)."""
        local = self.local
        if upstream is local:
            return name
        if local is not None and local.serves(upstream.prefix + name):
            log.warning("mcp_http.tool_shadowed", upstream=upstream.id, tool=name, by="the gateway's own tool")
            return None
        if not upstream.prefix:
            for other in self.relay.upstreams:
                if other.prefix and name.startswith(other.prefix):
                    log.warning("mcp_http.tool_shadowed", upstream=upstream.id, tool=name, prefix_of=other.id)
                    return None
        return upstream.prefix + name

    def route(self, name: str, *, unknown: bool = False) -> tuple[Upstream, str] | None:
        """The upstream a client tool name belongs to, and the name that upstream knows it by. With
        `unknown`, where a name nobody serves goes (by prefix alone): a hidden tool of the gateway's
        own is asked about there too, so it answers exactly like an unknown name."""
        local = self.local
        if local is not None and not unknown and local.serves(name):
            return local, name
        for upstream in self.relay.by_prefix:
            if name.startswith(upstream.prefix):
                return upstream, name[len(upstream.prefix):]
        return None

    async def visible(self, ctx: Ctx, upstream: Upstream, named: list[tuple[str, dict[str, Any]]], names: Iterable[str]) -> set[str]:
        """The client names among `named` the caller may see here: the compiled policy's decision
        (the gateway's own tools judged on their catalog definitions, as on /v1), then the group's."""
        if upstream is self.local:
            shown = {t.name for t in self.gateway.tools_for(ctx.credentials)}.intersection(c for c, _ in named)
        else:
            shown = await calls.visible_names(self.gateway, self.pins, ctx.credentials, upstream.id, named, names=names)
        return shown if ctx.group is None else ctx.group.only(shown)

    def record(self, catalog: Catalog, upstream: Upstream, tools: list[dict[str, Any]], *, first_page: bool) -> list[tuple[str, dict[str, Any]]]:
        if first_page:
            catalog.tools = {k: v for k, v in catalog.tools.items() if v[0] is not upstream}
            catalog.digests = {k: d for k, d in catalog.digests.items() if k in catalog.tools}
            catalog.stale.discard(upstream.id)
            catalog.loaded.add(upstream.id)
        named = []
        for tool in tools:
            cname = self.client_name(upstream, tool["name"])
            if cname is None:
                continue
            catalog.tools[cname] = (upstream, tool)
            catalog.digests.pop(cname, None)
            named.append((cname, tool))
        return named

    async def refresh(self, ctx: Ctx, upstream: Upstream) -> None:
        """Load every page of an upstream's tools/list into the catalog (gateway-originated)."""
        catalog = self.relay.catalog(ctx)

        async def ask_page(params: dict[str, Any] | None) -> dict[str, Any] | None:
            message = jsonrpc.request(self.relay.next_id(ctx), "tools/list", params)
            try:
                answer, _up = await self.relay.request(ctx, upstream, message, timeout=self.gateway.policy.backend_timeout_seconds)
            except (UpstreamError, TimeoutError) as exc:
                log.warning("catalog.refresh_failed", upstream=upstream.id, error=str(exc) or type(exc).__name__)
                return None
            result = answer.get("result")
            return result if isinstance(result, dict) else None

        await calls.refresh_catalog(ask_page, lambda tools, first: self.record(catalog, upstream, tools, first_page=first),
                                    self.pins, upstream.id, ctx.meta if ctx.modern else None)

    # ---- tools/list -------------------------------------------------------------------------

    async def tools_list(self, ctx: Ctx, reply: Reply, req: Request, data: bytes) -> None:
        """One MCP upstream (and perhaps the gateway's own tools): its answer relayed as it came,
        filtered, with the gateway's own visible tools after its last page. Several: every page of
        each, merged into one page."""
        catalog = self.relay.catalog(ctx)
        if not self.several:
            upstream = self.relay.primary
            first_page = not (isinstance(req.params, dict) and req.params.get("cursor"))

            async def on_answer(msg: dict[str, Any]) -> dict[str, Any]:
                result = msg.get("result")
                if not isinstance(result, dict):
                    return msg
                named = self.record(catalog, upstream, calls.listed_tools(result), first_page=first_page)
                visible = await self.visible(ctx, upstream, named, catalog.tools)
                renamed = dict(result)
                renamed["tools"] = [{**t, "name": cname} if cname != t["name"] else t for cname, t in named]
                if self.local is not None and upstream is not self.local and not result.get("nextCursor"):
                    own = await self._own_tools(ctx, catalog)
                    renamed["tools"] += own
                    visible |= {t["name"] for t in own}
                return {**msg, "result": gov.filter_list_result(renamed, visible, modern=ctx.modern)}

            await self.relay.relay(ctx, reply, upstream, data, req.message, expect_id=req.id, on_answer=on_answer)
            return
        merged: list[dict[str, Any]] = []
        for upstream in self.relay.upstreams:
            await self.refresh(ctx, upstream)
            named = [(c, t) for c, (u, t) in catalog.tools.items() if u is upstream]
            visible = await self.visible(ctx, upstream, named, catalog.tools)
            merged.extend({**t, "name": c} for c, t in named if c in visible)
        base = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"} if ctx.modern else {}
        await reply.final(jsonrpc.result(req.id, {"tools": merged, **base}))

    async def _own_tools(self, ctx: Ctx, catalog: Catalog) -> list[dict[str, Any]]:
        """The gateway's own tools this caller may see here (recorded in the session's catalog)."""
        local = self.local
        assert local is not None
        if local.id not in catalog.loaded:
            await self.refresh(ctx, local)
        named = [(c, t) for c, (u, t) in catalog.tools.items() if u is local]
        visible = await self.visible(ctx, local, named, catalog.tools)
        return [t for c, t in named if c in visible]

    # ---- tools/call -------------------------------------------------------------------------

    def site(self, ctx: Ctx) -> CallSite:
        session = ctx.session
        capabilities: Any = session.capabilities if session is not None else {}
        if ctx.modern:
            capabilities = ctx.meta.get(META_CAPABILITIES)
        return CallSite(
            credentials=ctx.credentials,
            principal=ctx.principal.id,
            protocol_version=session.version if session is not None and session.version else ctx.version,
            modern=ctx.modern,
            session_id=session.id if session is not None else None,
            capabilities=dict(capabilities) if isinstance(capabilities, dict) else {},
            can_ask_client=session is not None,
            group=ctx.group.name if ctx.group is not None else None,
        )

    async def record_refusal(self, ctx: Ctx, method: str, reason: str, code: int = jsonrpc.INVALID_REQUEST) -> None:
        """Bad input goes in the ledger like any other decision."""
        call = calls.tool_call(self.site(ctx), "", None, None, method=method or "jsonrpc")
        await calls.record_refusal(self.gateway, call, {"code": code, "message": reason})

    async def tools_call(self, ctx: Ctx, reply: Reply, req: Request) -> None:
        if ctx.modern:
            ctx.meta = obj(obj(req.params).get("_meta"))
        answer = await self.flow(_HttpCallPort(self, ctx, reply, req.id), self.site(ctx), req)
        if answer is None:
            await reply.final(jsonrpc.error(req.id, jsonrpc.REQUEST_CANCELLED, "Request cancelled"), 200)
            return
        await reply.final(answer.message, answer.status)


class _HttpCallPort:
    """`/mcp` as the `CallPort` of one `tools/call` (see `gateway.mcp.calls`)."""

    def __init__(self, tools: HttpTools, ctx: Ctx, reply: Reply, request_id: jsonrpc.RpcId) -> None:
        self.tools, self.ctx, self.reply, self.request_id = tools, ctx, reply, request_id
        self.relay = tools.relay

    def _upstream(self, name: str) -> tuple[Upstream, str]:
        """Where a name nobody serves (here) is asked about: the probe of a hidden or unknown tool."""
        route = self.tools.route(name, unknown=True)
        return route if route is not None else (self.relay.primary, name)

    def precheck(self, request: Request) -> Refusal | None:
        if not self.ctx.modern:
            return None
        meta = obj(request.params).get("_meta")
        if not isinstance(meta, dict) or META_VERSION not in meta or META_CAPABILITIES not in meta:
            return Refusal(jsonrpc.INVALID_PARAMS, f"params._meta must be an object carrying the required '{META_VERSION}' "
                                                   f"and '{META_CAPABILITIES}' envelope keys")
        if meta[META_VERSION] not in MODERN_VERSIONS:
            problem = mh.check(self.ctx.raw_headers, request.message)
            if problem is not None:
                return Refusal(HEADER_MISMATCH, problem)
            return Refusal(UNSUPPORTED_VERSION, "Unsupported protocol version",
                           data={"supported": sorted(MODERN_VERSIONS), "requested": meta[META_VERSION]})
        return None

    async def lookup(self, name: str) -> ToolEntry | None:
        group = self.ctx.group
        if group is not None and not group.has(name):
            return None  # outside the group: as unknown as a name no upstream serves
        catalog = self.relay.catalog(self.ctx)
        route = self.tools.route(name)
        if route is not None and (route[0].id in catalog.stale or route[0].id not in catalog.loaded or name not in catalog.tools):
            await self.tools.refresh(self.ctx, route[0])
        entry = catalog.tools.get(name)
        if entry is None:
            return None
        digest = catalog.digests.get(name)
        if digest is None:  # taken once per recorded definition, not on every call (pins, tool_info)
            digest = catalog.digests[name] = gov.definition_digest(entry[1])
        local = self.tools.local
        info = local.tool_info(name) if entry[0] is local and local is not None else None
        return ToolEntry(name, entry[1], entry[0].id, digest, info)

    def known_names(self) -> Iterable[str]:
        names = self.relay.catalog(self.ctx).tools
        group = self.ctx.group
        return names if group is None else group.only(names)

    def check(self, request: Request, entry: ToolEntry | None) -> Refusal | None:
        if not self.ctx.modern:
            return None
        schema = entry.definition.get("inputSchema") if entry is not None else None
        problem = mh.check(self.ctx.raw_headers, request.message, schema)
        return Refusal(HEADER_MISMATCH, problem) if problem is not None else None

    async def probe(self, request: Request, params: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        upstream, _ = self._upstream(obj(request.params).get("name", ""))
        message = jsonrpc.request(self.relay.next_id(self.ctx), "tools/call", params)
        try:
            answer, up = await self.relay.request(self.ctx, upstream, message, timeout=self.tools.gateway.policy.backend_timeout_seconds)
            return answer, up.status
        except (UpstreamError, TimeoutError):
            return None, 400 if self.ctx.modern else 200

    def forwarder(self, request: Request, entry: ToolEntry) -> HttpForwarder:
        upstream, upstream_name = self.relay.by_id[entry.backend], entry.definition["name"]
        schema = entry.definition.get("inputSchema")
        return HttpForwarder(self.relay, self.ctx, self.reply, request, upstream, upstream_name,
                             schema if isinstance(schema, dict) else None, self.tools.gateway.tracer)

    async def notify(self, message: dict[str, Any]) -> None:
        await self.reply.event(jsonrpc.dumps(message))

    async def ask_client(self, method: str, params: dict[str, Any], *, timeout: float) -> tuple[jsonrpc.RpcId, dict[str, Any] | None]:
        session = self.ctx.session
        assert session is not None  # the flow asks only where `CallSite.can_ask_client`
        rid = session.originate()
        waiter = session.waiters[rid] = Waiter()
        try:
            await self.reply.event(jsonrpc.dumps(jsonrpc.request(rid, method, params)))
            with anyio.move_on_after(timeout):
                await waiter.event.wait()
                return rid, waiter.value or {}
            return rid, None
        finally:
            session.waiters.pop(rid, None)

    @contextlib.contextmanager
    def holding(self, scope: anyio.CancelScope) -> Iterator[None]:
        session = self.ctx.session
        if session is None:
            yield
            return
        with calls.registered(session.holds, ("c", self.request_id), scope):
            yield
