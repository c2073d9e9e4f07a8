"""`dharma serve`'s HTTP protocol (gateway.transports.http_protocol): a fixed-length response leaves
in one write, and everything else behaves as uvicorn's own httptools protocol (streams, HEAD,
keep-alive, a failing app)."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import anyio
import pytest

from gateway.cli.serve import http_protocol
from gateway.transports.http_protocol import CYCLE_STATE, WHOLE_STATE, OneWriteHttpToolsProtocol, WatchedEvent, respond
from tests.mcp_http.conftest import serve_asgi

class _Counting:
    """A real transport, counting its writes."""

    writes: list[bytes] = []

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        _Counting.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _CountingProtocol(OneWriteHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Counting(transport))  # type: ignore[arg-type]




async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/json":
        body = b'{"ok":true}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await scope["state"]["go"].wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/fail":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        raise RuntimeError("the app failed after its head")


async def _connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to the server at `base` (http://host:port)."""
    host, port = base.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _read_until(reader: asyncio.StreamReader, marker: bytes, timeout: float = 30.0) -> bytes:
    async with asyncio.timeout(timeout):
        return await reader.readuntil(marker)


async def test_dharma_serve_uses_the_one_write_protocol() -> None:
    pytest.importorskip("httptools")
    assert http_protocol() is OneWriteHttpToolsProtocol


