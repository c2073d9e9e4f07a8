"""`dharma stdio [--config F] -- CMD ARGS…`: a governing, otherwise transparent stdio MCP proxy.

The agent launches this instead of the MCP server. The `Supervisor` keeps the server process
running; this module pumps the agent's lines (one JSON-RPC message per line, any length, read in
chunks) and the server's, and does the I/O that `McpSession` (pure) asks for:

- messages it does not govern pass through as the original bytes, in both directions; a request
  for a method MCP does not define is recorded in the ledger as it passes;
- `tools/list` answers are filtered per principal, and `tools/call` goes through the one shared
  flow (`gateway.mcp.calls.ToolsCall`), this module being its `CallPort`: the server is asked
  with gateway-originated ids, the client is notified or elicited on the same pipe;
- the server's stderr goes to the log (structlog on stderr); stdout carries only MCP;
- a server that exits is restarted (the client's `initialize` is replayed to it), calls in
  flight get an error and count against the circuit breaker.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from gateway.core.backends import BackendResult
from gateway.core.call import Credentials
from gateway.core.errors import CallError, ErrorCode
from gateway.core.gateway import Gateway
from gateway.mcp import approval as ap
from gateway.mcp import calls, jsonrpc
from gateway.mcp import governance as gov
from gateway.mcp.calls import CallSite, Refusal, ToolEntry
from gateway.mcp.framing import DEFAULT_MAX_MESSAGE_BYTES, LineSplitter, Oversize
from gateway.mcp.jsonrpc import Request
from gateway.mcp.pins import PinStore
from gateway.mcp.session import (
    CancelHeld,
    GovernCall,
    ListAnswer,
    McpSession,
    Passed,
    Reject,
    Resolve,
    ToClient,
    ToServer,
)
from gateway.mcp.versions import MODERN_VERSIONS
from gateway.transports.mcp_stdio.pipes import ClientPipes
from gateway.transports.mcp_stdio.supervisor import RESTART_GRACE, Supervisor, spawn_server
from gateway.transports.upstreams.mcp_stdio import stop_process

log = structlog.get_logger()


class _Waiter:
    """An answer awaited from the server or the client (to a gateway-originated or governed request)."""

    __slots__ = ("event", "value", "error", "side")

    def __init__(self, side: str) -> None:
        self.event = anyio.Event()
        self.value: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.side = side

    def set(self, value: dict[str, Any]) -> None:
        self.value = value
        self.event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()

    async def wait(self) -> dict[str, Any]:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


class BackendGone(Exception):
    """The server exited before answering."""


def default_backend_id(command: Sequence[str]) -> str:
    """A stable name for a stdio server: its program name plus a digest of the whole command."""
    digest = hashlib.sha256("\x00".join(command).encode()).hexdigest()[:10]
    return f"stdio:{Path(command[0]).name}:{digest}"


class StdioProxy:
    def __init__(
        self,
        gateway: Gateway,
        command: Sequence[str],
        *,
        pins: PinStore,
        backend_id: str | None = None,
        local_user: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        hold_seconds: float = 50.0,
        progress_interval: float = 5.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.gateway = gateway
        self.pins = pins
        self.backend_id = backend_id or default_backend_id(list(command))
        self.credentials = Credentials(local_user=local_user if local_user is not None else _login())
        self.max_message_bytes = max_message_bytes
        self.session = McpSession()
        self.calls = calls.ToolsCall(gateway, pins, ap.StateSealer(secrets.token_bytes(32)),
                                     hold_seconds=hold_seconds, progress_interval=progress_interval)
        self.server = Supervisor(command, self.backend_id, on_line=self._from_server, on_exit=self._fail_in_flight,
                                 on_restart=self._replay_handshake, env=env)
        self.waiters: dict[jsonrpc.RpcId, _Waiter] = {}
        self.holds: dict[object, anyio.CancelScope] = {}
        self._cancelled: set[object] = set()
        self._client: ClientPipes | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def restarts(self) -> int:
        return self.server.restarts

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(self, client: ClientPipes, first: anyio.abc.Process | None = None) -> int:
        """Proxy until the client closes stdin; `first` is the server when it was already started."""
        self._client = client
        first = first or await self.server.spawn()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.server.run, first)
            await self._client_pump()
            await self.server.stop()
            tg.cancel_scope.cancel()
        return 0

    async def _replay_handshake(self) -> None:
        """A restarted server knows nothing: give it the client's initialize again (legacy era)."""
        init = self.session.initialize_request
        if init is None:
            return
        try:
            await self.server_request("initialize", init.get("params"), timeout=10)
        except Exception as exc:
            log.error("backend.reinitialize_failed", backend=self.backend_id, error=str(exc))
        if self.session.initialized_notification is not None:
            await self.server.send(jsonrpc.dumps(self.session.initialized_notification))

    async def _fail_in_flight(self) -> None:
        for rid, waiter in list(self.waiters.items()):
            if waiter.side == "server":
                self.waiters.pop(rid, None)
                waiter.fail(BackendGone())
        for key, rid, method in self.session.server_gone():
            message = jsonrpc.error(rid, jsonrpc.BACKEND_FAILED,
                                    f"the MCP server exited before answering {method}; Dharma Gateway restarted it")
            await self._do(self.session.answer(key, message))

    # ---- pumps -------------------------------------------------------------------------

    async def _client_pump(self) -> None:
        assert self._client is not None
        splitter = LineSplitter(self.max_message_bytes)
        while True:
            chunk = await self._client.read()
            if not chunk:
                return
            for line in splitter.feed(chunk):
                if isinstance(line, Oversize):
                    reject = self.session.oversized(jsonrpc.sniff_id(line.prefix), line.size, self.max_message_bytes)
                    await self._do([reject])
                elif line.strip():
                    await self._safely(self._from_client, line, answer_to=line)

    async def _from_client(self, line: bytes) -> None:
        await self._do(self.session.from_client(line))

    async def _from_server(self, line: bytes) -> None:
        await self._safely(self._server_line, line)

    async def _server_line(self, line: bytes) -> None:
        actions = self.session.from_server(line)
        if not actions:
            log.warning("backend.not_jsonrpc", backend=self.backend_id, line=line[:200].decode("utf-8", "replace"))
        await self._do(actions)

    async def _safely(self, handle: Callable[..., Awaitable[None]], *args: Any, answer_to: bytes | None = None) -> None:
        """Handle one message; a failure is logged (and a client request answered -32603), and the
        pumps go on: no single message may end the connection."""
        try:
            await handle(*args)
        except Exception:
            rpc_id = jsonrpc.recover_id(answer_to) if answer_to is not None else None
            log.exception("mcp.message_failed", handler=getattr(handle, "__name__", "?"), request_id=rpc_id)
            if answer_to is not None and rpc_id is not None:
                await self.send_client(jsonrpc.dumps(
                    jsonrpc.error(rpc_id, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this message")))

    # ---- actions -----------------------------------------------------------------------

    async def _do(self, actions: list[Any]) -> None:
        assert self._tg is not None
        for action in actions:
            if isinstance(action, ToServer):
                # While the server restarts, client traffic waits for it (written to the dead one,
                # a request would never be answered); after the timeout it is sent regardless.
                with anyio.move_on_after(max(self.gateway.policy.backend_timeout_seconds, RESTART_GRACE)):
                    await self.server.ready.wait()
                await self.server.send(action.data)
            elif isinstance(action, ToClient):
                await self.send_client(action.data)
            elif isinstance(action, GovernCall):
                self._tg.start_soon(self._safely, self._govern_call, action)
            elif isinstance(action, ListAnswer):
                await self._list_answer(action)
            elif isinstance(action, Resolve):
                waiter = self.waiters.pop(action.id, None)
                if waiter is not None:
                    waiter.set(action.response)
            elif isinstance(action, CancelHeld):
                scope = self.holds.get(action.key)
                if scope is not None:
                    scope.cancel()
                else:  # still being decided: its answer will be dropped
                    self._cancelled.add(action.key)
            elif isinstance(action, Reject):
                self._tg.start_soon(self._safely, self._reject, action)
            elif isinstance(action, Passed):
                self._tg.start_soon(self._safely, calls.record_passthrough, self.gateway, self._site(None), self.backend_id,
                                    action.method)

    async def send_client(self, data: bytes) -> None:
        assert self._client is not None
        try:
            await self._client.write(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            log.warning("client.write_failed", error=type(exc).__name__)

    async def server_request(self, method: str, params: Any, *, timeout: float) -> dict[str, Any]:
        rid, data = self.session.originate("server", method, params)
        waiter = self.waiters[rid] = _Waiter("server")
        try:
            await self.server.send(data)
            with anyio.fail_after(self.server.grace(timeout)):
                return await waiter.wait()
        finally:
            self.waiters.pop(rid, None)
            self.session.forget(rid)

    def _site(self, action: GovernCall | None) -> CallSite:
        principal = self.gateway.principal_for(self.credentials)
        version = action.protocol_version if action is not None else self.session.protocol_version
        return CallSite(
            credentials=self.credentials,
            principal=principal.id if principal is not None else "",
            protocol_version=version,
            modern=version in MODERN_VERSIONS,
            session_id=self.session.nonce,
            capabilities=dict(action.capabilities or {}) if action is not None else {},
        )

    # ---- tools/list --------------------------------------------------------------------

    async def _list_answer(self, action: ListAnswer) -> None:
        response = action.response
        result = response.get("result")
        if not isinstance(result, dict):
            await self._do(self.session.answer(action.key, response))
            return
        tools = calls.listed_tools(result)
        self.session.record_tools(tools, first_page=False)
        self.session.tools_stale = False
        visible = await calls.visible_names(self.gateway, self.pins, self.credentials, self.backend_id, [(t["name"], t) for t in tools],
                                            names=self.session.tools)
        filtered = gov.filter_list_result(result, visible, modern=action.protocol_version in MODERN_VERSIONS)
        await self._do(self.session.answer(action.key, {**response, "result": filtered}))

    async def refresh_catalog(self, meta: dict[str, Any] | None) -> None:
        timeout = self.gateway.policy.backend_timeout_seconds

        async def ask_page(params: dict[str, Any] | None) -> dict[str, Any] | None:
            try:
                await self.server.wait_ready(timeout)
                response = await self.server_request("tools/list", params, timeout=timeout)
            except (TimeoutError, BackendGone) as exc:
                log.warning("catalog.refresh_failed", backend=self.backend_id, error=type(exc).__name__)
                return None
            return response.get("result") if isinstance(response.get("result"), dict) else None

        await calls.refresh_catalog(ask_page, lambda tools, first: self.session.record_tools(tools, first_page=first),
                                    self.pins, self.backend_id, meta)

    # ---- tools/call --------------------------------------------------------------------

    async def _govern_call(self, action: GovernCall) -> None:
        try:
            answer = await self.calls(_StdioCallPort(self, action), self._site(action), action.request)
        except Exception:
            log.exception("mcp.call_failed", request_id=action.request.id)
            message = jsonrpc.error(action.request.id, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this call")
            await self._do(self.session.answer(action.key, message))
            return
        if answer is None or action.key in self._cancelled:
            self._cancelled.discard(action.key)
            with anyio.CancelScope(shield=True):
                await self._do(self.session.drop(action.key))
            return
        await self._do(self.session.answer(action.key, answer.message))

    async def _reject(self, reject: Reject) -> None:
        log.warning("mcp.message_rejected", code=reject.code, reason=reject.reason, method=reject.method)
        site = self._site(None)
        error = jsonrpc.error(reject.id, reject.code, reject.reason)
        await calls.record_refusal(self.gateway, calls.tool_call(site, "", None, None, method=reject.method or "jsonrpc"), error["error"])
        if reject.key is not None:
            await self._do(self.session.answer(reject.key, error))


class _StdioCallPort:
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
            await self.proxy.refresh_catalog(meta if modern and isinstance(meta, dict) else None)
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

    def forwarder(self, request: Request, entry: ToolEntry) -> _Forwarder:
        return _Forwarder(self.proxy, request, self.action.key)

    async def notify(self, message: dict[str, Any]) -> None:
        await self.proxy.send_client(jsonrpc.dumps(message))

    async def ask_client(self, method: str, params: dict[str, Any], *, timeout: float) -> tuple[jsonrpc.RpcId, dict[str, Any] | None]:
        proxy = self.proxy
        rid, data = proxy.session.originate("client", method, params)
        waiter = proxy.waiters[rid] = _Waiter("client")
        try:
            await proxy.send_client(data)
            with anyio.move_on_after(timeout):
                return rid, await waiter.wait()
            return rid, None
        finally:
            proxy.waiters.pop(rid, None)
            proxy.session.forget(rid)

    @contextlib.contextmanager
    def holding(self, scope: anyio.CancelScope) -> Iterator[None]:
        with calls.registered(self.proxy.holds, self.action.key, scope):
            yield


class _Forwarder(gov.AnswerRecorder):
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
        waiter = proxy.waiters[req.id] = _Waiter("server")
        try:
            try:
                await proxy.server.wait_ready(timeout)
            except TimeoutError:
                raise CallError(ErrorCode.BACKEND_UNAVAILABLE, "the MCP server is restarting; retry shortly") from None
            await proxy.server.send(proxy.session.forward_call(self.key, message))
            with anyio.fail_after(proxy.server.grace(timeout)):
                response = await waiter.wait()
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


def _login() -> str:
    try:
        return os.getlogin()
    except OSError:
        import getpass

        return getpass.getuser()


async def serve_stdio(
    settings: Any,
    command: Sequence[str],
    *,
    backend_id: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    hold_seconds: float = 50.0,
    progress_interval: float = 5.0,
) -> int:
    """Open the gateway (no configured upstreams: the one backend is CMD) and proxy until stdin closes.

    The server is started first and boots while the gateway loads (start-up is the slower of the
    two, not their sum); it hears nothing until the gateway is ready, and is stopped unheard if
    the gateway cannot be opened.
    """
    from gateway.core.errors import ConfigError
    from gateway.runtime import open_gateway, pin_store_for
    from gateway.watch import live_reload

    try:
        first = await spawn_server(command)
    except OSError as exc:
        raise ConfigError(f"cannot start the MCP server {command[0]!r}: {exc.strerror or exc}") from None
    running = False  # once the proxy runs, its supervisor stops the server
    try:
        gateway = await open_gateway(settings.model_copy(update={"upstreams": []}))
        try:
            proxy = StdioProxy(
                gateway,
                command,
                pins=pin_store_for(gateway, settings),
                backend_id=backend_id,
                max_message_bytes=max_message_bytes,
                hold_seconds=hold_seconds,
                progress_interval=progress_interval,
            )
            client = ClientPipes()
            await client.open()
            running = True
            async with live_reload(gateway, settings):  # SIGHUP and file changes reload the policy
                return await proxy.run(client, first)
        finally:
            await gateway.aclose()
    finally:
        if not running:
            await stop_process(first)
