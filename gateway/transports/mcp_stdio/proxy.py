"""`dharma stdio [--config F] -- CMD ARGS…`: a governing, otherwise transparent stdio MCP proxy.

The agent launches this instead of the MCP server. The `Supervisor` keeps the server process
running; this module pumps the agent's lines (one JSON-RPC message per line, any length, read in
chunks) and the server's, and does the I/O that `McpSession` (pure) asks for:

- messages it does not govern pass through as the original bytes, in both directions; a request
  for a method MCP does not define is recorded in the ledger as it passes;
- `tools/list` answers are filtered per principal, and `tools/call` goes through the one shared
  flow (`gateway.mcp.calls.ToolsCall`), `governed.StdioCallPort` being its `CallPort`: the server
  is asked with gateway-originated ids, the client is notified or elicited on the same pipe;
- the handshake is relayed while the gateway loads (`serve_stdio`); the governed half
  (`governed.py`, which imports the pipeline) is used once it has;
- the server's stderr goes to the log (structlog on stderr); stdout carries only MCP;
- a server that exits is restarted (the client's `initialize` is replayed to it), calls in
  flight get an error and count against the circuit breaker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import structlog

from gateway.mcp import jsonrpc
from gateway.mcp.framing import DEFAULT_MAX_MESSAGE_BYTES, Oversize, blank
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
from gateway.transports.mcp_stdio.pipes import ClientPipes
from gateway.transports.mcp_stdio.supervisor import RESTART_GRACE, ServerProcess, Supervisor, spawn_server

if TYPE_CHECKING:
    from gateway.core.call import Credentials
    from gateway.core.gateway import Gateway
    from gateway.mcp.calls import ToolsCall
    from gateway.mcp.pins import PinStore
    from gateway.transports.mcp_stdio.governed import Governance

log = structlog.get_logger()


class Waiter:
    """An answer awaited from the server or the client (to a gateway-originated or governed request).

    A bare asyncio future with a timer rather than an anyio Event under `fail_after`: this is on
    every governed call's path, and an anyio cancel scope costs several times the rest of it. A
    failure resolves the future too (with None; the error is kept apart), so one that nobody
    awaits any more is not reported as an exception never retrieved."""

    __slots__ = ("future", "error", "side")

    def __init__(self, side: str) -> None:
        self.future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self.error: BaseException | None = None
        self.side = side

    def set(self, value: dict[str, Any]) -> None:
        if not self.future.done():
            self.future.set_result(value)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.error = error
            self.future.set_result(None)

    async def wait(self, timeout: float) -> dict[str, Any]:
        """The answer; TimeoutError when none came within `timeout` seconds (the error `fail`ed
        with, if any). Cancelling the waiting task cancels only the wait."""
        timer = asyncio.get_running_loop().call_later(timeout, self.fail, TimeoutError())
        try:
            value = await self.future
        finally:
            timer.cancel()
        if value is None:
            assert self.error is not None
            raise self.error
        return value


class BackendGone(Exception):
    """The server exited before answering."""


def default_backend_id(command: Sequence[str]) -> str:
    """A stable name for a stdio server: its program name plus a digest of the whole command."""
    digest = hashlib.sha256("\x00".join(command).encode()).hexdigest()[:10]
    return f"stdio:{Path(command[0]).name}:{digest}"


#: What the agent may send before the gateway has loaded: the handshake, relayed as it is (the
#: server's answer too). Anything else (tools/call, tools/list, any other request, a batch, a line
#: that is not JSON) waits until the policy is compiled and checked and the ledger is open.
EARLY_METHODS = frozenset({"initialize", "notifications/initialized", "ping"})


#: A handshake line is small; anything longer is not read before the gateway has loaded.
EARLY_LINE_BYTES = 64 * 1024


def _early(line: bytes) -> bool:
    """Whether `line` is a message of `EARLY_METHODS` (read only until the gateway is loaded; any
    line it cannot read, too deep or not JSON, is not: it waits for the strict parser)."""
    if len(line) > EARLY_LINE_BYTES:
        return False
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(message, dict) and message.get("method") in EARLY_METHODS


class StdioProxy:
    """One agent's stdio session in front of one MCP server (see the module docstring).

    Built with a gateway, it governs from the start; built with None, it relays the handshake
    (`EARLY_METHODS`) and holds everything else until `attach` gives it the loaded gateway.
    """

    def __init__(
        self,
        gateway: Gateway | None,
        command: Sequence[str],
        *,
        pins: PinStore | None = None,
        backend_id: str | None = None,
        local_user: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        hold_seconds: float = 50.0,
        progress_interval: float = 5.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.backend_id = backend_id or default_backend_id(list(command))
        self.local_user = local_user if local_user is not None else _login()
        self.max_message_bytes = max_message_bytes
        self.hold_seconds, self.progress_interval = hold_seconds, progress_interval
        self.session = McpSession()
        self.server = Supervisor(command, self.backend_id, on_line=self._from_server, on_exit=self._fail_in_flight,
                                 on_restart=self._replay_handshake, env=env)
        self.waiters: dict[jsonrpc.RpcId, Waiter] = {}
        self.holds: dict[object, anyio.CancelScope] = {}
        self.cancelled: set[object] = set()
        self.loaded = anyio.Event()
        self.governance: Governance | None = None
        self.governed: Any = None  # the module gateway.transports.mcp_stdio.governed, once loaded
        self._client: ClientPipes | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._messages: set[asyncio.Task[None]] = set()  # the tasks handling messages (`_spawn`)
        self._crashed: list[BaseException] = []
        if gateway is not None:
            assert pins is not None, "a proxy built with a gateway needs its pin store"
            self.attach(gateway, pins)

    def attach(self, gateway: Gateway, pins: PinStore) -> None:
        """Govern with `gateway` from now on; the messages held for it go on."""
        from gateway.transports.mcp_stdio import governed

        self.governance = governed.Governance(gateway, pins, local_user=self.local_user, hold_seconds=self.hold_seconds,
                                              progress_interval=self.progress_interval)
        self.governed = governed
        self.loaded.set()

    def _loaded(self) -> Governance:
        if self.governance is None:
            raise RuntimeError("the stdio proxy governed a message before its gateway was loaded")
        return self.governance

    @property
    def gateway(self) -> Gateway:
        return self._loaded().gateway

    @property
    def pins(self) -> PinStore:
        return self._loaded().pins

    @property
    def credentials(self) -> Credentials:
        return self._loaded().credentials

    @property
    def calls(self) -> ToolsCall:
        return self._loaded().calls

    @property
    def restarts(self) -> int:
        return self.server.restarts

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(self, client: ClientPipes, first: ServerProcess | None = None, *,
                  load: Callable[[], Awaitable[None]] | None = None) -> int:
        """Proxy until the client closes stdin; `first` is the server when it was already started.
        `load` opens the gateway and `attach`es it while the handshake is relayed; if it fails, the
        proxy ends, the server is stopped and its error is raised."""
        self._client = client
        first = first or await self.server.spawn()
        failed: list[Exception] = []
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self.server.run, first)
                if load is not None:
                    tg.start_soon(self._load, load, failed)
                try:
                    await client.pump(self._from_client, self.max_message_bytes)
                    await self.loaded.wait()  # a client that only said hello still gets its policy checked
                    await self.server.stop()
                finally:
                    await self._end_messages()
                tg.cancel_scope.cancel()
        finally:
            await self.server.stop()
        if self._crashed:
            raise self._crashed[0]
        if failed:
            raise failed[0]
        return 0

    async def _load(self, load: Callable[[], Awaitable[None]], failed: list[Exception]) -> None:
        try:
            await load()
        except Exception as exc:
            failed.append(exc)
            assert self._tg is not None
            self._tg.cancel_scope.cancel()

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
            await self.do(self.session.answer(key, message))

    # ---- pumps -------------------------------------------------------------------------

    def _from_client(self, line: bytes | Oversize) -> Coroutine[Any, Any, None] | None:
        """An agent's line, in the event loop's read callback (`LineReader`): what can be done at
        once is done there (a tools/call handed to a task of its own, a message relayed to a
        server pipe with room); anything else is returned for the client's pump to await before
        the next line. Before the gateway has loaded, only the handshake is handled."""
        if not self.loaded.is_set() and (isinstance(line, Oversize) or not _early(line)):
            return self._after_load(line)
        try:
            if isinstance(line, Oversize):
                actions: list[Any] = [self.session.oversized(jsonrpc.sniff_id(line.prefix), line.size, self.max_message_bytes)]
            elif blank(line):
                return None
            else:
                actions = self.session.from_client(line)
            done = self._do_now(actions)
        except Exception:
            return self._failed("_from_client", line if isinstance(line, bytes) else None)
        if done == len(actions):
            return None
        return self._safely(self.do, actions[done:], answer_to=line if isinstance(line, bytes) else None)

    async def _after_load(self, line: bytes | Oversize) -> None:
        await self.loaded.wait()
        pending = self._from_client(line)
        if pending is not None:
            await pending

    def _from_server(self, line: bytes) -> Coroutine[Any, Any, None] | None:
        """A server line, in the event loop's read callback (`ServerOutput`): an answer awaited
        here is resolved and a relay to a client pipe with room is written on the spot; anything
        else is returned for the server's pump to await before the next line."""
        try:
            actions = self.session.from_server(line)
            if not actions:
                log.warning("backend.not_jsonrpc", backend=self.backend_id, line=line[:200].decode("utf-8", "replace"))
                return None
            done = self._do_now(actions)
        except Exception:
            return self._failed("_from_server", None)
        return None if done == len(actions) else self._safely(self.do, actions[done:])

    def _do_now(self, actions: list[Any]) -> int:
        """Carry out the leading `actions` that need no waiting, as `do` would; how many were
        done (the rest are left to `do`, in order)."""
        for done, action in enumerate(actions):
            kind = type(action)
            if kind is ToServer:
                if not self.server.send_now(action.data):
                    return done
            elif kind is ToClient:
                if not self._write_now(action.data):
                    return done
            elif kind is ListAnswer:
                return done
            else:
                self._act(action)
        return len(actions)

    def _write_now(self, data: bytes) -> bool:
        """Write to the client at once if that needs no waiting (see `ClientPipes.write_now`)."""
        assert self._client is not None
        try:
            return self._client.write_now(data)
        except (BrokenPipeError, ConnectionResetError, OSError, RuntimeError) as exc:
            log.warning("client.write_failed", error=type(exc).__name__)
            return True

    def _resolve(self, action: Resolve) -> None:
        waiter = self.waiters.pop(action.id, None)
        if waiter is not None:
            waiter.set(action.response)

    async def _safely(self, handle: Callable[..., Awaitable[None]], *args: Any, answer_to: bytes | None = None) -> None:
        """Handle one message; a failure is logged (and a client request answered -32603), and the
        pumps go on: no single message may end the connection."""
        try:
            await handle(*args)
        except Exception:
            answer = self._failed(getattr(handle, "__name__", "?"), answer_to)
            if answer is not None:
                await answer

    def _failed(self, handler: str, answer_to: bytes | None) -> Coroutine[Any, Any, None] | None:
        """Log the exception being handled; the -32603 answer to the client's request `answer_to`
        (if its id can be read) is returned to be awaited."""
        rpc_id = jsonrpc.recover_id(answer_to) if answer_to is not None else None
        log.exception("mcp.message_failed", handler=handler, request_id=rpc_id)
        if answer_to is None or rpc_id is None:
            return None
        return self.send_client(jsonrpc.dumps(
            jsonrpc.error(rpc_id, jsonrpc.INTERNAL_ERROR, "Dharma Gateway failed to handle this message")))

    # ---- actions -----------------------------------------------------------------------

    async def do(self, actions: list[Any]) -> None:
        """Carry out `actions` in order."""
        for action in actions:
            if isinstance(action, ToServer):
                if not self.server.ready.is_set():
                    # While the server restarts, client traffic waits for it (written to the dead one,
                    # a request would never be answered); after the timeout it is sent regardless.
                    timeout = self.gateway.policy.backend_timeout_seconds if self.loaded.is_set() else 0.0
                    with anyio.move_on_after(max(timeout, RESTART_GRACE)):
                        await self.server.ready.wait()
                await self.server.send(action.data)
            elif isinstance(action, ToClient):
                await self.send_client(action.data)
            elif isinstance(action, ListAnswer):
                await self.governed.list_answer(self, action)
            else:
                self._act(action)

    def _act(self, action: Any) -> None:
        """Carry out an action that never waits (in a task or in a read callback)."""
        if isinstance(action, GovernCall):
            self._spawn("mcp.tools_call", self.governed.govern_call, self, action)
        elif isinstance(action, Resolve):
            self._resolve(action)
        elif isinstance(action, CancelHeld):
            scope = self.holds.get(action.key)
            if scope is not None:
                scope.cancel()
            else:  # still being decided: its answer will be dropped
                self.cancelled.add(action.key)
        elif isinstance(action, Reject):
            self._spawn("mcp.reject", self._reject, action)
        elif isinstance(action, Passed):
            self._spawn("mcp.passed", self.governed.record_passed, self, action.method)

    def _spawn(self, name: str, handle: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Handle a message in a task of the proxy's own (`_safely`): a bare asyncio task, kept in
        `_messages` until it ends and cancelled when the proxy ends (`_end_messages`), as the task
        group's children were. Not the task group's `start_soon`: anyio 4 wraps each task in a
        cancel scope, an event and a coroutine of its own, which cost more than the rest of
        handling a `tools/call` line (every governed call starts one). Inside it anyio works as in
        any asyncio task (its cancel scopes, events and timeouts)."""
        task = asyncio.get_running_loop().create_task(self._safely(handle, *args), name=name)
        self._messages.add(task)
        task.add_done_callback(self._message_done)

    def _message_done(self, task: asyncio.Task[None]) -> None:
        self._messages.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        # only what `_safely` lets through (a BaseException) gets here: it ends the proxy, as in a task group
        self._crashed.append(task.exception())  # type: ignore[arg-type]
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _end_messages(self) -> None:
        """Cancel the message tasks still running and wait until they have ended (shielded: the
        proxy may be ending because it was cancelled)."""
        with anyio.CancelScope(shield=True):
            while self._messages:
                tasks = list(self._messages)
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks)

    async def _reject(self, action: Reject) -> None:
        """A refused message is recorded in the ledger: a handshake line refused before the
        gateway has loaded waits for it."""
        await self.loaded.wait()
        await self.governed.reject(self, action)

    async def send_client(self, data: bytes) -> None:
        assert self._client is not None
        try:
            await self._client.write(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            log.warning("client.write_failed", error=type(exc).__name__)

    async def server_request(self, method: str, params: Any, *, timeout: float) -> dict[str, Any]:
        rid, data = self.session.originate("server", method, params)
        waiter = self.waiters[rid] = Waiter("server")
        try:
            await self.server.send(data)
            return await waiter.wait(self.server.grace(timeout))
        finally:
            self.waiters.pop(rid, None)
            self.session.forget(rid)

def _login() -> str:
    try:
        return os.getlogin()
    except OSError:
        import getpass

        return getpass.getuser()


async def serve_stdio(
    load_settings: Callable[[], Any],
    command: Sequence[str],
    *,
    backend_id: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    hold_seconds: float = 50.0,
    progress_interval: float = 5.0,
) -> int:
    """Start the server, relay the agent's handshake, open the gateway meanwhile (no configured
    upstreams: the one backend is CMD), and proxy until stdin closes.

    The server boots and the agent's `initialize` is answered while the gateway loads (start-up
    is the slower of the two, not their sum). The settings are read, the pipeline imported and
    the policy compiled and checked in a worker thread, so relaying the handshake never waits for
    them; every other message waits until the policy is loaded and the ledger open (see
    `EARLY_METHODS`). A gateway that cannot be opened ends the command with its error, the
    server stopped.
    """
    try:
        first = await spawn_server(command)
    except OSError as exc:
        from gateway.core.errors import ConfigError

        raise ConfigError(f"cannot start the MCP server {command[0]!r}: {exc.strerror or exc}") from None
    try:
        proxy = StdioProxy(None, command, backend_id=backend_id, max_message_bytes=max_message_bytes,
                           hold_seconds=hold_seconds, progress_interval=progress_interval)
        client = ClientPipes()
        await client.open()
    except BaseException:
        await first.stop()
        raise
    async with contextlib.AsyncExitStack() as stack:

        async def load() -> None:
            settings, compiled = await _prepare(proxy.server, load_settings)
            from gateway.logging import configure_logging
            from gateway.runtime import open_gateway, pin_store_for
            from gateway.watch import live_reload

            configure_logging(settings.log_level, settings.log_format)
            gateway = await open_gateway(settings.model_copy(update={"upstreams": []}), compiled=compiled)
            stack.push_async_callback(gateway.aclose)
            await stack.enter_async_context(live_reload(gateway, settings))  # SIGHUP and file changes reload
            proxy.attach(gateway, pin_store_for(gateway, settings))

        return await proxy.run(client, first, load=load)


#: How much nicer than the process the loading thread is while the server has not said anything
#: yet (is booting): where the two compete for a core, the server the agent is waiting on gets
#: about ten times the loader's share; on an idle core the loader runs at full speed. Once the
#: server has answered, the remaining steps run at normal priority.
LOADER_NICENESS = 10


async def _prepare(server: Supervisor, load_settings: Callable[[], Any]) -> tuple[Any, Any]:
    """Off the event loop, in steps: import the settings' and the pipeline's modules (pydantic,
    the CEL engine, the stages, the ledger), read the settings, load, compile and check the
    policy. Each step runs at `LOADER_NICENESS` if the server is still booting when it starts."""
    import importlib

    for module in ("gateway.config", "gateway.runtime"):
        await run_off_loop(importlib.import_module, module, polite=not server.heard)
    from gateway.runtime import policy_loader

    settings = await run_off_loop(load_settings, polite=not server.heard)
    return settings, await run_off_loop(policy_loader(settings), polite=not server.heard)


async def run_off_loop(func: Callable[..., Any], *args: Any, polite: bool) -> Any:
    """`func(*args)` in a worker thread; `polite`: in a thread of its own, `LOADER_NICENESS`
    nicer (Linux: a thread's own priority; its own because an unprivileged thread cannot raise
    its priority again, so a pooled one would stay low)."""
    if not polite:
        return await anyio.to_thread.run_sync(func, *args)
    outcome: list[tuple[bool, Any]] = []
    done = anyio.Event()
    token = anyio.lowlevel.current_token()

    def body() -> None:
        with contextlib.suppress(AttributeError, OSError):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + LOADER_NICENESS, 19))
        try:
            outcome.append((True, func(*args)))
        except BaseException as exc:  # handed to the awaiting task, which raises it
            outcome.append((False, exc))
        finally:
            with contextlib.suppress(Exception):  # the loop is gone: nobody waits any more
                anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=body, name="dharma-stdio-load", daemon=True).start()
    await done.wait()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
