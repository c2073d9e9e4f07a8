"""A client for an upstream MCP server over Streamable HTTP (aiohttp, streaming, pooled keep-alive).

One `McpHttpUpstream` per configured `mcp_http` upstream. It does HTTP only: it sends the bytes
and headers it is given and hands back an `UpstreamReply` whose SSE messages are yielded as
they arrive (never buffered). SSE `id:`/`retry:` fields stay here: when an upstream closes a
POST's event stream before the answer came (2025-11-25 polling), this client resumes it itself
(GET + `Last-Event-ID`), after telling the caller (`UpstreamReply.on_pause`) so the gateway can
close its own client's stream the same way. The gateway's clients never see an upstream event id
and can never ask the upstream to replay an event the gateway did not govern (the replay hole,
notes §2.4); the gateway numbers and replays its own events (`mcp_events`).

aiohttp, not httpx: its C parser and connection pool cost about a third of httpx's CPU per
request, and every governed call makes one (bench/README.md, mcp_http). One session per upstream,
opened on first use (it belongs to the running event loop), reused across calls.

Failures leave as `UpstreamError` (`timeout` / `unavailable`), never as aiohttp exceptions.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import aiohttp
import anyio
import structlog

from gateway.mcp import jsonrpc
from gateway.transports.upstreams.replies import UpstreamError, UpstreamReply

log = structlog.get_logger()

MAX_RESUMES = 5
#: How long, and for how many bytes, the rest of an answered event stream is read in the background
#: so its connection goes back to the pool (an upstream closes the stream right after the answer).
DRAIN_SECONDS = 2.0
DRAIN_BYTES = 65_536


KEEPALIVE_SECONDS = 2.0
"""How long an idle pooled upstream connection is kept (see `McpHttpUpstream._client`)."""


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
    """An MCP server behind Streamable HTTP, shared by every client session the gateway serves."""

    kind = "mcp_http"

    def __init__(
        self,
        id: str,
        url: str,
        *,
        prefix: str = "",
        headers: Mapping[str, str] | None = None,
        forward_host: bool = False,
    ) -> None:
        self.id = id
        self.url = url
        self.prefix = prefix
        self.forward_host = forward_host
        self.static_headers = {k.lower(): v for k, v in (headers or {}).items()}
        self._session: aiohttp.ClientSession | None = None
        self._draining: set[asyncio.Task[None]] = set()

    def _client(self) -> aiohttp.ClientSession:
        """The pooled session (keep-alive, up to 512 connections, no cookies kept), opened on first use.

        An idle connection is dropped after KEEPALIVE_SECONDS, well inside the idle timeouts of
        common servers (uvicorn's and Node's are 5 s; aiohttp's own default is 15 s): reusing a
        connection the upstream is closing fails the POST, and a POST is never retried.
        """
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=None, connect=30.0, sock_connect=10.0, sock_read=None)
            connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, keepalive_timeout=KEEPALIVE_SECONDS)
            # No cookie jar: a cookie the upstream sets while answering one client would otherwise
            # go out with every other client's requests through this shared session.
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",),
                                                  cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def aclose(self) -> None:
        for task in list(self._draining):
            task.cancel()
        if self._draining:
            await asyncio.gather(*self._draining, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        out = dict(headers)
        out.update(self.static_headers)
        return out

    @contextlib.asynccontextmanager
    async def post(self, body: bytes, headers: Mapping[str, str], *, expect_id: jsonrpc.RpcId | None = None) -> AsyncIterator[UpstreamReply]:
        """POST one message; with `expect_id`, an event stream closed early is resumed until that answer."""
        async with self._send("POST", body, headers) as (response, reply):
            if reply.sse:
                reply._events = self._stream(response, headers, expect_id, reply)
            yield reply

    @contextlib.asynccontextmanager
    async def get(self, headers: Mapping[str, str]) -> AsyncIterator[UpstreamReply]:
        """Open the standalone GET stream (never with `Last-Event-ID`: the gateway does not resume it)."""
        async with self._send("GET", None, headers) as (response, reply):
            if reply.sse:
                reply._events = self._stream(response, headers, None, reply)
            yield reply

    async def delete(self, headers: Mapping[str, str]) -> UpstreamReply:
        async with self._send("DELETE", None, headers) as (_response, reply):
            return reply

    async def _request(self, method: str, body: bytes | None, headers: Mapping[str, str]) -> aiohttp.ClientResponse:
        try:
            return await self._client().request(method, self.url, data=body, headers=self._headers(headers),
                                                allow_redirects=False)
        except TimeoutError as exc:  # aiohttp's timeouts (ServerTimeoutError, ConnectionTimeoutError) are TimeoutErrors
            raise UpstreamError("timeout", f"upstream {self.id} did not answer: {type(exc).__name__}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("unavailable", f"upstream {self.id} is unreachable: {type(exc).__name__}") from None

    @contextlib.asynccontextmanager
    async def _send(self, method: str, body: bytes | None, headers: Mapping[str, str]) -> AsyncIterator[tuple[aiohttp.ClientResponse, UpstreamReply]]:
        response = await self._request(method, body, headers)
        try:
            ctype = response.headers.get("content-type", "")
            sse = response.status == 200 and ctype.startswith("text/event-stream")
            reply = UpstreamReply(
                status=response.status,
                headers={k.lower(): v for k, v in response.headers.items()},
                sse=sse,
                session_id=response.headers.get("mcp-session-id"),
            )
            if not sse:
                try:
                    reply.body = await response.read()
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    raise UpstreamError("unavailable", f"upstream {self.id} broke off its answer: {type(exc).__name__}") from None
            yield response, reply
        finally:
            if reply.answered and not response.content.is_eof():
                self._finish_later(response)
            else:
                response.release()  # back to the pool when read to the end, else the connection is closed

    @property
    def draining(self) -> int:
        """How many answered event streams are still being read to their end."""
        return len(self._draining)

    def _finish_later(self, response: aiohttp.ClientResponse) -> None:
        """Read the end of an answered event stream in the background, then release it: read to its
        end, the connection goes back to the pool instead of being closed (a new TCP connection per
        call otherwise). The answer is not held up; a stream that does not end soon is closed."""
        async def drain() -> None:
            left = DRAIN_BYTES
            try:
                with anyio.move_on_after(DRAIN_SECONDS):
                    while left > 0 and (chunk := await response.content.readany()):
                        left -= len(chunk)
            except (aiohttp.ClientError, OSError):
                pass
            finally:
                response.release()

        task = asyncio.get_running_loop().create_task(drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _stream(self, response: aiohttp.ClientResponse, headers: Mapping[str, str], expect_id: jsonrpc.RpcId | None,
                      reply: UpstreamReply) -> AsyncIterator[bytes]:
        last_id: str | None = None
        retry_ms = 1000
        answered = expect_id is None
        current: aiohttp.ClientResponse | None = response
        resumes = 0
        try:
            while True:
                assert current is not None
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
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    clean = False
                    if answered or last_id is None:
                        raise UpstreamError("unavailable", f"upstream {self.id} broke off its event stream: {type(exc).__name__}") from None
                if answered or last_id is None or resumes >= MAX_RESUMES:
                    if not answered:
                        raise UpstreamError("unavailable", f"upstream {self.id} closed the event stream before answering")
                    return
                resumes += 1
                if resumes == 1 and clean and reply.on_pause is not None:
                    await reply.on_pause()
                await anyio.sleep(min(retry_ms, 5000) / 1000)
                if current is not response:
                    current.release()
                resume_headers = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "mcp-method", "mcp-name")}
                resume_headers["last-event-id"] = last_id
                resume_headers["accept"] = "text/event-stream"
                try:
                    current = await self._request("GET", None, resume_headers)
                except UpstreamError as exc:
                    raise UpstreamError("unavailable", f"upstream {self.id}: resuming its event stream failed: {exc.message}") from None
                log.debug("upstream.stream_resumed", upstream=self.id, status=current.status)
                if current.status != 200:
                    raise UpstreamError("unavailable", f"upstream {self.id}: resuming its event stream got HTTP {current.status}")
        finally:
            if current is not None and current is not response:
                current.release()


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The body's lines as text, split at CRLF, LF or CR (each ends an SSE line), decoded as UTF-8."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    buf = ""
    async for chunk in response.content.iter_any():
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
