"""uvicorn's httptools protocol with one write per fixed-length response instead of two.

uvicorn writes a response's status line and headers as soon as the app sends
`http.response.start`, then the body in a second `transport.write`: two system calls (and two
segments the client reads) for every JSON answer of `/mcp` and `/v1`. Here the head of a response
that announces its `content-length` waits for the body's bytes and leaves with them in one write.
Streamed responses (chunked: event streams) and answers to HEAD, which have no body to wait for,
go out as before; closing the connection first sends what waits.

Only the transport uvicorn writes to is wrapped; parsing, flow control, keep-alive and the ASGI
cycle are uvicorn's own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"
_LENGTH = b"\r\ncontent-length:"


class _HeldHead:
    """A connection's transport whose `write` holds a fixed-length response's head until its body."""

    __slots__ = ("_transport", "_protocol", "_head")

    def __init__(self, transport: asyncio.Transport, protocol: OneWriteHttpToolsProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
            return
        if data.endswith(_HEAD_END) and data.startswith(_HEAD_START) and _LENGTH in data and self._body_follows():
            self._head = bytes(data)
            return
        self._transport.write(data)

    def _body_follows(self) -> bool:
        """uvicorn writes a body (possibly empty) after a content-length head, except for HEAD."""
        scope = self._protocol.scope
        return scope is not None and scope.get("method") != "HEAD"

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None:
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class WatchedEvent(asyncio.Event):
    """A request cycle's `message_event` that also tells a watcher when it is set.

    uvicorn sets its cycle's event when body arrives, when the response is complete and when the
    client goes away; `receive()` reports the last two as `http.disconnect`. An app that must
    notice a disconnect while its handler runs can set `watcher` instead of keeping a task
    blocked in `receive()` (a task per request, its wake-ups and its cancellation). The watcher is
    called from the event loop's next turn, as a task woken by the event would run."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.watcher: Callable[[], None] | None = None

    def set(self) -> None:
        super().set()
        if self.watcher is not None:
            self.loop.call_soon(self.watcher)


#: What `/mcp` reads of uvicorn's request cycle when its `message_event` is a `WatchedEvent`. These
#: are uvicorn internals (no ASGI contract): a uvicorn whose cycle lacks one keeps its own event,
#: and `/mcp` falls back to a task watching `receive()`.
CYCLE_STATE: tuple[str, ...] = ("message_event", "disconnected", "response_complete", "flow", "waiting_for_100_continue")


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` writing through `_HeldHead` (see the module docstring), each request
    cycle's `message_event` a `WatchedEvent`.

    uvicorn builds every response's access line (client address, quoted path) whenever its access
    logger has a handler, even at a level that drops the line (`dharma serve` runs it at warning):
    here the line is built only when the logger would write it, judged per connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_log = self.access_log and self.access_logger.isEnabledFor(logging.INFO)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeldHead(transport, self))  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not before and all(hasattr(cycle, name) for name in CYCLE_STATE):
            cycle.message_event = WatchedEvent(self.loop)  # a new cycle, whose task has not run yet
