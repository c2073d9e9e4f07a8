"""`dharma stdio [--config F] -- CMD ARGS…`: a governing, otherwise transparent stdio MCP proxy.

The agent launches this instead of the MCP server. It spawns the server and runs two pumps in
one task group: client → server and server → client, one JSON-RPC message per line, lines of
any length (read in chunks, never with a bounded `readline`). `McpSession` (pure) says what to
do with each message; this module only does the I/O:

- messages it does not govern pass through as the original bytes, in both directions;
- `tools/list` answers are filtered per principal; `tools/call` requests are governed by
  `Gateway.govern` and forwarded (with the client's own id) only when allowed;
- held calls ask the client through `elicitation/create` (gateway-originated id, reply
  swallowed) when it declared elicitation, else wait for `dharma approvals approve|deny` or the
  timeout, sending progress on the client's token; a client cancel drops the hold;
- the server's stderr goes to the log (structlog on stderr); stdout carries only MCP;
- a server that exits is restarted (the client's `initialize` is replayed to it), calls in
  flight get an error and count against the circuit breaker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from gateway.core.backends import BackendResult
from gateway.core.call import BlockClass, Credentials, Decision, Outcome, Status, ToolCall, ToolInfo
from gateway.core.errors import CallError, ErrorCode
from gateway.core.gateway import Gateway, new_request_id, rfc3339
from gateway.mcp import approval as ap
from gateway.mcp import governance as gov
from gateway.mcp import holding
from gateway.mcp import jsonrpc
from gateway.mcp.framing import CHUNK, DEFAULT_MAX_MESSAGE_BYTES, SERVER_MAX_MESSAGE_BYTES, LineSplitter, Oversize
from gateway.mcp.pins import PinStore, observe_or_distrust
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
from gateway.stages.tier_gate import is_granted, visible_tools
from gateway.transports.upstreams.mcp_stdio import stop_process

#: Seconds a call waits for a crashed server to be restarted and re-initialized.
RESTART_GRACE = 15.0
log = structlog.get_logger()

class _Waiter:
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
    pass


# ---- the agent's side: stdin/stdout --------------------------------------------------------


class ClientPipes:
    """Our stdin/stdout as async byte streams (asyncio pipes; threads when they are not pipes)."""

    def __init__(self, stdin: Any = None, stdout: Any = None) -> None:
        self._in: Any = stdin or sys.stdin.buffer
        self._out = stdout or sys.stdout.buffer
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = anyio.Lock()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            reader = asyncio.StreamReader(limit=CHUNK * 4)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._in)
            self._reader = reader
        except (ValueError, OSError):
            self._reader = None
        try:
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, self._out)
            self._writer = asyncio.StreamWriter(transport, protocol, None, loop)
        except (ValueError, OSError):
            self._writer = None

    async def read(self) -> bytes:
        if self._reader is not None:
            return await self._reader.read(CHUNK)
        return await anyio.to_thread.run_sync(self._in.read1, CHUNK)

    async def write(self, data: bytes) -> None:
        if self._writer is not None:
            self._writer.write(data + b"\n")
            await self._writer.drain()
            return
        async with self._lock:
            await anyio.to_thread.run_sync(self._blocking_write, data + b"\n")

    def _blocking_write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()


# ---- the proxy -------------------------------------------------------------------------------


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
        self.command = list(command)
        self.pins = pins
        self.backend_id = backend_id or default_backend_id(self.command)
        self.credentials = Credentials(local_user=local_user if local_user is not None else _login())
        self.max_message_bytes = max_message_bytes
        self.hold_seconds = hold_seconds
        self._sealer = ap.StateSealer(secrets.token_bytes(32))
        self.progress_interval = progress_interval
        self.env = env
        self.session = McpSession()
        self._waiters: dict[jsonrpc.RpcId, _Waiter] = {}
        self._holds: dict[object, anyio.CancelScope] = {}
        self._ready = anyio.Event()
        self._closing = False
        self._proc: anyio.abc.Process | None = None
        self._client: ClientPipes | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.restarts = 0
        self._cancelled: set[object] = set()

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(self, client: ClientPipes) -> int:
        self._client = client
        first = self._proc = await self._spawn()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._backend_loop, first)
            await self._client_pump()
            self._closing = True
            await self._stop_backend()
            tg.cancel_scope.cancel()
        return 0

    async def _spawn(self) -> anyio.abc.Process:
        env = {**os.environ, **(self.env or {})}
        return await anyio.open_process(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )

    async def _backend_loop(self, proc: anyio.abc.Process) -> None:
        attempt = 0
        while True:
            self._proc = proc
            async with anyio.create_task_group() as inner:
                assert proc.stderr is not None and proc.stdout is not None
                inner.start_soon(self._stderr_pump, proc.stderr)
                if attempt:
                    inner.start_soon(self._replay_handshake)
                else:
                    self._ready.set()
                await self._server_pump(proc.stdout)
                inner.cancel_scope.cancel()
            with anyio.move_on_after(2):
                await proc.wait()
            if self._closing:
                return
            log.error("backend.exited", backend=self.backend_id, returncode=proc.returncode)
            self._ready = anyio.Event()
            await self._fail_in_flight()
            attempt += 1
            self.restarts += 1
            await anyio.sleep(min(0.1 * 2 ** min(attempt, 6), 5.0))
            if self._closing:
                return
            try:
                proc = await self._spawn()
            except OSError as exc:
                log.error("backend.restart_failed", backend=self.backend_id, error=str(exc))
                continue

    async def _replay_handshake(self) -> None:
        """A restarted server knows nothing: give it the client's initialize again (legacy era)."""
        init = self.session.initialize_request
        if init is not None:
            try:
                await self._server_request("initialize", init.get("params"), timeout=10)
            except Exception as exc:
                log.error("backend.reinitialize_failed", backend=self.backend_id, error=str(exc))
            if self.session.initialized_notification is not None:
                await self._send_server(jsonrpc.dumps(self.session.initialized_notification))
        log.warning("backend.restarted", backend=self.backend_id, restarts=self.restarts)
        self._ready.set()

    async def _fail_in_flight(self) -> None:
        for rid, waiter in list(self._waiters.items()):
            if waiter.side == "server":
                self._waiters.pop(rid, None)
                waiter.fail(BackendGone())
        for key, rid, method in self.session.server_gone():
            message = jsonrpc.error(rid, jsonrpc.BACKEND_FAILED,
                                    f"the MCP server exited before answering {method}; Dharma Gateway restarted it")
            await self._do(self.session.answer(key, message))

    async def _stop_backend(self) -> None:
        if self._proc is not None:
            await stop_process(self._proc)

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
                    continue
                if not line.strip():
                    continue
                await self._do(self.session.from_client(line))

    async def _server_pump(self, stdout: anyio.abc.ByteReceiveStream) -> None:
        splitter = LineSplitter(SERVER_MAX_MESSAGE_BYTES)
        while True:
            try:
                chunk = await stdout.receive(CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            for line in splitter.feed(chunk):
                if isinstance(line, Oversize):
                    log.error("backend.message_too_large", backend=self.backend_id, size=line.size)
                    continue
                if not line.strip():
                    continue
                actions = self.session.from_server(line)
                if not actions:
                    log.warning("backend.not_jsonrpc", backend=self.backend_id, line=line[:200].decode("utf-8", "replace"))
                await self._do(actions)

    async def _stderr_pump(self, stderr: anyio.abc.ByteReceiveStream) -> None:
        splitter = LineSplitter(64 * 1024)
        while True:
            try:
                chunk = await stderr.receive(CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            for line in splitter.feed(chunk):
                text = f"<{line.size} bytes>" if isinstance(line, Oversize) else line.decode("utf-8", "replace").rstrip()
                if text:
                    log.info("backend.stderr", backend=self.backend_id, line=text)

    # ---- actions -----------------------------------------------------------------------

    async def _do(self, actions: list[Any]) -> None:
        assert self._tg is not None
        for action in actions:
            if isinstance(action, ToServer):
                # While the server restarts, client traffic waits for it (written to the dead one,
                # a request would never be answered); after the timeout it is sent regardless.
                with anyio.move_on_after(max(self.gateway.policy.backend_timeout_seconds, RESTART_GRACE)):
                    await self._ready.wait()
                await self._send_server(action.data)
            elif isinstance(action, ToClient):
                await self._send_client(action.data)
            elif isinstance(action, GovernCall):
                self._tg.start_soon(self._govern_call, action)
            elif isinstance(action, ListAnswer):
                await self._list_answer(action)
            elif isinstance(action, Resolve):
                waiter = self._waiters.pop(action.id, None)
                if waiter is not None:
                    waiter.set(action.response)
            elif isinstance(action, CancelHeld):
                scope = self._holds.get(action.key)
                if scope is not None:
                    scope.cancel()
                else:  # still being decided: its answer will be dropped
                    self._cancelled.add(action.key)
            elif isinstance(action, Reject):
                self._tg.start_soon(self._reject, action)
            elif isinstance(action, Passed):
                self._tg.start_soon(self._record_passed, action)

    async def _send_server(self, data: bytes) -> None:
        proc = self._proc
        try:
            assert proc is not None and proc.stdin is not None
            await proc.stdin.send(data + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, AssertionError) as exc:
            log.warning("backend.write_failed", backend=self.backend_id, error=type(exc).__name__)

    async def _send_client(self, data: bytes) -> None:
        assert self._client is not None
        try:
            await self._client.write(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            log.warning("client.write_failed", error=type(exc).__name__)

    async def _server_request(self, method: str, params: Any, *, timeout: float) -> dict[str, Any]:
        rid, data = self.session.originate("server", method, params)
        waiter = self._waiters[rid] = _Waiter("server")
        try:
            await self._send_server(data)
            with anyio.fail_after(timeout):
                return await waiter.wait()
        finally:
            self._waiters.pop(rid, None)
            self.session.forget(rid)

    async def _wait_ready(self, timeout: float) -> None:
        """Wait for a (re)started server; a restart gets at least RESTART_GRACE, whatever the call timeout."""
        if not self._ready.is_set():
            with anyio.fail_after(max(timeout, RESTART_GRACE)):
                await self._ready.wait()

    # ---- tools/list --------------------------------------------------------------------

    async def _list_answer(self, action: ListAnswer) -> None:
        response = action.response
        result = response.get("result")
        modern = action.protocol_version in MODERN_VERSIONS
        if not isinstance(result, dict):
            await self._do(self.session.answer(action.key, response))
            return
        tools = [t for t in result.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
        self.session.record_tools(tools, first_page=False)
        self.session.tools_stale = False
        changed = observe_or_distrust(self.pins, self.backend_id, tools)
        policy = self.gateway.policy
        principal = self.gateway.principal_for(self.credentials)
        infos = [gov.tool_info(t, self.backend_id, changed=changed.get(t["name"], False)) for t in tools]
        visible = {t.name for t in visible_tools(policy, principal, infos)} if principal is not None else set()
        filtered = gov.filter_list_result(result, visible, modern=modern)
        await self._do(self.session.answer(action.key, {**response, "result": filtered}))

    async def _refresh_catalog(self, meta: dict[str, Any] | None, modern: bool) -> None:
        params: dict[str, Any] = {}
        if modern and isinstance(meta, dict):
            params["_meta"] = {k: v for k, v in meta.items() if k.startswith("io.modelcontextprotocol/")}
        cursor: str | None = None
        first = True
        timeout = self.gateway.policy.backend_timeout_seconds
        for _ in range(100):
            page_params = dict(params)
            if cursor:
                page_params["cursor"] = cursor
            try:
                await self._wait_ready(timeout)
                response = await self._server_request("tools/list", page_params or None, timeout=timeout)
            except (TimeoutError, BackendGone) as exc:
                log.warning("catalog.refresh_failed", backend=self.backend_id, error=type(exc).__name__)
                return
            result = response.get("result")
            if not isinstance(result, dict):
                return
            tools = [t for t in result.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
            self.session.record_tools(tools, first_page=first)
            observe_or_distrust(self.pins, self.backend_id, tools)
            first = False
            cursor = result.get("nextCursor") if isinstance(result.get("nextCursor"), str) else None
            if not cursor:
                return

    # ---- tools/call --------------------------------------------------------------------

    def _principal_id(self) -> str:
        principal = self.gateway.principal_for(self.credentials)
        return principal.id if principal is not None else ""

    def _call(self, name: str, arguments: Any, version: str | None, meta: Any, method: str = "tools/call") -> ToolCall:
        return gov.tool_call(name, arguments, meta, request_id=new_request_id(), credentials=self.credentials, method=method,
                             protocol_version=version, session_id=self.session.nonce)

    async def _govern_call(self, action: GovernCall) -> None:
        try:
            await self._govern_call_inner(action)
        except Exception:
            log.exception("mcp.call_failed")
            message = jsonrpc.error(action.request.id, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this call")
            await self._do(self.session.answer(action.key, message))

    async def _govern_call_inner(self, action: GovernCall) -> None:
        req, key = action.request, action.key
        version = action.protocol_version
        modern = version in MODERN_VERSIONS
        params = req.params if isinstance(req.params, dict) else None
        meta = params.get("_meta") if params is not None else None
        name = params.get("name") if params is not None else None
        if not isinstance(name, str) or not name:
            await self._refuse(key, req.id, self._call("", None, version, meta), jsonrpc.INVALID_PARAMS,
                               "Invalid params: tools/call needs `name`, a non-empty string")
            return
        arguments = params.get("arguments") if params is not None else None
        if arguments is not None and not isinstance(arguments, dict):
            await self._refuse(key, req.id, self._call(name, None, version, meta), jsonrpc.INVALID_PARAMS,
                               f"Invalid params: `arguments` must be an object, not {jsonrpc.kind(arguments)}")
            return
        assert params is not None
        approval_id: str | None = None
        if modern and isinstance(params.get("requestState"), str) and params["requestState"].startswith(ap.STATE_PREFIX):
            opened = await holding.apply_state(self.gateway, self._sealer, params, principal=self._principal_id(), tool=name,
                                               arguments=arguments, now=time.time())
            if isinstance(opened, tuple):
                await self._refuse(key, req.id, self._call(name, arguments, version, meta), jsonrpc.INVALID_PARAMS, opened[0])
                return
            approval_id = opened
            params = ap.strip_state(params)
            req = jsonrpc.Request(req.id, req.method, params, {**req.message, "params": params})
        if self.session.tools_stale or name not in self.session.tools:
            await self._refresh_catalog(meta if isinstance(meta, dict) else None, modern)
        definition = self.session.tools.get(name)
        info: ToolInfo | None = None
        if definition is not None:
            changed = observe_or_distrust(self.pins, self.backend_id, [definition]).get(name, True)
            info = gov.tool_info(definition, self.backend_id, changed=changed)
        policy = self.gateway.policy
        principal = self.gateway.principal_for(self.credentials)
        visible = (
            info is not None
            and principal is not None
            and is_granted(policy, principal, name, policy.annotations_for(name, info.annotations))
        )
        probe: str | None = None
        template: dict[str, Any] | None = None
        if not visible and principal is not None:
            alike = gov.lookalike_of(name, self.session.tools)
            if alike is not None:
                log.warning("mcp.lookalike_tool_name", name=name, imitates=alike)
            probe = gov.probe_name()
            template = await self._probe_unknown(req, probe)
        call = self._call(name, arguments, version, meta)
        if approval_id is not None:
            call = dataclasses.replace(call, approval_id=approval_id)
        mrtr = modern and ap.can_elicit(action.capabilities)
        task = visible and gov.runs_as_task(params, modern=modern)
        refusal = gov.task_refusal(name) if task and gov.task_conflicts(policy, name) else None
        governed = await self._govern_once(call, req, key, info, modern, template, probe, refusal, mrtr=mrtr)
        outcome = governed[0]
        if outcome.status is Status.PENDING_APPROVAL and outcome.approval_id and task:
            await self.gateway.approvals.expire(outcome.approval_id)  # a task cannot wait for a human
            call = dataclasses.replace(call, request_id=new_request_id())
            governed = await self._govern_once(call, req, key, info, modern, template, probe, gov.task_refusal(name))
        elif outcome.status is Status.PENDING_APPROVAL and outcome.approval_id and not mrtr:
            waited = await self._wait_for_approval(action, outcome, name, arguments, modern)
            if not waited:
                return
            call = dataclasses.replace(call, approval_id=outcome.approval_id, request_id=new_request_id())
            governed = await self._govern_once(call, req, key, info, modern, template, probe)
        if key in self._cancelled:
            self._cancelled.discard(key)
            await self._do(self.session.drop(key))
            return
        await self._do(self.session.answer(key, governed[1]))

    async def _govern_once(
        self,
        call: ToolCall,
        req: jsonrpc.Request,
        key: object,
        info: ToolInfo | None,
        modern: bool,
        template: dict[str, Any] | None,
        probe: str | None,
        refusal: Decision | None = None,
        *,
        mrtr: bool = False,
    ) -> tuple[Outcome, dict[str, Any]]:
        """Govern the call once; with `mrtr` (a 2026 client that can elicit) a hold becomes an
        `input_required` result carrying the gateway's sealed `requestState`, and nothing waits."""
        forwarder = _Forwarder(self, req, key)
        rendered: dict[str, Any] = {}

        def render(outcome: Outcome) -> dict[str, Any]:
            if mrtr and outcome.status is Status.PENDING_APPROVAL and outcome.approval_id:
                body = self._sealer.input_required(
                    outcome, principal=self._principal_id(), tool=call.tool, arguments=call.arguments,
                    expires=time.time() + self.hold_seconds * 6, decision_meta={gov.DECISION_META_KEY: gov.decision_meta(outcome)})
                rendered["kind"], rendered["body"] = "result", body
                return body
            kind, body = gov.render_outcome(
                outcome, raw_result=forwarder.raw_result, raw_error=forwarder.raw_error, tool=info, modern=modern,
                unknown_template=template, probe=probe or "",
                no_information=[r.no_information_response for r in self.gateway.policy.disclosure_rules_for(call.tool)])
            rendered["kind"], rendered["body"] = kind, body
            return body

        params = req.params if isinstance(req.params, dict) else {}
        governed = await self.gateway.govern(
            call,
            render=render,
            request={"method": "tools/call", "params": params},
            refusal=refusal,
            tool=info,
            backend=forwarder if info is not None else None,
        )
        if rendered["kind"] == "error":
            message = {"jsonrpc": "2.0", "id": req.id, "error": rendered["body"]["error"]}
        else:
            message = jsonrpc.result(req.id, gov.with_receipt(rendered["body"], governed.outcome.receipt))
        return governed.outcome, message

    async def _probe_unknown(self, req: jsonrpc.Request, probe: str) -> dict[str, Any] | None:
        params = dict(req.params) if isinstance(req.params, dict) else {}
        params["name"] = probe
        params["arguments"] = {}
        meta = params.get("_meta")
        if isinstance(meta, dict):
            params["_meta"] = {k: v for k, v in meta.items() if k != "progressToken"}
        timeout = self.gateway.policy.backend_timeout_seconds
        try:
            await self._wait_ready(timeout)
            return await self._server_request("tools/call", params, timeout=timeout)
        except (TimeoutError, BackendGone):
            return None

    async def _refuse(self, key: object | None, rpc_id: jsonrpc.RpcId | None, call: ToolCall, code: int, reason: str) -> None:
        message = jsonrpc.error(rpc_id, code, reason)
        refusal = Decision.block(ErrorCode.INVALID_PARAMS, reason, BlockClass.SAFETY_CONTENT, stage="mcp")
        try:
            await self.gateway.govern(call, render=lambda _o: {"error": message["error"]}, refusal=refusal,
                                      request={"jsonrpc_error": message["error"]})
        except Exception:
            log.exception("mcp.refusal_not_recorded")
        if key is not None:
            await self._do(self.session.answer(key, message))

    async def _reject(self, reject: Reject) -> None:
        log.warning("mcp.message_rejected", code=reject.code, reason=reject.reason, method=reject.method)
        call = self._call("", None, self.session.protocol_version, None, method=reject.method or "jsonrpc")
        await self._refuse(reject.key, reject.id, call, reject.code, reject.reason)

    async def _record_passed(self, passed: Passed) -> None:
        """A method MCP does not define went to the server as is: record that it did."""
        principal = self.gateway.principal_for(self.credentials)
        entry = {
            "time": rfc3339(time.time()),
            "request_id": new_request_id(),
            "principal": principal.id if principal else None,
            "backend": self.backend_id,
            "tool": None,
            "method": passed.method,
            "session_id": self.session.nonce,
            "decision": "allow",
            "enforced": True,
            "status": "forwarded",
            "stage": "mcp_passthrough",
            "policy_version": self.gateway.policy.version,
        }
        try:
            await self.gateway.ledger.append(entry)
        except Exception as exc:
            log.error("ledger.append_failed", method=passed.method, error=str(exc))

    # ---- approvals ---------------------------------------------------------------------

    async def _wait_for_approval(
        self, action: GovernCall, outcome: Outcome, name: str, arguments: Any, modern: bool
    ) -> bool:
        """Wait for a human (elicitation or CLI/HTTP). False when the client cancelled the hold."""
        approval_id = outcome.approval_id
        assert approval_id is not None
        log.warning("approval.pending", approval_id=approval_id, tool=name, reason=outcome.message,
                    hint=f"dharma approvals approve {approval_id}")
        params = action.request.params if isinstance(action.request.params, dict) else {}
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        scope = anyio.CancelScope()
        self._holds[action.key] = scope
        try:
            with scope:
                if not modern and self.session.client_can_elicit(action.capabilities):
                    verdict = await self._elicit(outcome, name, arguments)
                    await holding.settle(self.gateway, approval_id, verdict, by="mcp-elicitation")
                else:
                    await holding.hold(self.gateway, approval_id, token, lambda note: self._send_client(jsonrpc.dumps(note)),
                                       seconds=self.hold_seconds, interval=self.progress_interval)
        finally:
            self._holds.pop(action.key, None)
        if scope.cancelled_caught:
            log.info("approval.hold_dropped", approval_id=approval_id, reason="client cancelled")
            with anyio.CancelScope(shield=True):
                await self.gateway.approvals.expire(approval_id)
                await self._do(self.session.drop(action.key))
            return False
        return True

    async def _elicit(self, outcome: Outcome, name: str, arguments: Any) -> bool | None:
        params = ap.approval_form(outcome, name, arguments, version=self.session.protocol_version)
        rid, data = self.session.originate("client", "elicitation/create", params)
        waiter = self._waiters[rid] = _Waiter("client")
        try:
            await self._send_client(data)
            with anyio.move_on_after(self.hold_seconds):
                response = await waiter.wait()
                return ap.accepted(response.get("result"))
            cancel = jsonrpc.notification("notifications/cancelled", {"requestId": rid, "reason": "approval timed out"})
            await self._send_client(jsonrpc.dumps(cancel))
            return None
        finally:
            self._waiters.pop(rid, None)
            self.session.forget(rid)


class _Forwarder(gov.AnswerRecorder):
    """The Backend `Gateway.govern` forwards an allowed call through: this session's server."""

    def __init__(self, proxy: StdioProxy, request: jsonrpc.Request, key: object) -> None:
        self.proxy = proxy
        self.id = proxy.backend_id
        self.request = request
        self.key = key
        super().__init__()

    async def send(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> BackendResult:
        proxy, req = self.proxy, self.request
        params = req.params if isinstance(req.params, dict) else {}
        message = req.message
        if (params.get("arguments") or {}) != arguments:
            message = {**message, "params": {**params, "arguments": arguments}}
        waiter = proxy._waiters[req.id] = _Waiter("server")
        try:
            try:
                await proxy._wait_ready(timeout)
            except TimeoutError:
                raise CallError(ErrorCode.BACKEND_UNAVAILABLE, "the MCP server is restarting; retry shortly") from None
            await proxy._send_server(proxy.session.forward_call(self.key, message))
            with anyio.fail_after(timeout):
                response = await waiter.wait()
        except TimeoutError:
            note = jsonrpc.notification("notifications/cancelled", {
                "requestId": req.id, "reason": f"Dharma Gateway: no answer within {timeout:g}s"})
            await proxy._send_server(jsonrpc.dumps(note))
            raise CallError(ErrorCode.TIMEOUT, f"the MCP server did not answer within {timeout:g}s") from None
        except BackendGone:
            raise CallError(ErrorCode.BACKEND_UNAVAILABLE,
                            "the MCP server exited while handling this call; Dharma Gateway restarted it") from None
        finally:
            if proxy._waiters.get(req.id) is waiter:
                del proxy._waiters[req.id]
        return self.record(response)


def _login() -> str:
    try:
        return os.getlogin()
    except OSError:
        import getpass

        return getpass.getuser()


# ---- CLI ---------------------------------------------------------------------------------------


async def serve_stdio(
    settings: Any,
    command: Sequence[str],
    *,
    backend_id: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    hold_seconds: float = 50.0,
    progress_interval: float = 5.0,
) -> int:
    """Open the gateway (no configured upstreams: the one backend is CMD) and proxy until stdin closes."""
    from gateway.core.errors import ConfigError
    from gateway.runtime import open_gateway

    gateway = await open_gateway(settings.model_copy(update={"upstreams": []}))
    try:
        proxy = StdioProxy(
            gateway,
            command,
            pins=PinStore(settings.state_dir),
            backend_id=backend_id,
            max_message_bytes=max_message_bytes,
            hold_seconds=hold_seconds,
            progress_interval=progress_interval,
        )
        client = ClientPipes()
        await client.open()
        try:
            return await proxy.run(client)
        except OSError as exc:
            raise ConfigError(f"cannot start the MCP server {command[0]!r}: {exc.strerror or exc}") from None
    finally:
        await gateway.aclose()
