"""uvicorn's httptools protocol with one write per fixed-length response instead of two.

uvicorn writes a response's status line and headers as soon as the app sends
`http.response.start`, then the body in a second `transport.write`: two system calls (and two
segments the client reads) for every JSON answer of `/mcp` and `/v1`. Here the head of a response
that announces its `content-length` waits for the body's bytes and leaves with them in one write.
Streamed responses (chunked: event streams) and answers to HEAD, which have no body to wait for,
go out as before; closing the connection first sends what waits.

Only the transport uvicorn writes to is wrapped; parsing, flow control, keep-alive and the ASGI
cycle are uvicorn's own. An app that has a whole fixed-length answer at hand can also hand it over
in one step (`respond`): the head is built and written with the body at once, instead of two
ASGI messages each validated and written separately.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

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

    def write_whole(self, data: bytes) -> None:
        """Write a whole response (head and body), never held."""
        self.flush()
        self._transport.write(data)

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


#: What `respond` reads and sets of uvicorn's request cycle: uvicorn internals again (what its own
#: `send` does for a start and a last body message). A cycle class lacking one is answered by
#: its own `send`, as any other response.
WHOLE_STATE: tuple[str, ...] = (
    "scope", "transport", "flow", "access_log", "default_headers", "message_event", "on_response", "disconnected",
    "keep_alive", "waiting_for_100_continue", "response_started", "response_complete", "chunked_encoding",
    "expected_content_length",
)
_WHOLE_OK: dict[type, bool] = {}
#: Headers whose meaning uvicorn's `send` acts on (framing, keep-alive): an answer carrying one goes through it.
_FRAMING = (b"content-length", b"transfer-encoding", b"connection")


def respond(send: Callable[..., Any], status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """Answer a request whose ASGI `send` is a request cycle of `OneWriteHttpToolsProtocol` with
    `status`, `headers` and `body` (a `content-length` is added) in one step: the same bytes,
    connection state and completion as `http.response.start` and one last `http.response.body`
    through uvicorn's `send`, built at once and written in one `transport.write`.

    False, with nothing done, when this cannot be done here (another server or protocol, a
    wrapped `send`, a response already begun, a paused or closed connection, an access line to
    write, a HEAD request, a framing header or an invalid header given): send the two messages."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle or getattr(send, "__func__", None) is not RequestResponseCycle.send:
        return False
    ok = _WHOLE_OK.get(type(cycle))
    if ok is None:
        ok = _WHOLE_OK[type(cycle)] = all(hasattr(cycle, name) for name in WHOLE_STATE)
    transport = cycle.transport
    if not ok or type(transport) is not _HeldHead or cycle.response_started or cycle.disconnected \
            or cycle.flow.write_paused or cycle.access_log or cycle.scope["method"] == "HEAD":
        return False
    line = STATUS_LINE.get(status)
    if line is None:
        return False
    content = [line]
    for name, value in (*cycle.default_headers, *headers):
        if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
            return False
        name = name.lower()
        if name in _FRAMING:
            return False
        content += (name, b": ", value, b"\r\n")
    content += (b"content-length: ", str(len(body)).encode(), b"\r\n")
    keep_alive = cycle.keep_alive
    if not keep_alive:
        content.append(b"connection: close\r\n")
    content += (b"\r\n", body)
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.chunked_encoding = False
    cycle.expected_content_length = 0
    transport.write_whole(b"".join(content))
    cycle.response_complete = True
    cycle.message_event.set()
    if not keep_alive:
        transport.close()
    cycle.on_response()
    return True
