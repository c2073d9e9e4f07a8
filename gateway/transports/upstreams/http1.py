"""A lean pooled HTTP/1.1 client for one upstream origin: an asyncio Protocol and httptools' C parser.

What it does: keep-alive connections pooled per origin (at most `LIMIT`, idle ones dropped after
`KEEPALIVE_SECONDS`), `http` and `https` (the default SSL context unless one is injected), the
request head built once per (method, headers) and written with the body in one write, response
headers lowercased, `Content-Length`, chunked (httptools dechunks) and read-until-close bodies,
each body handed to its reader as it arrives (an event stream is never buffered whole) with
backpressure (reading pauses while `HIGH_WATER` bytes wait unread).

What it does not do, on purpose: cookies (none kept or sent: the pool is shared by every caller),
redirects, retries (a POST is never sent twice), `User-Agent` or `Accept-Encoding` of its own
(an `Accept-Encoding` it is given is dropped, and an answer with a `Content-Encoding` other than
identity is refused: it does not decode), proxies, HTTP/2.

A connection goes back to the pool only when its answer was read to the end and neither side said
`Connection: close` (and the answer was HTTP/1.1); an idle connection the peer closed, or on which
it sent anything, is never written to (checked with a zero-timeout poll before each reuse).

Every failure leaves as `UpstreamError("timeout" | "unavailable")` naming the upstream. Aiohttp did
this job before; its per-request machinery (request/response objects, timers, the connector's
bookkeeping) was the largest share of a governed `/mcp` call's CPU (bench/README.md, mcp_http).
"""

from __future__ import annotations

import asyncio
import re
import select
import socket
import ssl
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

import httptools

from gateway.transports.upstreams.replies import UpstreamError

KEEPALIVE_SECONDS = 2.0
"""How long an idle connection is kept: well inside common servers' idle timeouts (uvicorn's and
Node's are 5 s), since reusing a connection the upstream is closing fails the POST."""
LIMIT = 512
CONNECT_SECONDS = 30.0  # getting a connection: waiting for a free slot, resolving, connecting, TLS
SOCK_CONNECT_SECONDS = 10.0  # one TCP connect attempt
HIGH_WATER = 256 * 1024  # unread body bytes at which reading pauses (until the reader takes them)

#: Headers this client owns (framing, connection management) or never sends (it does not decode).
_DROPPED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "te",
                      "upgrade", "accept-encoding"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_POLL_BAD = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | getattr(select, "POLLRDHUP", 0)


