"""A client for an upstream MCP server over Streamable HTTP (streaming, pooled keep-alive).

One `McpHttpUpstream` per configured `mcp_http` upstream. It does HTTP only: it sends the bytes
and headers it is given and hands back an `UpstreamReply` whose SSE messages are yielded as
they arrive (never buffered). SSE `id:`/`retry:` fields stay here: when an upstream closes a
POST's event stream before the answer came (2025-11-25 polling), this client resumes it itself
(GET + `Last-Event-ID`), after telling the caller (`UpstreamReply.on_pause`) so the gateway can
close its own client's stream the same way. The gateway's clients never see an upstream event id
and can never ask the upstream to replay an event the gateway did not govern (the replay hole,
notes §2.4); the gateway numbers and replays its own events (`mcp_events`).

The HTTP itself is `http1.HttpPool`: one pool of keep-alive connections per upstream, shared by
every call (no cookies, no redirects, no retries; see that module). Every governed call makes one
POST, so its cost per request is the gateway's (bench/README.md, mcp_http).

Failures leave as `UpstreamError` (`timeout` / `unavailable`), never as raw exceptions.
"""

from __future__ import annotations

import asyncio
import codecs
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType

import structlog

from gateway.mcp import jsonrpc
from gateway.transports.upstreams.http1 import KEEPALIVE_SECONDS, HttpPool, Response
from gateway.transports.upstreams.replies import UpstreamError, UpstreamReply

__all__ = ["DRAIN_BYTES", "DRAIN_SECONDS", "KEEPALIVE_SECONDS", "MAX_RESUMES", "McpHttpUpstream", "sse_events"]

log = structlog.get_logger()

MAX_RESUMES = 5
#: How long, and for how many bytes, the rest of an answered event stream is read in the background
#: so its connection goes back to the pool (an upstream closes the stream right after the answer).
DRAIN_SECONDS = 2.0
DRAIN_BYTES = 65_536


@dataclass(slots=True)
class _Event:
    id: str | None = None
    data: list[str] = field(default_factory=list)
    retry: int | None = None


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[_Event]:
    """Parse text/event-stream lines into events (only the fields MCP uses)."""
    event = _Event()
    async for line in lines:
        if line == "":
            if event.data or event.id is not None or event.retry is not None:
                yield event
            event = _Event()
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            event.data.append(value)
        elif name == "id":
            event.id = value
        elif name == "retry" and value.isdigit():
            event.retry = int(value)
    if event.data:
        yield event


