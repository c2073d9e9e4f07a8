"""The ASGI side of one `/mcp` request: reading its body, the `Reply` a handler fills while it runs
(JSON, or an event stream numbered with the gateway's own event ids), and the writer that turns a
Reply into ASGI messages with SSE framing.

No routing, relaying or governance here (`mcp_http` and the modules it is built from).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from starlette.types import Receive, Send

from gateway.mcp import jsonrpc
from gateway.stores.base import EventStore, StoreUnavailable, StreamLog
from gateway.transports.http_protocol import respond

log = structlog.get_logger()

#: The reconnection delay (ms) the gateway's priming events suggest to resuming clients.
RETRY_MS = 1000
#: What ends a line in an event stream (SSE spec): CRLF, LF or a lone CR.
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache, no-transform", "x-accel-buffering": "no"}


def _asgi_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """Headers as ASGI carries them (byte pairs)."""
    return [(k.encode(), v.encode()) for k, v in headers.items()]


_SSE_HEAD = _asgi_headers(SSE_HEADERS)


# ---- what a handler produces for the ASGI writer -----------------------------------------


@dataclass(slots=True)
class _Head:
    status: int
    headers: dict[str, str]


@dataclass(slots=True)
class _Event:
    data: bytes
    id: str | None = None
    retry: int | None = None


@dataclass(slots=True)
class _Final:
    body: bytes | None
    status: int = 200
    headers: dict[str, str] | None = None


class AsgiWriter:
    """Where a Reply's items go: straight to the ASGI `send` of its request, as a JSON answer or an
    event stream (no channel, no writer task: each hop through the event loop cost CPU per request).

    A failing `send` (the connection broke) ends the writing and calls `on_broken`.
    """

    __slots__ = ("_send", "started", "ended", "on_broken")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.ended = False
        self.on_broken: Callable[[], None] | None = None

    async def send(self, item: object) -> None:
        if self.ended:
            return
        try:
            await self._write(item)
        except OSError:
            self.ended = True
            if self.on_broken is not None:
                self.on_broken()

    async def _write(self, item: object) -> None:
        send = self._send
        if isinstance(item, _Head):
            self.started = True
            await send({"type": "http.response.start", "status": item.status,
                        "headers": _asgi_headers(item.headers)})
        elif isinstance(item, _Event):
            if not self.started:
                self.started = True
                await send({"type": "http.response.start", "status": 200,
                            "headers": list(_SSE_HEAD)})
            await send({"type": "http.response.body", "body": _sse_bytes(item), "more_body": True})
        elif isinstance(item, _Final):
            self.ended = True
            if self.started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            data = item.body or b""
            headers = _asgi_headers(item.headers) if item.headers else []
            if respond(send, item.status, headers, data):  # the whole answer in one step
                return
            headers.append((b"content-length", str(len(data)).encode()))
            await send({"type": "http.response.start", "status": item.status, "headers": headers})
            await send({"type": "http.response.body", "body": data})

    def close(self) -> None:
        """The Reply is done; what is left to send is `finish`'s (the request's own task sends it)."""

    async def finish(self) -> None:
        """End the response if the Reply did not: an event stream's end, or a 500 when nothing was answered."""
        if self.ended:
            return
        self.ended = True
        try:
            if self.started:
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await plain_reply(self._send, 500, jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, "Dharma Gateway produced no answer"))
        except OSError:
            pass


class _Discard:
    """The sink of a Reply whose items nobody writes (a batch element: only its final message counts)."""

    async def send(self, item: object) -> None:
        return None

    def close(self) -> None:
        return None


