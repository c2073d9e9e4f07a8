"""The governed half of `dharma stdio`: tools/call, tools/list filtering and ledger records.

`StdioProxy` (proxy.py) relays bytes and starts answering the agent (its `initialize`) while
the gateway loads; this module is what it does with a message once the gateway is loaded, and
the only part of the proxy that imports the gateway's pipeline (pydantic, CEL, the ledger
format), so that import happens off the path to the first answer.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from gateway.core.backends import BackendResult
from gateway.core.call import Credentials
from gateway.core.errors import CallError, ErrorCode
from gateway.core.gateway import Gateway
from gateway.mcp import approval as ap
from gateway.mcp import calls, jsonrpc
from gateway.mcp import governance as gov
from gateway.mcp.calls import CallSite, Refusal, ToolEntry
from gateway.mcp.jsonrpc import Request
from gateway.mcp.pins import PinStore
from gateway.mcp.session import GovernCall, ListAnswer, Reject
from gateway.mcp.versions import MODERN_VERSIONS
from gateway.transports.mcp_stdio.proxy import BackendGone, Waiter

if TYPE_CHECKING:
    from gateway.transports.mcp_stdio.proxy import StdioProxy

log = structlog.get_logger()


class Governance:
    """What a loaded gateway gives one stdio session: the shared tools/call flow, its pins and
    the local user's credentials."""

    def __init__(self, gateway: Gateway, pins: PinStore, *, local_user: str, hold_seconds: float,
                 progress_interval: float) -> None:
        self.gateway = gateway
        self.pins = pins
        self.credentials = Credentials(local_user=local_user)
        self.calls = calls.ToolsCall(gateway, pins, ap.StateSealer(secrets.token_bytes(32)),
                                     hold_seconds=hold_seconds, progress_interval=progress_interval,
                                     over_http=False)


def site(proxy: StdioProxy, action: GovernCall | None) -> CallSite:
    gateway, credentials = proxy.gateway, proxy.credentials
    principal = gateway.principal_for(credentials)
    version = action.protocol_version if action is not None else proxy.session.protocol_version
    return CallSite(
        credentials=credentials,
        principal=principal.id if principal is not None else "",
        protocol_version=version,
        modern=version in MODERN_VERSIONS,
        session_id=proxy.session.nonce,
        capabilities=dict(action.capabilities or {}) if action is not None else {},
    )


# ---- tools/list ------------------------------------------------------------------------

async def list_answer(proxy: StdioProxy, action: ListAnswer) -> None:
    response = action.response
    result = response.get("result")
    if not isinstance(result, dict):
        await proxy.do(proxy.session.answer(action.key, response))
        return
    tools = calls.listed_tools(result)
    proxy.session.record_tools(tools, first_page=False)
    proxy.session.tools_stale = False
    visible = await calls.visible_names(proxy.gateway, proxy.pins, proxy.credentials, proxy.backend_id,
                                        [(t["name"], t) for t in tools], names=proxy.session.tools)
    filtered = gov.filter_list_result(result, visible, modern=action.protocol_version in MODERN_VERSIONS)
    await proxy.do(proxy.session.answer(action.key, {**response, "result": filtered}))


async def refresh_catalog(proxy: StdioProxy, meta: dict[str, Any] | None) -> None:
    timeout = proxy.gateway.policy.backend_timeout_seconds

    async def ask_page(params: dict[str, Any] | None) -> dict[str, Any] | None:
        try:
            await proxy.server.wait_ready(timeout)
            response = await proxy.server_request("tools/list", params, timeout=timeout)
        except (TimeoutError, BackendGone) as exc:
            log.warning("catalog.refresh_failed", backend=proxy.backend_id, error=type(exc).__name__)
            return None
        return response.get("result") if isinstance(response.get("result"), dict) else None

    await calls.refresh_catalog(ask_page, lambda tools, first: proxy.session.record_tools(tools, first_page=first),
                                proxy.pins, proxy.backend_id, meta)


# ---- tools/call, refusals, pass-through records ----------------------------------------