class Response:
    """One answer: `status`, lowercased `headers`, and a body read whole (`read`) or as it comes
    (`chunk`). `release()` returns the connection to the pool, or closes it unless read to the end."""

    __slots__ = ("_conn", "status", "headers", "_chunks", "_size", "_waiter", "_head", "complete", "_error",
                 "_reusable", "_released", "_until_close", "_whole")

    def __init__(self, conn: _Conn, head: asyncio.Future[None]) -> None:
        self._conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._head = head
        self.complete = False
        self._error: UpstreamError | None = None
        self._reusable = False
        self._released = False
        self._until_close = False
        self._whole = False  # read whole: no pausing

    async def read(self) -> bytes:
        """The whole body."""
        self._whole = True
        self._conn.resume()
        while not self.complete:
            await self._wait()
        if self._error is not None:
            raise self._error
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        return body

    async def chunk(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some), b"" at its end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        self._conn.resume()
        return data

    async def _wait(self) -> None:
        waiter = self._waiter = self._conn.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.complete:
            return
        self._error = error
        self.complete = True
        if not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def release(self) -> None:
        """Back to the pool when read to the end on a reusable connection; otherwise close it."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        if self.complete and self._reusable and self._error is None:
            conn.pool._put(conn)
        else:
            conn.close()


class _Conn(asyncio.Protocol):
    """One pooled connection; the httptools parser calls back into it."""

    def __init__(self, pool: HttpPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self._poll: select.poll | None = None
        self._raw: list[tuple[bytes, bytes]] = []

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), _POLL_BAD)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:  # nothing asked: the peer talks out of turn
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            response._fail(UpstreamError("unavailable", f"upstream {self.pool.name} sent a malformed answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if response._head.done() and response._until_close and response._error is None:
                response.complete = True  # a body without length ends with the connection
                response._wake()
            elif response._head.done():
                response._fail(UpstreamError("unavailable", f"upstream {self.pool.name} broke off its answer"))
            else:
                response._fail(UpstreamError("unavailable", f"upstream {self.pool.name} closed the connection before answering"))
        self.pool._lost(self)

    def pause_writing(self) -> None:  # a request is written whole; the loop buffers what the socket does not take
        pass

    def resume_writing(self) -> None:
        pass

    # ---- httptools callbacks -----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        status = self.parser.get_status_code()
        raw, self._raw = self._raw, []
        if status < 200:  # an interim answer (103 Early Hints...): the real one follows
            return
        if response._head.done():  # a second answer nobody asked for
            response._reusable = False
            self.close()
            return
        # httptools keeps a value's trailing whitespace; RFC 9110 §5.5 says it is not part of the value
        headers = {name.decode("latin-1").lower(): value.decode("latin-1").strip(" \t") for name, value in raw}
        response.status = status
        response.headers = headers
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("identity", ""):
            response._fail(UpstreamError("unavailable", f"upstream {self.pool.name} answered with Content-Encoding "
                                                        f"{coding}, which the gateway does not decode"))
            self.close()
            return
        response._until_close = "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "").lower()
        response._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        response = self.response
        assert response is not None
        if response.complete:
            return
        response._chunks.append(body)
        response._size += len(body)
        if response._size > HIGH_WATER and not self.paused and not response._whole:
            self.paused = True
            self.transport.pause_reading()
        response._wake()

    def on_message_complete(self) -> None:
        response = self.response
        assert response is not None
        if not response._head.done() or response.complete or self.closed:
            return  # the end of an interim answer, or of one already refused
        response._reusable = self.parser.should_keep_alive() and self.parser.get_http_version() == "1.1"
        response.complete = True
        response._wake()

    # ---- pool side ---------------------------------------------------------------------------

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.transport.resume_reading()

    def stale(self) -> bool:
        """The peer closed this idle connection, or said something unasked: do not write to it."""
        return self.closed or self.transport.is_closing() or (self._poll is not None and bool(self._poll.poll(0)))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()
            self.pool._lost(self)


class HttpPool:
    """Pooled HTTP/1.1 to one origin (the upstream's URL); `request` sends and returns the head."""

    def __init__(self, name: str, url: str, *, ssl_context: ssl.SSLContext | None = None, limit: int = LIMIT,
                 keepalive: float = KEEPALIVE_SECONDS) -> None:
        self.name = name
        parts = urlsplit(url)
        #: Why no request can be sent (said on each request, as an unreachable upstream is).
        self.invalid: str | None = None
        try:
            port = parts.port
        except ValueError:
            port = None
            self.invalid = f"upstream {name}: the port of {url!r} is not a number from 0 to 65535"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.invalid = f"upstream {name}: {url!r} is not an http:// or https:// URL"
        self.host = parts.hostname or ""
        self.port = port or (443 if parts.scheme == "https" else 80)
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if default_port else f"{host}:{self.port}"
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        self.limit = limit
        self.keepalive = keepalive
        self._idle: list[_Conn] = []  # oldest first; reused from the end
        self._open: set[_Conn] = set()
        self._connecting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def connections(self) -> int:
        return len(self._open)

    async def request(self, method: str, headers: Mapping[str, str], body: bytes | None = None) -> Response:
        """Send one request on a pooled (or new) connection; returns once the answer's head came."""
        if self.invalid is not None:
            raise UpstreamError("unavailable", self.invalid)
        head = self._head(method, headers)
        conn = self._reuse()
        if conn is None:
            conn = await self._connect()
        loop = conn.loop
        future = loop.create_future()
        response = conn.response = Response(conn, future)
        if body is None:
            conn.transport.write(head + b"\r\n")
        else:
            conn.transport.write(b"%bcontent-length: %d\r\n\r\n%b" % (head, len(body), body))
        try:
            await future
        except BaseException:
            response.release()  # not answered: the connection cannot be reused
            raise
        return response

    def _head(self, method: str, headers: Mapping[str, str]) -> bytes:
        lines = [f"{method} {self.target} HTTP/1.1"]
        if not any(name.lower() == "host" for name in headers):
            lines.append(f"host: {self.authority}")
        for name, value in headers.items():
            if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
                raise UpstreamError("unavailable", f"upstream {self.name}: the header {name!r} cannot be sent "
                                                   "(not a header name, or a line break in its value)")
            if name.lower() not in _DROPPED:
                lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n").encode("utf-8")

    def _reuse(self) -> _Conn | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.stale() or conn.loop.time() - conn.idle_since > self.keepalive:
                conn.close()
                continue
            return conn
        return None

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                while len(self._open) + self._connecting >= self.limit:
                    waiter = loop.create_future()
                    self._waiters.append(waiter)
                    try:
                        await waiter
                    finally:
                        if waiter in self._waiters:
                            self._waiters.remove(waiter)
                    conn = self._reuse()
                    if conn is not None:
                        return conn
                self._connecting += 1
                try:
                    sock = await self._sock_connect(loop)
                    try:
                        _, conn = await loop.create_connection(lambda: _Conn(self, loop), sock=sock, ssl=self.ssl,
                                                               server_hostname=self.host if self.ssl else None)
                    except BaseException:
                        sock.close()
                        raise
                finally:
                    self._connecting -= 1
                    self._wake_one()
        except TimeoutError:
            raise UpstreamError("timeout", f"upstream {self.name} did not answer: connecting timed out") from None
        except OSError as exc:
            raise UpstreamError("unavailable", f"upstream {self.name} is unreachable: {type(exc).__name__}") from None
        self._open.add(conn)
        return conn

    async def _sock_connect(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        """A connected socket to the first address that answers, each attempt limited to SOCK_CONNECT_SECONDS."""
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        error: Exception = OSError(f"no address for {self.host}")
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(SOCK_CONNECT_SECONDS):
                    await loop.sock_connect(sock, address)
            except (OSError, TimeoutError) as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            if family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        raise error

    def _put(self, conn: _Conn) -> None:
        conn.response = None
        if conn.closed:
            return
        conn.resume()  # its answer may have ended while reading was paused
        conn.idle_since = conn.loop.time()
        self._idle.append(conn)
        if self._sweeper is None:
            self._sweeper = conn.loop.call_at(conn.idle_since + self.keepalive, self._sweep)
        self._wake_one()

    def _sweep(self) -> None:
        """Close the connections idle longer than `keepalive`; come back for the next to expire."""
        self._sweeper = None
        idle = self._idle
        if not idle:
            return
        loop = idle[0].loop
        now = loop.time()
        while idle and now - idle[0].idle_since >= self.keepalive:
            idle.pop(0).close()
        if idle:
            self._sweeper = loop.call_at(idle[0].idle_since + self.keepalive, self._sweep)

    def _lost(self, conn: _Conn) -> None:
        if conn in self._open:
            self._open.discard(conn)
            if conn in self._idle:
                self._idle.remove(conn)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        """Close every connection (an answer being read fails as broken off); later requests open new ones."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