async def test_fixed_length_response_is_one_write_and_keep_alive_works() -> None:
    _Counting.writes = []
    async with serve_asgi(app, http=_CountingProtocol) as base:
        reader, writer = await _connect(base)
        try:
            for _ in range(3):  # one keep-alive connection, three requests
                writer.write(b"GET /json HTTP/1.1\r\nhost: x\r\n\r\n")
                head = await _read_until(reader, b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 ")
                assert b"content-length: 11" in head
                async with asyncio.timeout(30):
                    assert await reader.readexactly(11) == b'{"ok":true}'
        finally:
            writer.close()
    responses = [w for w in _Counting.writes if w.startswith(b"HTTP/1.1 ")]
    assert len(responses) == 3
    assert all(w.endswith(b'{"ok":true}') for w in responses), "head and body must leave in one write"
    assert len(_Counting.writes) == 3


async def test_streamed_head_is_not_held_and_head_request_completes() -> None:
    go = anyio.Event()

    async def with_state(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope["state"] = {"go": go}
        await app(scope, receive, send)

    # keep-alive longer than the reads' deadline: closing an idle connection would send a held head anyway
    async with serve_asgi(with_state, http=OneWriteHttpToolsProtocol, timeout_keep_alive=600) as base:
        reader, writer = await _connect(base)
        try:
            writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await _read_until(reader, b"\r\n\r\n")  # arrives while the app still waits for `go`
            assert b"transfer-encoding: chunked" in head
            assert not go.is_set()
            go.set()
            assert b"data: 1" in await _read_until(reader, b"0\r\n\r\n")
            writer.write(b"HEAD /json HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await _read_until(reader, b"\r\n\r\n")  # a HEAD answer has no body to wait for
            assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: 11" in head
        finally:
            writer.close()


async def test_app_failing_after_its_head_closes_the_connection() -> None:
    async with serve_asgi(app, http=OneWriteHttpToolsProtocol) as base:
        host, port = base.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=30)
        try:
            sock.sendall(b"GET /fail HTTP/1.1\r\nhost: x\r\n\r\n")
            got = b""
            while chunk := await anyio.to_thread.run_sync(sock.recv, 4096):
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"\r\n\r\n")  # the head, then the close
        finally:
            sock.close()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _get_json(base: str) -> None:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /json?q=1 HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await _read_until(reader, b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    finally:
        writer.close()


async def test_access_lines_are_built_only_when_the_access_log_writes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """At uvicorn's `warning` level (what `dharma serve` uses) a connection builds no access line;
    at `info` each response still gets its line, as uvicorn writes it."""
    pytest.importorskip("httptools")
    built: list[object] = []
    import uvicorn.protocols.http.httptools_impl as impl

    real = impl.get_client_addr
    monkeypatch.setattr(impl, "get_client_addr", lambda scope: built.append(scope) or real(scope))
    lines = _Lines()
    access = logging.getLogger("uvicorn.access")
    async with serve_asgi(app, http=OneWriteHttpToolsProtocol) as base:
        level = access.level
        access.addHandler(lines)
        try:
            await _get_json(base)
            assert built == [] and lines.lines == []
            access.setLevel(logging.INFO)  # a connection opened from now on writes its lines
            await _get_json(base)
        finally:
            access.removeHandler(lines)
            access.setLevel(level)
    assert len(built) == 1 and len(lines.lines) == 1 and '"GET /json?q=1 HTTP/1.1" 200' in lines.lines[0]


async def test_each_request_cycle_tells_its_watcher_when_the_client_goes_away() -> None:
    """Every request cycle's `message_event` is a `WatchedEvent`: its watcher (what `/mcp` sets
    instead of a task blocked in `receive()`) is called on the loop's next turn when the client
    hangs up mid-request, with the cycle marked disconnected, as `receive()` would then report."""
    seen: list[tuple[bool, bool]] = []
    called = asyncio.Event()
    release = asyncio.Event()
    armed = asyncio.Event()

    async def held(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        cycle = receive.__self__
        assert type(cycle.message_event) is WatchedEvent
        while (await receive())["more_body"]:
            pass

        def watcher() -> None:
            seen.append((cycle.disconnected, cycle.message_event.is_set()))
            called.set()

        cycle.message_event.watcher = watcher
        armed.set()
        await release.wait()

    async with serve_asgi(held, http=OneWriteHttpToolsProtocol) as base:
        reader, writer = await _connect(base)
        writer.write(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        async with asyncio.timeout(30):
            await armed.wait()
        writer.close()
        async with asyncio.timeout(30):
            await called.wait()
        release.set()
    assert seen and seen[0] == (True, True)


async def test_a_watcher_runs_on_the_next_turn_not_inside_set() -> None:
    event = WatchedEvent(asyncio.get_running_loop())
    calls: list[str] = []
    event.watcher = lambda: calls.append("watcher")
    event.set()
    calls.append("after set")
    await asyncio.sleep(0)
    assert calls == ["after set", "watcher"] and event.is_set()


async def test_a_uvicorn_cycle_without_the_state_read_keeps_its_own_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watched event relies on uvicorn internals; were one of them gone (another uvicorn), the
    cycle keeps uvicorn's own event and requests are still answered (through /mcp's watcher task)."""
    kinds: list[type] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        kinds.append(type(receive.__self__.message_event))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    monkeypatch.setattr("gateway.transports.http_protocol.CYCLE_STATE", (*CYCLE_STATE, "no_such_field"))
    async with serve_asgi(app, http=OneWriteHttpToolsProtocol) as base:
        reader, writer = await _connect(base)
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        head = await _read_until(reader, b"\r\n\r\n")
        writer.close()
    assert head.startswith(b"HTTP/1.1 200") and kinds and kinds[0] is asyncio.Event


async def _whole_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`/whole`: the answer through `respond` (or the two messages when it declines, `declined`
    counting); `/plain`: the same answer through uvicorn's `send`; `/wrapped`: `respond` given a
    wrapped `send`; `/crlf` and `/framed`: headers `respond` must leave to uvicorn."""
    if scope["type"] != "http":
        return
    while (await receive())["more_body"]:
        pass
    body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    headers = [(b"content-type", b"application/json"), (b"Mcp-Session-Id", b"dgs_x")]
    path = scope["path"]
    if path == "/crlf":
        headers.append((b"x-bad", b"a\r\nset-cookie: evil"))
    elif path == "/framed":
        headers.append((b"content-length", str(len(body)).encode()))
    target = send
    if path == "/wrapped":
        async def target(message: Any) -> None:
            await send(message)
    if path != "/plain" and respond(target, 200, headers, body):
        return
    if path != "/plain":
        _whole_app.declined.append(path)  # type: ignore[attr-defined]
    if not any(k == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _without_date(response: bytes) -> bytes:
    return b"\r\n".join(line for line in response.split(b"\r\n") if not line.startswith(b"date: "))


async def test_a_whole_answer_is_the_same_bytes_as_uvicorns_two_messages_in_one_write() -> None:
    """`respond` writes what uvicorn's `send` writes for the same start and body (status line,
    its default headers, the app's, content-length last), in one write, and the connection goes
    on (keep-alive) or closes as the request asked."""
    _Counting.writes = []
    _whole_app.declined = []  # type: ignore[attr-defined]
    async with serve_asgi(_whole_app, http=_CountingProtocol) as base:
        reader, writer = await _connect(base)
        try:
            answers = []
            for path in ("/whole", "/plain", "/whole"):
                writer.write(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}".encode())
                head = await _read_until(reader, b"\r\n\r\n")
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                async with asyncio.timeout(30):
                    answers.append(head + await reader.readexactly(length))
            writer.write(b"POST /whole HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}")
            async with asyncio.timeout(30):
                closing = await reader.read()  # to the end: the server closes after answering
        finally:
            writer.close()
    assert _whole_app.declined == []  # type: ignore[attr-defined]
    whole, plain, again = (_without_date(a) for a in answers)
    assert whole == plain == again
    assert whole.startswith(b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: application/json\r\nmcp-session-id: dgs_x\r\ncontent-length: 36\r\n\r\n")
    assert _without_date(closing) == whole.replace(b"content-length: 36\r\n", b"content-length: 36\r\nconnection: close\r\n")
    responses = [w for w in _Counting.writes if w.startswith(b"HTTP/1.1 ")]
    assert len(responses) == 4 and len(_Counting.writes) == 4  # each answer in one write


async def test_respond_declines_what_uvicorns_send_must_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapped `send`, a header uvicorn refuses (CR LF in a value: uvicorn fails the request), a
    framing header, a HEAD request, and a uvicorn cycle lacking the state `respond` sets: the answer
    is left to uvicorn's `send`, which then behaves as it always did."""
    _whole_app.declined = []  # type: ignore[attr-defined]
    async with serve_asgi(_whole_app, http=OneWriteHttpToolsProtocol) as base:
        reader, writer = await _connect(base)
        try:
            for path in ("/wrapped", "/framed"):
                writer.write(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}".encode())
                head = await _read_until(reader, b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 ") and head.count(b"content-length") == 1
                async with asyncio.timeout(30):
                    await reader.readexactly(36)
            writer.write(b"HEAD /whole HTTP/1.1\r\nhost: x\r\n\r\n")
            assert b"content-length: 36" in await _read_until(reader, b"\r\n\r\n")
            writer.write(b"POST /crlf HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            async with asyncio.timeout(30):
                refused = await reader.read()
        finally:
            writer.close()
        assert refused == b""  # uvicorn refuses the head and closes the connection: nothing of it is written
        monkeypatch.setattr("gateway.transports.http_protocol.WHOLE_STATE", (*WHOLE_STATE, "no_such_field"))
        monkeypatch.setattr("gateway.transports.http_protocol._WHOLE_OK", {})
        reader, writer = await _connect(base)
        try:
            writer.write(b"POST /whole HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            assert (await _read_until(reader, b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()
    assert _whole_app.declined == ["/wrapped", "/framed", "/whole", "/crlf", "/whole"]  # type: ignore[attr-defined]
