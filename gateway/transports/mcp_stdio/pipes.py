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
        self._reader = self._writer = None
        if _pollable(self._in):
            try:
                reader = asyncio.StreamReader(limit=CHUNK * 4)
                await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), _own(self._in, "rb"))
                self._reader = reader
            except (ValueError, OSError):
                self._reader = None
        if _pollable(self._out):
            try:
                transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, _own(self._out, "wb"))
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

    def write_now(self, data: bytes) -> bool:
        """Write `data` (and its newline) at once if that needs no waiting: an asyncio pipe with
        nothing buffered. False (nothing written) leaves it to `write`, which waits its turn."""
        writer = self._writer
        if writer is None or writer.transport.is_closing() or writer.transport.get_write_buffer_size():
            return False
        writer.write(data + b"\n")
        return True

    def _blocking_write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()


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
