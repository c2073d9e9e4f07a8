"""A pipe read as newline-delimited messages in the event loop's read callback: how `dharma stdio`
reads both its server's stdout (`supervisor.ServerOutput`) and the agent's stdin (`pipes`)."""

from __future__ import annotations

import asyncio
import collections
import typing
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.mcp.framing import LineSplitter, Oversize

#: What the proxy does with one line: None when it is done with it (in the read callback), else a
#: coroutine to await before the next line is handled.
LineHandler = Callable[[bytes | Oversize], Coroutine[Any, Any, None] | None]

#: Lines queued behind one being awaited before the pipe stops being read.
QUEUED_LINES = 64


class LineReader(asyncio.Protocol):
    """A pipe split into lines (up to `limit` bytes; longer ones are `Oversize`) in the event
    loop's read callback and handed to the handler there: a line the handler deals with at once
    (an answer resolving an awaited future, a call handed to a task of its own) wakes no pump
    task. A line whose handling must await is awaited by `pump`, and the lines after it wait for
    it: every line is handled in order, one at a time, as a task reading them would."""

    def __init__(self, limit: int) -> None:
        self.heard = False
        self._splitter = LineSplitter(limit)
        self._lines: collections.deque[bytes | Oversize] = collections.deque()
        self._handle: LineHandler | None = None
        self._pending: Coroutine[Any, Any, None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None
        self._paused = False
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = typing.cast(asyncio.ReadTransport, transport)  # uvloop's does not subclass it

    def data_received(self, data: bytes) -> None:
        self.heard = True
        self._lines.extend(self._splitter.feed(data))
        self._run()
        if len(self._lines) > QUEUED_LINES and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _end(self) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _run(self) -> None:
        """Handle queued lines while nothing is being awaited; the first one that needs awaiting
        is left to `pump`."""
        while self._lines and self._pending is None and self._handle is not None:
            self._pending = self._handle(self._lines.popleft())
        if self._pending is not None:
            self._wake()
        elif self._paused and not self._lines and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    async def pump(self, handle: LineHandler) -> None:
        """Handle the pipe's lines with `handle` until it ends."""
        self._handle = handle
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._run()
                if self._pending is not None:  # set while it is awaited: the lines after it wait
                    try:
                        await self._pending
                    finally:
                        self._pending = None
                    continue
                if self._eof and not self._lines:
                    return
                self._wakeup = loop.create_future()
                await self._wakeup
        finally:
            self._handle = self._wakeup = None
            if self._pending is not None:  # cancelled before it was awaited
                self._pending.close()
                self._pending = None


def write_now(writer: asyncio.StreamWriter | None, data: bytes) -> bool:
    """Write `data` and its newline to `writer` at once if that needs no waiting: a transport
    still open with nothing buffered. False (nothing written) leaves it to an awaited write,
    which waits its turn; a line written here never overtakes one buffered before it."""
    if writer is None or writer.transport.is_closing() or writer.transport.get_write_buffer_size():
        return False
    writer.write(data + b"\n")
    return True
