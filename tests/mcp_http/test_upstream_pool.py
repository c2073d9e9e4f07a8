"""The /mcp upstream client keeps its keep-alive connection when an upstream answers with an event
stream (the SDK's default) and ends that stream a moment after the answer: the rest of an answered
stream is read in the background, so the connection goes back to the pool instead of being closed
(one new TCP connection per call otherwise), and the answer is not held up meanwhile.

The upstream is a real HTTP/1.1 server on a loopback socket that answers every POST with one SSE
message and ends the chunked stream `TAIL` seconds later, and counts the connections it accepts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.transports.upstreams.mcp_http import McpHttpUpstream

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