class McpHttpUpstream:
    """An MCP server behind Streamable HTTP, shared by every client session the gateway serves.

    `ssl_context` replaces the default (system trust store) context for an https upstream."""

    kind = "mcp_http"

    def __init__(
        self,
        id: str,
        url: str,
        *,
        prefix: str = "",
        headers: Mapping[str, str] | None = None,
        forward_host: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.id = id
        self.url = url
        self.prefix = prefix
        self.forward_host = forward_host
        self.static_headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.pool = HttpPool(id, url, ssl_context=ssl_context)
        self._draining: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        for task in list(self._draining):
            task.cancel()
        if self._draining:
            await asyncio.gather(*self._draining, return_exceptions=True)
        self.pool.close()

    def _headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        if not self.static_headers:
            return headers
        out = dict(headers)
        out.update(self.static_headers)
        return out

    def post(self, body: bytes, headers: Mapping[str, str], *, expect_id: jsonrpc.RpcId | None = None) -> Exchange:
        """POST one message; with `expect_id`, an event stream closed early is resumed until that answer."""
        return Exchange(self, "POST", body, headers, expect_id)

    def get(self, headers: Mapping[str, str]) -> Exchange:
        """Open the standalone GET stream (never with `Last-Event-ID`: the gateway does not resume it)."""
        return Exchange(self, "GET", None, headers, None)

    async def delete(self, headers: Mapping[str, str]) -> UpstreamReply:
        async with Exchange(self, "DELETE", None, headers, None) as reply:
            return reply

    async def _request(self, method: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        return await self.pool.request(method, self._headers(headers), body)

    @property
    def draining(self) -> int:
        """How many answered event streams are still being read to their end."""
        return len(self._draining)

    def _finish_later(self, response: Response) -> None:
        """Read the end of an answered event stream in the background, then release it: read to its
        end, the connection goes back to the pool instead of being closed (a new TCP connection per
        call otherwise). The answer is not held up; a stream that does not end soon is closed."""
        async def drain() -> None:
            left = DRAIN_BYTES
            try:
                async with asyncio.timeout(DRAIN_SECONDS):
                    while left > 0 and (chunk := await response.chunk()):
                        left -= len(chunk)
            except (UpstreamError, TimeoutError):
                pass
            finally:
                response.release()

        task = asyncio.get_running_loop().create_task(drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)


class Exchange:
    """One request and its answer, as an async context manager yielding the `UpstreamReply`.

    Leaving it never waits (`close` is synchronous), so a caller being cancelled cannot be stopped
    half-way: the connection is back in the pool (answer read to its end), left to a background
    drain (an answered event stream), or closed."""

    __slots__ = ("upstream", "method", "body", "headers", "expect_id", "response", "reply", "resumed")

    def __init__(self, upstream: McpHttpUpstream, method: str, body: bytes | None, headers: Mapping[str, str],
                 expect_id: jsonrpc.RpcId | None) -> None:
        self.upstream, self.method, self.body, self.headers, self.expect_id = upstream, method, body, headers, expect_id
        self.response: Response | None = None
        self.reply: UpstreamReply | None = None
        self.resumed: Response | None = None  # the current resumed (GET) stream, if any

    async def __aenter__(self) -> UpstreamReply:
        response = self.response = await self.upstream._request(self.method, self.body, self.headers)
        headers = response.headers
        sse = response.status == 200 and headers.get("content-type", "").startswith("text/event-stream")
        reply = self.reply = UpstreamReply(status=response.status, headers=headers, sse=sse,
                                           session_id=headers.get("mcp-session-id"))
        if sse:
            reply._events = self._stream(response, reply)
        else:
            try:
                reply.body = await response.read()
            except BaseException:
                response.release()
                raise
        return reply

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection(s): see the class docstring."""
        response, reply = self.response, self.reply
        if self.resumed is not None:
            self.resumed.release()
            self.resumed = None
        if response is None:
            return
        self.response = None
        if reply is not None and reply.answered and not response.complete:
            self.upstream._finish_later(response)
        else:
            response.release()

    async def _stream(self, response: Response, reply: UpstreamReply) -> AsyncIterator[bytes]:
        upstream, expect_id = self.upstream, self.expect_id
        last_id: str | None = None
        retry_ms = 1000
        answered = expect_id is None
        current = response
        resumes = 0
        try:
            while True:
                clean = True
                try:
                    async for event in sse_events(_lines(current)):
                        if event.id:
                            last_id = event.id
                        if event.retry is not None:
                            retry_ms = event.retry
                        if not event.data or not "".join(event.data).strip():
                            continue  # a priming event: it only carries an id
                        data = "\n".join(event.data).encode("utf-8")
                        if not answered and _is_answer_to(data, expect_id):
                            answered = True
                            reply.answered = current is response
                        yield data
                except UpstreamError:
                    clean = False
                    if answered or last_id is None:
                        raise UpstreamError("unavailable", f"upstream {upstream.id} broke off its event stream") from None
                if answered or last_id is None or resumes >= MAX_RESUMES:
                    if not answered:
                        raise UpstreamError("unavailable", f"upstream {upstream.id} closed the event stream before answering")
                    return
                resumes += 1
                if resumes == 1 and clean and reply.on_pause is not None:
                    await reply.on_pause()
                await asyncio.sleep(min(retry_ms, 5000) / 1000)
                if self.resumed is not None:
                    self.resumed.release()
                    self.resumed = None
                resume_headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-type", "mcp-method", "mcp-name")}
                resume_headers["last-event-id"] = last_id
                resume_headers["accept"] = "text/event-stream"
                try:
                    current = self.resumed = await upstream._request("GET", None, resume_headers)
                except UpstreamError as exc:
                    raise UpstreamError("unavailable", f"upstream {upstream.id}: resuming its event stream failed: {exc.message}") from None
                log.debug("upstream.stream_resumed", upstream=upstream.id, status=current.status)
                if current.status != 200:
                    raise UpstreamError("unavailable", f"upstream {upstream.id}: resuming its event stream got HTTP {current.status}")
        finally:
            if self.resumed is not None:
                self.resumed.release()
                self.resumed = None


async def _lines(response: Response) -> AsyncIterator[str]:
    """The body's lines as text, split at CRLF, LF or CR (each ends an SSE line), decoded as UTF-8."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    buf = ""
    while chunk := await response.chunk():
        buf += decode(chunk)
        held = buf.endswith("\r")  # may be the first half of a CRLF split across chunks
        parts = (buf[:-1] if held else buf).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        buf = parts.pop() + ("\r" if held else "")
        for line in parts:
            yield line
    buf += decode(b"", final=True)
    if buf:
        yield buf[:-1] if buf.endswith("\r") else buf


def _is_answer_to(data: bytes, rpc_id: jsonrpc.RpcId | None) -> bool:
    try:
        msg = jsonrpc.loads(data)
    except ValueError:
        return False
    return isinstance(msg, dict) and ("result" in msg or "error" in msg) and msg.get("id") == rpc_id and type(msg.get("id")) is type(rpc_id)
