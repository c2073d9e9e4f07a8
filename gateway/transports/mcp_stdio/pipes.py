"""The agent's side of `dharma stdio`: our stdin and stdout as async byte streams."""

from __future__ import annotations

import asyncio
import os
import select
import stat
import sys
from typing import Any

import anyio

from gateway.mcp.framing import CHUNK
from gateway.transports.mcp_stdio.lines import LineHandler, LineReader, write_now


class ClientPipes:
    """Our stdin, read as lines by a `LineReader` (an asyncio pipe; worker threads when the event
    loop cannot watch it), and our stdout as an async byte stream (likewise)."""

    def __init__(self, stdin: Any = None, stdout: Any = None) -> None:
        self._in: Any = stdin or sys.stdin.buffer
        self._out = stdout or sys.stdout.buffer
        self._pollable_in = False
        self._writer: asyncio.StreamWriter | None = None
        self._lock = anyio.Lock()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._writer = None
        self._pollable_in = _pollable(self._in)
        if _pollable(self._out):
            try:
                transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, _own(self._out, "wb"))
                self._writer = asyncio.StreamWriter(transport, protocol, None, loop)
            except (ValueError, OSError):
                self._writer = None

    async def pump(self, handle: LineHandler, limit: int) -> None:
        """Hand stdin's lines (up to `limit` bytes) to `handle` until it ends (see `LineReader`)."""
        reader = LineReader(limit)
        if self._pollable_in:
            try:
                await asyncio.get_running_loop().connect_read_pipe(lambda: reader, _own(self._in, "rb"))
            except (ValueError, OSError):
                self._pollable_in = False
            else:
                try:
                    await reader.pump(handle)
                finally:
                    reader.close()
                return
        async with anyio.create_task_group() as tg:
            tg.start_soon(_ThreadedRead(self._in, reader).run)
            await reader.pump(handle)
            tg.cancel_scope.cancel()

    async def write(self, data: bytes) -> None:
        if self._writer is not None:
            self._writer.write(data + b"\n")
            await self._writer.drain()
            return
        async with self._lock:
            await anyio.to_thread.run_sync(self._blocking_write, data + b"\n")

    def write_now(self, data: bytes) -> bool:
        """Write `data` (and its newline) at once if that needs no waiting (see `lines.write_now`;
        never on a stdout written in threads)."""
        return write_now(self._writer, data)

    def _blocking_write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()


class _ThreadedRead:
    """Feeds a `LineReader` from a file the event loop cannot watch (/dev/null, a regular file),
    read in worker threads; standing in for its transport, it stops reading while paused."""

    def __init__(self, file: Any, reader: LineReader) -> None:
        self._read = getattr(file, "read1", file.read)  # read1: what is there; a raw file's read is one read(2)
        self._reader = reader
        self._resumed = anyio.Event()
        self._resumed.set()

    def pause_reading(self) -> None:
        self._resumed = anyio.Event()

    def resume_reading(self) -> None:
        self._resumed.set()

    def close(self) -> None:
        """Nothing to release: the file is the caller's."""

    async def run(self) -> None:
        self._reader.connection_made(self)  # type: ignore[arg-type]  # a transport's reading half
        while True:
            await self._resumed.wait()
            chunk = await anyio.to_thread.run_sync(self._read, CHUNK)
            if not chunk:
                self._reader.eof_received()
                return
            self._reader.data_received(chunk)


def _own(stream: Any, mode: str) -> Any:
    """A file object of our own on `stream`'s descriptor (not closing it): the event loop closes
    the pipe object it was given when its transport goes (uvloop's does at exit), and closing
    `sys.stdout` itself would make the command's final flush fail. (Not a duplicated descriptor:
    with one for each transport on a terminal, uvloop's write side swallowed the input.)"""
    return open(stream.fileno(), mode, buffering=0, closefd=False)  # noqa: SIM115 - the transport closes it


def piped(stream: Any) -> bool:
    """Whether `stream` is a pipe or a socket (how an agent runs the command; a person at a
    terminal is not): `dharma stdio` runs on uvloop only then (on uvloop a terminal's ^D never
    reaches the read transport as the end of input)."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _pollable(stream: Any) -> bool:
    """Whether the event loop can watch `stream`'s descriptor: a pipe, a socket, or a character
    device epoll accepts (a terminal does, /dev/null does not: asyncio would accept it and then
    fail in a callback, never seeing its end). Anything else is read and written in threads."""
    if piped(stream):
        return True
    try:
        fd = stream.fileno()
        if not stat.S_ISCHR(os.fstat(fd).st_mode) or not hasattr(select, "epoll"):
            return False
    except (AttributeError, OSError, ValueError):
        return False
    probe = select.epoll()
    try:
        probe.register(fd, select.EPOLLIN)
    except OSError:
        return False
    finally:
        probe.close()
    return True
