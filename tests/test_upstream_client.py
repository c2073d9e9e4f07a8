"""The /mcp upstream HTTP/1.1 client (gateway/transports/upstreams/http1.py) against real servers on
loopback sockets: keep-alive reuse counted by the server, idle connections dropped, `Connection:
close` and HTTP/1.0 honoured, chunked and streamed bodies, backpressure, every way an upstream can
fail (reset mid-body, malformed answer, closing before answering, closing while idle, a connect that
hangs), https with a self-signed certificate, and what it never does (retry a POST, follow a
redirect, send Accept-Encoding or a User-Agent, decode a Content-Encoding).

Most servers are plain asyncio servers writing the bytes each case needs; one is uvicorn.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.transports.upstreams.http1 import HttpPool
from gateway.transports.upstreams.mcp_http import McpHttpUpstream
from gateway.transports.upstreams.replies import UpstreamError

DEADLINE = 30.0
JSON = b'{"jsonrpc":"2.0","id":1,"result":{}}'
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Seen"], Awaitable[None]]


class Seen:
    """What a test server saw: connections accepted, request heads, connections the client closed."""

    def __init__(self) -> None:
        self.accepted = 0
        self.heads: list[bytes] = []
        self.client_closed = 0
        self.open = 0
        self.most_open = 0


async def read_request(reader: asyncio.StreamReader, seen: Seen) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    seen.heads.append(head)
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    return await reader.readexactly(length)


def json_answer(body: bytes = JSON, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (b"HTTP/%b 200 OK\r\ncontent-type: application/json\r\n%bcontent-length: %d\r\n\r\n%b"
            % (version, extra, len(body), body))


async def answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
    """Answer every request on the connection with a small JSON body."""
    while True:
        await read_request(reader, seen)
        writer.write(json_answer())
        await writer.drain()


@asynccontextmanager
async def server(handler: Handler, *, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[tuple[str, Seen]]:
    seen = Seen()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.accepted += 1
        seen.open += 1
        seen.most_open = max(seen.most_open, seen.open)
        try:
            await handler(reader, writer, seen)
        except (asyncio.IncompleteReadError, ConnectionError):
            seen.client_closed += 1
        finally:
            seen.open -= 1
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ssl_context)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if ssl_context else 'http'}://localhost:{port}/mcp", seen
    finally:
        srv.close()


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


async def post(pool: HttpPool, body: bytes = b"{}", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    response = await pool.request("POST", headers if headers is not None else HEADERS, body)
    try:
        return response.status, response.headers, await response.read()
    finally:
        response.release()


async def posts(url: str, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """`count` POSTs one after the other through one pool, closed after."""
    pool = HttpPool("t", url)
    try:
        return [await post(pool) for _ in range(count)]
    finally:
        pool.close()


async def refused(upstream: McpHttpUpstream) -> UpstreamError:
    """The error one POST through `upstream` raises (closed after)."""
    try:
        with pytest.raises(UpstreamError) as caught:
            async with upstream.post(b"{}", HEADERS):
                pass
    finally:
        await upstream.aclose()
    return caught.value


# ---- the pool --------------------------------------------------------------------------------


async def test_one_keep_alive_connection_serves_consecutive_calls() -> None:
    async with server(answering) as (url, seen):
        pool = HttpPool("t", url)
        try:
            for _ in range(5):
                assert await post(pool) == (200, {"content-type": "application/json", "content-length": str(len(JSON))}, JSON)
        finally:
            pool.close()
    assert seen.accepted == 1, f"{seen.accepted} connections for 5 calls"


async def test_the_request_is_what_it_was_given_and_nothing_more() -> None:
    async with server(answering) as (url, seen):
        pool = HttpPool("t", url)
        try:
            await post(pool, b'{"a":1}', {**HEADERS, "Accept-Encoding": "gzip", "x-extra": "1"})
        finally:
            pool.close()
    lines = seen.heads[0].decode().split("\r\n")
    assert lines[0] == "POST /mcp HTTP/1.1"
    names = [line.split(":", 1)[0].lower() for line in lines[1:] if line]
    assert names == ["host", "accept", "content-type", "x-extra", "content-length"], names  # no UA, no Accept-Encoding


@pytest.mark.parametrize("name, value", [("x-a", "1\r\nx-injected: 1"), ("x-a", "1\nx-injected: 1"), ("x-a", "1\x00"),
                                         ("x a", "1"), ("x-a:b", "1")])
async def test_a_header_that_could_split_the_request_is_refused_before_anything_is_sent(name: str, value: str) -> None:
    async with server(answering) as (url, seen):
        pool = HttpPool("t", url)
        try:
            with pytest.raises(UpstreamError) as caught:
                await post(pool, b"{}", {**HEADERS, name: value})
            assert caught.value.kind == "unavailable" and "upstream t" in caught.value.message
            assert await post(pool) == (200, {"content-type": "application/json", "content-length": str(len(JSON))}, JSON)
        finally:
            pool.close()
    assert len(seen.heads) == 1 and b"injected" not in seen.heads[0]


async def test_a_request_head_carries_a_large_header_value_whole() -> None:
    """A head carrying a large value (an `Mcp-Param-*` header of a big argument) is sent whole, each time."""
    async with server(answering) as (url, seen):
        pool = HttpPool("t", url)
        try:
            big = {**HEADERS, "mcp-param-text": "x" * 10_000}
            for headers in (HEADERS, big, big):
                await post(pool, b"{}", headers)
            assert seen.heads[1] == seen.heads[2] and b"x" * 10_000 in seen.heads[2]
        finally:
            pool.close()


async def test_an_idle_connection_is_dropped_after_the_keep_alive_time() -> None:
    async with server(answering) as (url, seen):
        pool = HttpPool("t", url, keepalive=0.3)
        try:
            await post(pool)
            released = time.monotonic()
            await until(lambda: seen.client_closed == 1, "the idle connection is closed by the client")
            assert time.monotonic() - released >= 0.25
            assert pool.connections == 0
            await post(pool)
            assert seen.accepted == 2
        finally:
            pool.close()


@pytest.mark.parametrize("answer", [json_answer(extra=b"connection: close\r\n"), json_answer(extra=b"connection: keep-alive\r\n", version=b"1.0"),
                                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + JSON],
                         ids=["connection-close", "http-1.0", "read-until-close"])
async def test_an_answer_that_ends_its_connection_is_not_reused(answer: bytes) -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)
        writer.write(answer)
        await writer.drain()
        if b"content-length" not in answer:
            return  # the body ends with the connection
        await read_request(reader, seen)  # a second request on this connection gets a 500
        writer.write(b"HTTP/1.1 500 Reused\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    async with server(once) as (url, seen):
        answers = await posts(url, 2)
    assert [(status, body) for status, _, body in answers] == [(200, JSON)] * 2
    assert seen.accepted == 2


async def test_a_connection_the_peer_closed_while_idle_is_never_written_to() -> None:
    """The peer closes between two calls while the client's loop is blocked (it has not seen the
    close): the second POST must go on a new connection, not be written to the dead one and fail."""
    go, done = threading.Event(), threading.Event()
    accepted: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            accepted.append(conn)
            data = b""
            while b"\r\n\r\n{}" not in data:
                data += conn.recv(65536)
            conn.sendall(json_answer())
            if len(accepted) == 1:
                go.wait(DEADLINE)
                conn.close()
                done.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    pool = HttpPool("t", f"http://127.0.0.1:{listener.getsockname()[1]}/mcp")
    try:
        assert (await post(pool))[2] == JSON
        go.set()
        assert done.wait(DEADLINE)  # blocks the loop on purpose: it cannot notice the close
        probe = select.poll()
        probe.register(pool._idle[0].transport.get_extra_info("socket").fileno(), select.POLLIN)
        assert probe.poll(DEADLINE * 1000), "the close never reached the client's socket"
        assert (await post(pool))[2] == JSON
        assert len(accepted) == 2
    finally:
        pool.close()
        thread.join(DEADLINE)
        listener.close()
        for conn in accepted:
            conn.close()


async def test_at_most_limit_connections_are_open() -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        while True:
            await read_request(reader, seen)
            await release.wait()
            writer.write(json_answer())
            await writer.drain()

    async with server(slow) as (url, seen):
        pool = HttpPool("t", url, limit=2)
        try:
            calls = [asyncio.ensure_future(post(pool)) for _ in range(3)]
            await until(lambda: len(seen.heads) == 2, "two requests arrive")
            release.set()
            results = await asyncio.gather(*calls)
        finally:
            pool.close()
    assert [r[2] for r in results] == [JSON] * 3
    assert seen.most_open == 2 and seen.accepted == 2


# ---- bodies ----------------------------------------------------------------------------------


async def test_a_chunked_body_is_dechunked() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        while True:
            await read_request(reader, seen)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                         + b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in (JSON[:10], JSON[10:])) + b"0\r\n\r\n")
            await writer.drain()

    async with server(chunked) as (url, seen):
        pool = HttpPool("t", url)
        try:
            assert (await post(pool))[2] == JSON
            assert (await post(pool))[2] == JSON
        finally:
            pool.close()
    assert seen.accepted == 1  # a chunked body read to its end leaves the connection reusable


async def test_an_event_stream_arrives_before_its_body_ends() -> None:
    first_read = asyncio.Event()

    async def sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)
        event = b"data: " + JSON + b"\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                     b"mcp-session-id: abc  \r\n\r\n%x\r\n%b\r\n" % (len(event), event))
        await writer.drain()
        await first_read.wait()  # the stream stays open until the client has the first event
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(sse) as (url, _seen):
        upstream = McpHttpUpstream("t", url)
        try:
            async with upstream.post(b"{}", HEADERS) as reply:
                assert reply.sse and reply.session_id == "abc"  # trailing whitespace is not part of a value
                messages = reply.messages()
                assert await asyncio.wait_for(messages.__anext__(), DEADLINE) == JSON
                first_read.set()
                assert [m async for m in messages] == []
        finally:
            await upstream.aclose()


async def test_reading_pauses_while_the_reader_lags_behind() -> None:
    size = 8 * 1024 * 1024
    sent = asyncio.Event()

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()
        sent.set()
        await answering(reader, writer, seen)

    async with server(big) as (url, seen):
        pool = HttpPool("t", url)
        try:
            response = await pool.request("POST", HEADERS, b"{}")
            connection = response._conn
            await until(lambda: connection.paused, "the client pauses reading")
            assert not sent.is_set(), "the whole body was taken in while nobody read it"
            total = 0
            while chunk := await response.chunk():
                total += len(chunk)
            assert total == size and sent.is_set()
            response.release()
            assert (await post(pool))[2] == JSON  # the same connection, reading again
        finally:
            pool.close()
    assert seen.accepted == 1


async def test_a_body_read_whole_is_not_paused() -> None:
    size = 8 * 1024 * 1024

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        while True:
            await read_request(reader, seen)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + b"x" * size)
            await writer.drain()

    async with server(big) as (url, seen):
        pool = HttpPool("t", url)
        try:
            for _ in range(2):
                status, _headers, body = await asyncio.wait_for(post(pool), DEADLINE)
                assert status == 200 and len(body) == size
        finally:
            pool.close()
    assert seen.accepted == 1


async def test_an_interim_answer_is_skipped() -> None:
    async def early_hints(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        while True:
            await read_request(reader, seen)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n" + json_answer())
            await writer.drain()

    async with server(early_hints) as (url, seen):
        answers = await posts(url, 2)
    assert [(status, body) for status, _, body in answers] == [(200, JSON)] * 2
    assert all("link" not in headers for _, headers, _ in answers)
    assert seen.accepted == 1


# ---- failures --------------------------------------------------------------------------------


def reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize(("answer", "words"), [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789", "broke off its answer"),
    (b"HTTQ/1.1 2x0 OK\r\n\r\n", "sent a malformed answer"),
    (b"", "closed the connection before answering"),
    (b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc", "Content-Encoding gzip"),
], ids=["reset-mid-body", "malformed-status-line", "closed-before-answering", "content-encoding"])
async def test_every_failure_is_an_upstream_error_naming_the_upstream(answer: bytes, words: str) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)
        writer.write(answer)
        await writer.drain()
        reset(writer)

    async with server(broken) as (url, seen):
        error = await refused(McpHttpUpstream("flaky", url))
    assert error.kind == "unavailable"
    assert "upstream flaky" in error.message and words in error.message, error.message
    assert len(seen.heads) == 1, "a POST was sent twice"


async def test_an_unreachable_upstream_is_an_upstream_error() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    error = await refused(McpHttpUpstream("gone", f"http://127.0.0.1:{port}/mcp"))
    assert error.kind == "unavailable" and "upstream gone is unreachable" in error.message


async def test_a_redirect_is_not_followed() -> None:
    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        while True:
            await read_request(reader, seen)
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()

    async with server(redirect) as (url, seen):
        pool = HttpPool("t", url)
        try:
            status, headers, _ = await post(pool)
        finally:
            pool.close()
    assert status == 307 and headers["location"] == "/elsewhere" and len(seen.heads) == 1


async def test_a_cancelled_request_closes_its_connection() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
        await read_request(reader, seen)
        await reader.read()  # never answers; returns when the client closes

    async with server(silent) as (url, seen):
        pool = HttpPool("t", url)
        try:
            call = asyncio.ensure_future(post(pool))
            await until(lambda: len(seen.heads) == 1, "the request arrives")
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await until(lambda: seen.open == 0, "the server sees the connection closed")
            assert pool.connections == 0
        finally:
            pool.close()


# ---- https -----------------------------------------------------------------------------------


def self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for localhost, and a client context trusting it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert_file, key_file)
    client_context = ssl.create_default_context(cafile=str(cert_file))
    return server_context, client_context


async def test_https_upstream_with_a_trusted_certificate_keeps_its_connection(tmp_path: Path) -> None:
    server_context, client_context = self_signed(tmp_path)
    async with server(answering, ssl_context=server_context) as (url, seen):
        upstream = McpHttpUpstream("tls", url, ssl_context=client_context)
        try:
            for _ in range(3):
                async with upstream.post(b"{}", HEADERS) as reply:
                    assert (reply.status, reply.body) == (200, JSON)
        finally:
            await upstream.aclose()
    assert seen.accepted == 1


async def test_https_upstream_with_an_untrusted_certificate_is_refused(tmp_path: Path) -> None:
    server_context, _ = self_signed(tmp_path)
    async with server(answering, ssl_context=server_context) as (url, seen):
        error = await refused(McpHttpUpstream("tls", url))  # the default context: the system's trust store
    assert error.kind == "unavailable" and "SSLCertVerificationError" in error.message
    assert seen.heads == []


# ---- a real server ---------------------------------------------------------------------------


async def test_uvicorn_keep_alive_is_reused_and_streams_pass_through() -> None:
    connections: set[object] = set()

    async def app(scope: dict, receive: Callable, send: Callable) -> None:  # type: ignore[type-arg]
        if scope["type"] != "http":
            return
        connections.add(scope["client"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        answer = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"n": request["id"]}}).encode()
        await send({"type": "http.response.body", "body": b"data: " + answer + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="error", lifespan="off", http="httptools")
    uv = uvicorn.Server(config)
    serving = asyncio.ensure_future(uv.serve(sockets=[sock]))
    await until(lambda: uv.started, "uvicorn starts")
    upstream = McpHttpUpstream("uv", f"http://127.0.0.1:{sock.getsockname()[1]}/mcp")
    try:
        for i in range(4):
            body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call"}).encode()
            async with upstream.post(body, HEADERS, expect_id=i) as reply:
                assert reply.sse
                assert json.loads(await reply.messages().__anext__())["result"] == {"n": i}
            await until(lambda: upstream.draining == 0, "the stream's end is read")
    finally:
        await upstream.aclose()
        uv.should_exit = True
        await serving
        sock.close()
    assert len(connections) == 1, f"{len(connections)} connections for 4 calls"


async def test_a_connect_that_hangs_is_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener whose accept queue is full drops new SYNs, so connecting hangs: each attempt is
    cut at SOCK_CONNECT_SECONDS (10 s; shortened here) and the call fails as a timeout."""
    from gateway.transports.upstreams import http1

    monkeypatch.setattr(http1, "SOCK_CONNECT_SECONDS", 0.3)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    try:
        for _ in range(8):  # fill the accept queue (never accepted)
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
            fillers.append(filler)
        started = time.monotonic()
        error = await refused(McpHttpUpstream("stuck", f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"))
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert error.kind == "timeout" and "upstream stuck did not answer" in error.message, error.message
    assert 0.25 <= time.monotonic() - started < DEADLINE