async def govern_call(proxy: StdioProxy, action: GovernCall) -> None:
    try:
        answer = await proxy.governance.calls(StdioCallPort(proxy, action), site(proxy, action), action.request)
    except Exception:
        log.exception("mcp.call_failed", request_id=action.request.id)
        message = jsonrpc.error(action.request.id, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this call")
        await proxy.do(proxy.session.answer(action.key, message))
        return
    if answer is None or action.key in proxy.cancelled:
        proxy.cancelled.discard(action.key)
        with anyio.CancelScope(shield=True):
            await proxy.do(proxy.session.drop(action.key))
        return
    await proxy.do(proxy.session.answer(action.key, answer.message))


async def reject(proxy: StdioProxy, refused: Reject) -> None:
    log.warning("mcp.message_rejected", code=refused.code, reason=refused.reason, method=refused.method)
    error = jsonrpc.error(refused.id, refused.code, refused.reason)
    call = calls.tool_call(site(proxy, None), "", None, None, method=refused.method or "jsonrpc")
    await calls.record_refusal(proxy.gateway, call, error["error"])
    if refused.key is not None:
        await proxy.do(proxy.session.answer(refused.key, error))


async def record_passed(proxy: StdioProxy, method: str) -> None:
    await calls.record_passthrough(proxy.gateway, site(proxy, None), proxy.backend_id, method)


class StdioCallPort:
    """The stdio proxy as the `CallPort` of one `tools/call` (see `gateway.mcp.calls`)."""

    def __init__(self, proxy: StdioProxy, action: GovernCall) -> None:
        self.proxy = proxy
        self.action = action

    def precheck(self, request: Request) -> Refusal | None:
        return None

    async def lookup(self, name: str) -> ToolEntry | None:
        session = self.proxy.session
        if session.tools_stale or name not in session.tools:
            params = self.action.request.params if isinstance(self.action.request.params, dict) else {}
            meta = params.get("_meta")
            modern = self.action.protocol_version in MODERN_VERSIONS
            await refresh_catalog(self.proxy, meta if modern and isinstance(meta, dict) else None)
        definition = session.tools.get(name)
        if definition is None:
            return None
        return ToolEntry(name, definition, self.proxy.backend_id, session.tool_digest(name, gov.definition_digest))

    def known_names(self) -> Iterable[str]:
        return self.proxy.session.tools

    def check(self, request: Request, entry: ToolEntry | None) -> Refusal | None:
        return None

    async def probe(self, request: Request, params: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        timeout = self.proxy.gateway.policy.backend_timeout_seconds
        try:
            await self.proxy.server.wait_ready(timeout)
            return await self.proxy.server_request("tools/call", params, timeout=timeout), 200
        except (TimeoutError, BackendGone):
            return None, 200

    def forwarder(self, request: Request, entry: ToolEntry) -> Forwarder:
        return Forwarder(self.proxy, request, self.action.key)

    async def notify(self, message: dict[str, Any]) -> None:
        await self.proxy.send_client(jsonrpc.dumps(message))

    async def ask_client(self, method: str, params: dict[str, Any], *, timeout: float) -> tuple[jsonrpc.RpcId, dict[str, Any] | None]:
        proxy = self.proxy
        rid, data = proxy.session.originate("client", method, params)
        waiter = proxy.waiters[rid] = Waiter("client")
        try:
            await proxy.send_client(data)
            try:
                return rid, await waiter.wait(timeout)
            except TimeoutError:
                return rid, None
        finally:
            proxy.waiters.pop(rid, None)
            proxy.session.forget(rid)

    @contextlib.contextmanager
    def holding(self, scope: anyio.CancelScope) -> Iterator[None]:
        with calls.registered(self.proxy.holds, self.action.key, scope):
            yield


class Forwarder(gov.AnswerRecorder):
    """The Backend an allowed call is forwarded through: this session's server, the client's own id."""

    def __init__(self, proxy: StdioProxy, request: Request, key: object) -> None:
        self.proxy = proxy
        self.id = proxy.backend_id
        self.request = request
        self.key = key
        self.status = 200
        super().__init__()

    async def send(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> BackendResult:
        proxy, req = self.proxy, self.request
        params = req.params if isinstance(req.params, dict) else {}
        message = req.message
        if (params.get("arguments") or {}) != arguments:
            message = {**message, "params": {**params, "arguments": arguments}}
        message = gov.with_trace_context(message, proxy.gateway.tracer)
        waiter = proxy.waiters[req.id] = Waiter("server")
        try:
            try:
                await proxy.server.wait_ready(timeout)
            except TimeoutError:
                raise CallError(ErrorCode.BACKEND_UNAVAILABLE, "the MCP server is restarting; retry shortly") from None
            await proxy.server.send(proxy.session.forward_call(self.key, message))
            response = await waiter.wait(proxy.server.grace(timeout))
        except TimeoutError:
            note = jsonrpc.notification("notifications/cancelled", {
                "requestId": req.id, "reason": f"Dharma Gateway: no answer within {timeout:g}s"})
            await proxy.server.send(jsonrpc.dumps(note))
            raise CallError(ErrorCode.TIMEOUT, f"the MCP server did not answer within {timeout:g}s") from None
        except BackendGone:
            raise CallError(ErrorCode.BACKEND_UNAVAILABLE,
                            "the MCP server exited while handling this call; Dharma Gateway restarted it") from None
        finally:
            if proxy.waiters.get(req.id) is waiter:
                del proxy.waiters[req.id]
        return self.record(response)