class Reply:
    """The answer to one HTTP request, produced while the handler runs: JSON, or an event stream
    that opens on the first event (or explicitly, to mirror an upstream that answered SSE).

    A resumable reply (`resumable`, legacy 2025-11-25+ clients) numbers its events with the
    gateway's own ids, primes its stream (an id, `retry:`, empty data) and keeps every event it
    sends in the session's `EventStore`. `detach()` ends the HTTP response early, as the upstream
    did; the handler keeps running and its later events go to the store only, for the client to
    fetch with GET + `Last-Event-ID`.
    """

    def __init__(self, base_headers: dict[str, str] | None = None, sink: AsgiWriter | _Discard | None = None) -> None:
        self._send = sink if sink is not None else _Discard()
        self.sse = False
        self.done = False
        self.detached = False
        self.base_headers = base_headers or {}
        self.message: Any = None  # the last final JSON-RPC message (for batches)
        self.store: EventStore | None = None
        self.log: StreamLog | None = None
        self._finished = False
        #: The event loop running the request, when known without asking (its request cycle's): saves
        #: a running-loop lookup (a `getpid` system call on Python 3.11) where the reply's handler needs it.
        self.loop: asyncio.AbstractEventLoop | None = None

    def resumable(self, store: EventStore) -> None:
        """Number and keep this reply's events in `store` if it becomes an event stream."""
        if not self.sse:
            self.store = store

    async def open_sse(self, status: int = 200, headers: dict[str, str] | None = None, *, log: StreamLog | None = None) -> None:
        if not self.sse and not self.done:
            self.sse = True
            await self._send.send(_Head(status, {**SSE_HEADERS, **self.base_headers, **(headers or {})}))
            if self.store is not None:
                if log is not None:
                    self.log = log
                else:
                    self.log = self.store.open()
                    await self._send.send(_Event(b"", await self._keep(b""), RETRY_MS))

    async def _keep(self, data: bytes) -> str | None:
        """Keep `data` in the store as the stream's next event; its id. If the store fails, the stream
        goes on unnumbered (what the client gets was governed; only resuming it is lost)."""
        if self.store is None or self.log is None:
            return None
        try:
            return await self.store.append(self.log, data)
        except StoreUnavailable as exc:
            log.error("mcp_http.event_not_kept", error=str(exc), detached=self.detached)
            self.store = None
            return None

    async def event(self, data: bytes) -> None:
        if self.done:
            return
        await self.open_sse()
        event_id = await self._keep(data)
        if not self.detached:
            await self._send.send(_Event(data, event_id))

    async def resend(self, event_id: str, data: bytes) -> None:
        """Send an event again with its original id (a replay from the store; not stored twice)."""
        if not self.done and not self.detached:
            await self.open_sse()
            await self._send.send(_Event(data, event_id))

    async def detach(self) -> None:
        """End the client's event stream now (the upstream closed its own early); keep governing."""
        if self.sse and self.log is not None and not self.done and not self.detached:
            self.detached = True
            await self._send.send(_Final(None))

    async def final(self, body: bytes | dict[str, Any] | None, status: int = 200, headers: dict[str, str] | None = None) -> None:
        if self.done:
            return
        data = jsonrpc.dumps(body) if isinstance(body, dict) else body
        if isinstance(body, dict):
            self.message = body
        if self.sse:
            if data:
                await self.event(data)
            self.done = True
            if not self.detached:
                await self._send.send(_Final(None))
        else:
            self.done = True
            hdrs = {**self.base_headers, **(headers or {})}
            if data and "content-type" not in hdrs:
                hdrs["content-type"] = "application/json"
            await self._send.send(_Final(data, status, hdrs))
        await self.aclose()

    @property
    def settled(self) -> bool:
        """Whether `aclose` has nothing left to await (no stored stream to mark done)."""
        return self.store is None or self.log is None or self._finished

    async def aclose(self) -> None:
        """End the reply; a stored stream gets its done marker (once), so a resume of it ends too."""
        self._send.close()
        if self.store is not None and self.log is not None and not self._finished:
            self._finished = True
            try:
                await self.store.finish(self.log)
            except StoreUnavailable as exc:
                log.error("mcp_http.stream_end_not_kept", error=str(exc))


class Collect(Reply):
    """A Reply for one element of a batch: only the final message matters."""

    async def event(self, data: bytes) -> None:
        return None

    async def open_sse(self, status: int = 200, headers: dict[str, str] | None = None, *, log: StreamLog | None = None) -> None:
        return None

    async def final(self, body: bytes | dict[str, Any] | None, status: int = 200, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, dict):
            self.message = body
        elif body:
            try:
                self.message = jsonrpc.loads(body)
            except ValueError:
                self.message = None
        self.done = True


async def read_body(receive: Receive, limit: int) -> tuple[bytes, int | None]:
    """The request body, or its first bytes and total size when it is over `limit` (not kept)."""
    chunks: list[bytes] = []
    size = 0
    over = False
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            if not over:
                chunks = [b"".join(chunks)[:4096]]
            over = True
        elif not over:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks), (size if over else None)


async def plain_reply(send: Send, status: int, body: dict[str, Any] | None, headers: dict[str, str] | None = None) -> None:
    data = jsonrpc.dumps(body) if body is not None else b""
    hdrs = [(b"content-type", b"application/json")] if data else []
    hdrs += _asgi_headers(headers or {})
    if respond(send, status, hdrs, data):
        return
    hdrs.append((b"content-length", str(len(data)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})


def _sse_bytes(event: _Event) -> bytes:
    """One event on the wire: a priming event is only an id (and `retry:`), with empty data.

    Data that spans several lines (an upstream's pretty-printed message, joined with "\\n" as the
    SSE spec says) goes out one `data:` line per line, so the receiver joins it back whole.
    """
    head = b"id: " + event.id.encode() + b"\n" if event.id is not None else b""
    if event.retry is not None:
        head += b"retry: " + str(event.retry).encode() + b"\n"
    if not event.data:
        return head + b"data: \n\n"
    lines = _LINE_BREAK.split(event.data)
    return head + b"event: message\n" + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
