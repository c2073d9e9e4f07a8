"""`tools/list` and `tools/call` on `/mcp`, the governed path: the catalog merged from every
upstream (prefixes, shadowing, pins), listings filtered per principal, calls through
`Gateway.govern` (bad input recorded in the ledger, a hidden tool answered like an unknown one) and
approvals (elicitation, a 2026 `input_required` result, or a hold with progress notifications).

`ToolGovernance` is a part of `McpHttpApp`; the Backend an allowed call goes through is in
`mcp_http_forward`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import anyio
import structlog

from gateway.core.call import BlockClass, Decision, Outcome, Principal, Status, ToolCall, ToolInfo
from gateway.core.errors import ErrorCode
from gateway.core.gateway import new_request_id
from gateway.mcp import approval as ap
from gateway.mcp import governance as gov
from gateway.mcp import holding
from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Request
from gateway.mcp.pins import observe_or_distrust
from gateway.mcp.versions import HEADER_MISMATCH, META_CAPABILITIES, META_VERSION, MODERN_VERSIONS, UNSUPPORTED_VERSION
from gateway.stages.tier_gate import is_granted, visible_tools
from gateway.transports.mcp_http import headers as mh
from gateway.transports.mcp_http.forward import _Forwarder, _render
from gateway.transports.mcp_http.relay import McpHttpRelay
from gateway.transports.mcp_http.reply import Reply
from gateway.transports.mcp_http.state import Catalog, Ctx, HttpSession, Upstream, _obj, _Waiter
from gateway.transports.upstreams.mcp_http import UpstreamError

log = structlog.get_logger()


class ToolGovernance(McpHttpRelay):
    """The tool catalog, tools/list, tools/call and approvals (see the module docstring)."""

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
