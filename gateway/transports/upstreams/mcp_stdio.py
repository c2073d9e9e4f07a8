"""An upstream MCP server launched over stdio, behind `/mcp`, with the same interface as
`upstream_http.McpHttpUpstream` (post / get / delete → `UpstreamReply`).

- Legacy: one process per client session. A POSTed `initialize` without a session id spawns a
  process and answers with a session id naming it; DELETE stops it. Messages the server sends
  outside a request (or server→client requests while several requests are in flight) go to the
  session's GET stream. At most `max_processes` session processes run at once, counted from spawn
  until the process has exited (a stopping one still counts): an `initialize` that would start
  one more raises `LimitReached` (`mcp.max_stdio_processes`) before anything is spawned. A process
  that exits by itself leaves its session (its next request gets 404) and frees its slot.
- 2026-07-28: one shared process, spawned on first use. Request ids are remapped (clients'
  ids may repeat across clients) and mapped back on the answers.

Lines of any length (`gateway.mcp.framing.LineSplitter`); the server's stderr goes to the log.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc
import structlog

from gateway.core.errors import LimitReached
from gateway.mcp import jsonrpc
from gateway.mcp.framing import SERVER_MAX_MESSAGE_BYTES, LineSplitter, Oversize, blank
from gateway.transports.upstreams.replies import UpstreamError, UpstreamReply

log = structlog.get_logger()


class _Process:
    """One running server: a line pump routing its messages to the streams waiting for them."""

    def __init__(self, upstream_id: str, proc: anyio.abc.Process, remap: bool) -> None:
        self.upstream_id = upstream_id
        self.proc = proc
        self.remap = remap
        self.ids = itertools.count(1)
        self.calls: dict[Any, tuple[Any, anyio.abc.ObjectSendStream[bytes | None]]] = {}  # wire id -> (client id, stream)
        self.tokens: dict[Any, Any] = {}  # progress token -> wire id
        self.background = anyio.create_memory_object_stream[bytes](1000)
        self.alive = True
        self.lock = anyio.Lock()
        self.used = time.monotonic()  # the last request of its session (for the Retry-After of a refusal)

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        async with self.lock:
            try:
                await self.proc.stdin.send(data + b"\n")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise UpstreamError("unavailable", f"upstream {self.upstream_id} is not running: {type(exc).__name__}") from None

    async def pump(self) -> None:
        assert self.proc.stdout is not None
        splitter = LineSplitter(SERVER_MAX_MESSAGE_BYTES)
        try:
            async for chunk in self.proc.stdout:
                for line in splitter.feed(chunk):
                    if isinstance(line, Oversize) or blank(line):
                        continue
                    await self.route(line)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            self.alive = False
            for _client_id, stream in list(self.calls.values()):
                await stream.send(None)  # the server died: end every open stream
            self.calls.clear()

    async def stderr(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            async for chunk in self.proc.stderr:
                log.info("upstream.stderr", upstream=self.upstream_id, text=chunk.decode("utf-8", "replace").rstrip()[:2000])

    async def route(self, line: bytes) -> None:
        try:
            msg = jsonrpc.loads(line)
        except ValueError:
            log.warning("upstream.not_jsonrpc", upstream=self.upstream_id)
            return
        if not isinstance(msg, dict):
            return
        if ("result" in msg or "error" in msg) and "method" not in msg:
            entry = self.calls.pop(msg.get("id"), None)
            if entry is None:
                return
            client_id, stream = entry
            if self.remap:
                line = jsonrpc.dumps({**msg, "id": client_id})
            self.tokens = {t: w for t, w in self.tokens.items() if w != msg.get("id")}
            await stream.send(line)
            await stream.send(None)
            return
        params = _obj(msg.get("params"))
        target = None
        if msg.get("method") == "notifications/progress":
            target = self.tokens.get(params.get("progressToken"))
        elif "id" in msg and len(self.calls) == 1:
            target = next(iter(self.calls))
        entry = self.calls.get(target) if target is not None else None
        if entry is not None:
            await entry[1].send(line)
        else:
            with contextlib.suppress(anyio.WouldBlock):
                self.background[0].send_nowait(line)

    async def request(self, msg: dict[str, Any]) -> AsyncIterator[bytes]:
        client_id = msg["id"]
        wire_id: Any = next(self.ids) if self.remap else client_id
        send, receive = anyio.create_memory_object_stream[bytes | None](1000)
        self.calls[wire_id] = (client_id, send)
        params = _obj(msg.get("params"))
        meta = _obj(params.get("_meta"))
        if "progressToken" in meta:
            self.tokens[meta["progressToken"]] = wire_id
        try:
            await self.write(jsonrpc.dumps({**msg, "id": wire_id}) if self.remap else jsonrpc.dumps(msg))
            async for item in receive:
                if item is None:
                    return
                yield item
        finally:
            self.calls.pop(wire_id, None)


class McpStdioUpstream:
    """An MCP server run as a child process (see module docstring)."""

    kind = "mcp_stdio"
    forward_host = False

    #: The setting that bounds `max_processes`, as a refusal names it.
    LIMIT = "mcp.max_stdio_processes"

    def __init__(self, id: str, command: Sequence[str], *, max_processes: int, idle_seconds: float,
                 env: Mapping[str, str] | None = None, prefix: str = "") -> None:
        self.id = id
        self.prefix = prefix
        self.command = list(command)
        self.env = {**os.environ, **(env or {})}
        self.max_processes = max_processes
        self.idle_seconds = idle_seconds  # how soon an unused session is reaped: the Retry-After of a refusal
        self._sessions: dict[str, _Process] = {}
        self._running: set[_Process] = set()  # session processes spawned and not yet exited
        self._starting = 0  # session processes being spawned
        self._shared: _Process | None = None
        #: The app's lifespan task group (set by `McpHttpApp.running()`): the pumps run in it.
        self.task_group: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()

    async def _spawn(self, remap: bool) -> _Process:
        try:
            proc = await anyio.open_process(self.command, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise UpstreamError("unavailable", f"cannot start upstream {self.id} ({self.command[0]}): {exc.strerror or exc}") from None
        process = _Process(self.id, proc, remap)
        if self.task_group is None:
            await stop_process(process.proc)
            raise UpstreamError("unavailable", f"upstream {self.id}: the gateway's MCP endpoint is not running")
        self.task_group.start_soon(process.pump)
        self.task_group.start_soon(process.stderr)
        return process

    async def _process_for(self, headers: Mapping[str, str], msg: Any) -> tuple[_Process, str | None]:
        sid = _header(headers, "mcp-session-id")
        if sid is not None:
            process = self._sessions.get(sid)
            if process is None or not process.alive:
                raise _NotFound()
            return process, None
        if isinstance(msg, dict) and msg.get("method") == "initialize":
            self._claim()
            try:
                process = await self._spawn(remap=False)
            finally:
                self._starting -= 1
            sid = secrets.token_hex(16)
            self._sessions[sid] = process
            self._running.add(process)
            assert self.task_group is not None
            self.task_group.start_soon(self._watch, sid, process)
            return process, sid
        async with self._lock:
            if self._shared is None or not self._shared.alive:
                self._shared = await self._spawn(remap=True)
        return self._shared, None

    @contextlib.asynccontextmanager
    async def post(self, body: bytes, headers: Mapping[str, str], *, expect_id: jsonrpc.RpcId | None = None) -> AsyncIterator[UpstreamReply]:
        try:
            msg = jsonrpc.loads(body)
        except ValueError:
            yield UpstreamReply(400, {"content-type": "application/json"}, False,
                                jsonrpc.dumps(jsonrpc.error(None, jsonrpc.PARSE_ERROR, "Parse error")))
            return
        try:
            process, new_sid = await self._process_for(headers, msg)
        except _NotFound:
            yield UpstreamReply(404, {"content-type": "application/json"}, False, jsonrpc.dumps(jsonrpc.error(None, -32001, "Session not found")))
            return
        process.used = time.monotonic()
        if isinstance(msg, dict) and "method" in msg and "id" in msg:
            reply = UpstreamReply(200, {"content-type": "text/event-stream"}, True, session_id=new_sid,
                                  _events=self._checked(process, process.request(msg)))
            yield reply
            return
        await process.write(body)
        yield UpstreamReply(202, {}, False)

    async def _checked(self, process: _Process, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        answered = False
        async for line in events:
            answered = True
            yield line
        if not answered and not process.alive:
            raise UpstreamError("unavailable", f"upstream {self.id} exited before answering")

    @contextlib.asynccontextmanager
    async def get(self, headers: Mapping[str, str]) -> AsyncIterator[UpstreamReply]:
        sid = _header(headers, "mcp-session-id")
        process = self._sessions.get(sid) if sid else None
        if process is None:
            yield UpstreamReply(405, {}, False)
            return

        async def events() -> AsyncIterator[bytes]:
            async for line in process.background[1]:
                yield line

        yield UpstreamReply(200, {"content-type": "text/event-stream"}, True, _events=events())

    async def delete(self, headers: Mapping[str, str]) -> UpstreamReply:
        sid = _header(headers, "mcp-session-id")
        process = self._sessions.pop(sid, None) if sid else None
        if process is None:
            return UpstreamReply(404, {}, False)
        await stop_process(process.proc)
        return UpstreamReply(200, {}, False)

    @property
    def processes(self) -> int:
        """Session processes running or being spawned (what `max_processes` bounds)."""
        return len(self._running) + self._starting

    def _claim(self) -> None:
        """Take a slot for one more session process, or raise `LimitReached` (nothing spawned)."""
        if self.processes >= self.max_processes:
            oldest = min((p.used for p in self._running), default=time.monotonic())
            wait = max(1.0, oldest + self.idle_seconds - time.monotonic())
            raise LimitReached(self.LIMIT, f"process limit reached: {self.processes} server processes of upstream {self.id!r} "
                                           f"are running ({self.LIMIT}); end a session (DELETE) or retry after "
                                           f"{math.ceil(wait)} s, when an idle one is reaped", retry_after=wait)
        self._starting += 1

    async def _watch(self, sid: str, process: _Process) -> None:
        """Free the slot of a session process once it has exited, however it ended."""
        try:
            await process.proc.wait()
        finally:
            self._running.discard(process)
            if self._sessions.get(sid) is process:
                del self._sessions[sid]

    async def aclose(self) -> None:
        """Stop every process, all at once (each may take a few seconds to go)."""
        async with anyio.create_task_group() as tg:
            for process in [*self._running, *([self._shared] if self._shared else [])]:
                tg.start_soon(stop_process, process.proc)
        self._sessions.clear()
        self._running.clear()
        self._shared = None


class _NotFound(Exception):
    pass


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for k, v in headers.items():
        if k.lower() == name:
            return v
    return None


class Closable(Protocol):
    def close(self) -> None: ...


async def stop_process(proc: anyio.abc.Process, stdin: Closable | None = None) -> None:
    """Close stdin, wait, then terminate, then kill (the stdio shutdown sequence); shielded from
    cancellation. `stdin`: the writer of a process spawned with a stdin pipe of the caller's own
    (`dharma stdio` writes to its server without anyio's wrapper), closed instead of `proc.stdin`."""
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(Exception):
            if stdin is not None:
                stdin.close()
            elif proc.stdin is not None:
                await proc.stdin.aclose()
        with anyio.move_on_after(2):
            await proc.wait()
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        with anyio.move_on_after(2):
            await proc.wait()
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def _obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}
