"""The stdio MCP server's process: spawn, pump its stdout to the proxy line by line, its stderr to
the log, and restart it (with backoff) when it exits.

The proxy decides what the lines mean; this module only keeps a live process behind it:

- `ready` is clear while a restarted server is being re-initialized (the proxy replays the
  client's `initialize` through `on_restart`); client traffic waits for it.
- A server that has not said anything since it was spawned may still be booting (an `npx`
  download, a loaded machine): `grace(timeout)` gives requests to it at least `RESTART_GRACE`,
  on the first spawn as after a restart, so a slow start is not mistaken for a missing tool.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import structlog

from gateway.mcp.framing import CHUNK, SERVER_MAX_MESSAGE_BYTES, LineSplitter, Oversize, blank
from gateway.transports.mcp_stdio.lines import LineHandler, LineReader, write_now
from gateway.transports.upstreams.mcp_stdio import stop_process

#: Seconds a request waits for a server that was just (re)started and has not answered yet.
RESTART_GRACE = 15.0
log = structlog.get_logger()


class ServerOutput(LineReader):
    """The server's stdout (`LineReader`): its answers are handled in the read callback, most of
    them by resolving a future a governed call awaits, without waking a pump task."""

    def __init__(self) -> None:
        super().__init__(SERVER_MAX_MESSAGE_BYTES)


class ServerProcess:
    """A running server: the anyio process (its stderr and exit), an asyncio writer of our own on
    its stdin and `ServerOutput` on its stdout. Not anyio's streams: its `send` ends with a
    shielded checkpoint (a cancel scope and a trip round the event loop) for every message, and
    its reads wake a pump task for every answer, on every governed call."""

    __slots__ = ("proc", "stdin", "out")

    def __init__(self, proc: anyio.abc.Process, stdin: asyncio.StreamWriter, out: ServerOutput) -> None:
        self.proc = proc
        self.stdin = stdin
        self.out = out

    async def send(self, data: bytes) -> None:
        """Write one message line (a cancelled caller writes nothing, as with anyio's stream)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self.stdin.write(data + b"\n")
        await self.stdin.drain()

    def send_now(self, data: bytes) -> bool:
        """Write one message line at once if that needs no waiting (see `lines.write_now`)."""
        return write_now(self.stdin, data)

    async def stop(self) -> None:
        """Close stdin, then wait, terminate, kill (`stop_process`; shielded from cancellation)."""
        await stop_process(self.proc, self.stdin)
        self.out.close()


async def spawn_server(command: Sequence[str], env: dict[str, str] | None = None) -> ServerProcess:
    """Start the MCP server with its three pipes (raises OSError when it cannot be started); its
    stdin and stdout are pipes of our own (see `ServerProcess`)."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    to_server = open(in_write, "wb", buffering=0)  # noqa: SIM115 - the write transport closes it
    from_server = open(out_read, "rb", buffering=0)  # noqa: SIM115 - the read transport closes it
    try:
        proc = await anyio.open_process(
            list(command), stdin=in_read, stdout=out_write, stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})})
    except BaseException:
        to_server.close()
        from_server.close()
        raise
    finally:
        os.close(in_read)
        os.close(out_write)
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, to_server)
        _, out = await loop.connect_read_pipe(ServerOutput, from_server)
    except BaseException:
        to_server.close()
        from_server.close()
        await stop_process(proc)
        raise
    return ServerProcess(proc, asyncio.StreamWriter(transport, protocol, None, loop), out)


class Supervisor:
    """Keeps the MCP server process running (see the module docstring)."""

    def __init__(
        self,
        command: Sequence[str],
        backend_id: str,
        *,
        on_line: LineHandler,
        on_exit: Callable[[], Awaitable[None]],
        on_restart: Callable[[], Awaitable[None]],
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = list(command)
        self.backend_id = backend_id
        self.env = env
        self.restarts = 0
        self.ready = anyio.Event()
        self.closing = False
        self._on_line, self._on_exit, self._on_restart = on_line, on_exit, on_restart
        self._proc: ServerProcess | None = None

    async def spawn(self) -> ServerProcess:
        """Start the server (raises OSError when it cannot be started)."""
        self._proc = await spawn_server(self.command, self.env)
        return self._proc

    @property
    def heard(self) -> bool:
        """Whether the server has written anything since it was (re)started: it has booted."""
        return self._proc is not None and self._proc.out.heard

    def grace(self, timeout: float) -> float:
        """The time to allow a request: `timeout`, or the restart grace while the server is new."""
        return timeout if self.heard and self.ready.is_set() else max(timeout, RESTART_GRACE)

    async def wait_ready(self, timeout: float) -> None:
        """Wait for a restarting server (raises TimeoutError after the grace)."""
        if not self.ready.is_set():
            with anyio.fail_after(max(timeout, RESTART_GRACE)):
                await self.ready.wait()

    async def send(self, data: bytes) -> None:
        """Write one message line to the server (a dead server's pipe is logged, not raised)."""
        server = self._proc
        try:
            assert server is not None
            await server.send(data)
        except (OSError, RuntimeError, AssertionError) as exc:  # RuntimeError: uvloop's closed transport
            log.warning("backend.write_failed", backend=self.backend_id, error=type(exc).__name__)

    def send_now(self, data: bytes) -> bool:
        """Write one message line to a ready server at once if that needs no waiting; False leaves
        it to `send` (a restarting server, a busy pipe). A dead server's pipe is logged."""
        server = self._proc
        if server is None or not self.ready.is_set():
            return False
        try:
            return server.send_now(data)
        except (OSError, RuntimeError) as exc:  # RuntimeError: uvloop's closed transport
            log.warning("backend.write_failed", backend=self.backend_id, error=type(exc).__name__)
            return True

    async def run(self, first: ServerProcess) -> None:
        """Pump the server until the proxy closes, restarting it whenever it exits."""
        server, attempt = first, 0
        while True:
            self._proc, proc = server, server.proc
            async with anyio.create_task_group() as inner:
                assert proc.stderr is not None
                inner.start_soon(self._stderr_pump, proc.stderr)
                if attempt:
                    inner.start_soon(self._reinitialize)
                else:
                    self.ready.set()
                await server.out.pump(self._line)
                inner.cancel_scope.cancel()
            with anyio.move_on_after(2):
                await proc.wait()
            if self.closing:
                return
            server.stdin.close()
            log.error("backend.exited", backend=self.backend_id, returncode=proc.returncode)
            self.ready = anyio.Event()
            await self._on_exit()
            attempt += 1
            self.restarts += 1
            await anyio.sleep(min(0.1 * 2 ** min(attempt, 6), 5.0))
            if self.closing:
                return
            try:
                server = await self.spawn()
            except OSError as exc:
                log.error("backend.restart_failed", backend=self.backend_id, error=str(exc))

    async def stop(self) -> None:
        self.closing = True
        if self._proc is not None:
            await self._proc.stop()

    async def _reinitialize(self) -> None:
        await self._on_restart()
        log.warning("backend.restarted", backend=self.backend_id, restarts=self.restarts)
        self.ready.set()

    def _line(self, line: bytes | Oversize) -> Coroutine[Any, Any, None] | None:
        if isinstance(line, Oversize):
            log.error("backend.message_too_large", backend=self.backend_id, size=line.size)
            return None
        return None if blank(line) else self._on_line(line)

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
