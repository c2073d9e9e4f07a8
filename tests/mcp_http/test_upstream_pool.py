"""The /mcp upstream client keeps its keep-alive connection when an upstream answers with an event
stream (the SDK's default) and ends that stream a moment after the answer: the rest of an answered
stream is read in the background, so the connection goes back to the pool instead of being closed
(one new TCP connection per call otherwise), and the answer is not held up meanwhile.

The upstream is a real HTTP/1.1 server on a loopback socket that answers every POST with one SSE
message and ends the chunked stream `TAIL` seconds later, and counts the connections it accepts.

And a call whose client hangs up gives its upstream connection back at once (closed: its answer
was never read), watched by a TCP proxy between the gateway and the toy server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from gateway.transports.upstreams.mcp_http import McpHttpUpstream
from tests.mcp_http.conftest import serve_gateway, upstream, write_profile
from tests.mcp_http.raw import Raw

CALLS = 3
TAIL = 1.0  # seconds between the answer and the end of its stream
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@asynccontextmanager
async def late_ending_sse_server() -> AsyncIterator[tuple[str, list[int]]]:
    """Yields the server's URL and the list of connections it accepted (one entry each)."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = json.loads(await reader.readexactly(length))
                answer = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"echo": request["params"]}})
                event = f"event: message\r\ndata: {answer}\r\n\r\n".encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                             + b"%x\r\n" % len(event) + event + b"\r\n")
                await writer.drain()
                await asyncio.sleep(TAIL)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp", accepted
    finally:
        server.close()


async def test_answered_event_streams_leave_their_connection_in_the_pool() -> None:
    async with late_ending_sse_server() as (url, accepted):
        upstream = McpHttpUpstream("late", url)
        try:
            for i in range(CALLS):
                started = time.monotonic()
                body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"n": i}}).encode()
                async with upstream.post(body, HEADERS, expect_id=i) as reply:
                    assert reply.sse
                    answer = json.loads(await reply.messages().__anext__())
                assert answer == {"jsonrpc": "2.0", "id": i, "result": {"echo": {"n": i}}}
                assert time.monotonic() - started < TAIL, "the answer waited for the end of its stream"
                deadline = time.monotonic() + 30
                while upstream.draining and time.monotonic() < deadline:  # the stream's end is read in the background
                    await asyncio.sleep(0.01)
            assert len(accepted) == 1, f"{len(accepted)} connections for {CALLS} calls: answered streams were closed, not pooled"
        finally:
            await upstream.aclose()


@asynccontextmanager
async def watching_proxy(target: str) -> AsyncIterator[tuple[str, list[dict[str, object]]]]:
    """A TCP proxy in front of `target` (an http URL); yields its URL and one record per connection
    it carries: the bytes sent upstream so far (`up`) and whether the gateway closed it (`closed`)."""
    host, port = target.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    links: list[dict[str, object]] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: dict[str, object] | None) -> None:
        try:
            while data := await reader.read(65536):
                if link is not None:
                    link["up"] = bytes(link["up"]) + data  # type: ignore[arg-type]
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            if link is not None:
                link["closed"] = True
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link: dict[str, object] = {"up": b"", "closed": False}
        links.append(link)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer, link), pipe(up_reader, writer, None))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    path = "/" + target.split("//", 1)[1].split("/", 1)[1]
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{path}", links
    finally:
        server.close()


async def test_a_client_that_hangs_up_releases_its_upstream_connection(toy_url: str, tmp_path: Path) -> None:
    """A client disconnecting mid-call cancels the forwarder, which closes the upstream connection
    the call was waiting on at once (its answer is never read to the end, so it cannot be pooled):
    well before the backend timeout (60 s) that would otherwise end it."""
    policy = write_profile(tmp_path / "policy", backend_timeout_seconds=60.0)
    async with watching_proxy(toy_url) as (proxied, links):
        async with serve_gateway(tmp_path, [upstream(proxied)], policy) as gw:
            async with Raw(gw.url) as c:
                await c.initialize()
                pending = asyncio.ensure_future(c.call("hang"))
                deadline = time.monotonic() + 30
                while not (carrying := [link for link in links if b'"hang"' in bytes(link["up"])]):  # type: ignore[arg-type]
                    assert time.monotonic() < deadline and not pending.done(), "the hang call never reached the upstream"
                    await asyncio.sleep(0.02)
                assert carrying[0]["closed"] is False
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
                while not carrying[0]["closed"]:
                    assert time.monotonic() < deadline, "the cancelled call's upstream connection stayed open"
                    await asyncio.sleep(0.02)
