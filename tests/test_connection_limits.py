"""Bounded connections of a real `dharma serve` (gateway/transports/http_limits.py), over real
sockets: a request head or body that never ends is cut off with a 408 at its deadline, an idle
kept-alive connection is closed, the caps per client address and in total refuse the next
connection with a 429 / 503 naming the limit, and a well-behaved client keeps its latency while
hundreds of slowloris sockets press on the gateway.

All test sockets come from loopback: the attackers from 127.0.0.1, the well-behaved client and the
metrics scraper from 127.0.0.2 (Linux routes all of 127/8 to `lo`), so the per-address cap tells
them apart. Every wait is for a signal (an answer, the server's close, a metric) with a generous
deadline; the only pacing is the attacker's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.transports.http_limits import address_key
from tests.conftest import KEYS, REPO
from tests.mcp_http.conftest import client as mcp_client
from tests.mcp_http.raw import META, MODERN
from tests.test_metrics import scrape, value
from tests.test_reload import DEADLINE_S, healthy, served, wait_for  # noqa: F401  (served: the fixture)

HERE = Path(__file__).resolve().parent
CLIENT = "127.0.0.2"
READER = {"authorization": f"Bearer {KEYS['reader']}"}


def client(url: str, *, keep_alive: bool = True) -> httpx.AsyncClient:
    """An httpx client from CLIENT's address (`keep_alive=False`: a new connection per request)."""
    limits = httpx.Limits() if keep_alive else httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=url, timeout=30, transport=httpx.AsyncHTTPTransport(local_address=CLIENT, limits=limits))


async def connect(url: str, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    async with asyncio.timeout(DEADLINE_S):
        while chunk := await reader.read(65536):
            got += chunk
    return got


async def one_answer(reader: asyncio.StreamReader) -> bytes:
    """One whole response (fixed length) off a kept-alive connection."""
    async with asyncio.timeout(DEADLINE_S):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        return head + await reader.readexactly(length)


def parsed(raw: bytes) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body) of one raw response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body) if body else None


async def drip(writer: asyncio.StreamWriter, data: bytes, every: float, reader: asyncio.StreamReader) -> None:
    """Send `data` a piece at a time, one every `every` seconds, until the server closes."""
    with contextlib.suppress(OSError):
        while not reader.at_eof() and not writer.is_closing():
            writer.write(data)
            await asyncio.sleep(every)


async def timed_close(url: str, first: bytes, trickle: bytes = b"", every: float = 0.3, source: str = "127.0.0.1") -> tuple[float, bytes]:
    """Open a connection, send `first` (then `trickle` every `every` s while open): seconds until the server closed it, and what it sent."""
    reader, writer = await connect(url, source)
    started = time.monotonic()
    writer.write(first)
    dripping = asyncio.create_task(drip(writer, trickle, every, reader)) if trickle else None
    try:
        got = await until_closed(reader)
    finally:
        if dripping is not None:
            dripping.cancel()
        writer.close()
    return time.monotonic() - started, got


def log_events(log: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


async def test_slow_heads_bodies_and_idle_connections_are_cut_off(served: Any) -> None:
    """Deadlines on every path: a head dripped a line at a time (on /mcp) and a silent connection
    get a 408 at the header timeout; a body that stalls or trickles (on /v1) gets a 408 at its
    idle or whole-body deadline; a kept-alive connection idle, or fed blank lines, is closed; the
    third request on a connection is its last. Counted at /metrics, logged once per burst."""
    url, server, log, _ = served(watch=False, server={
        "header_timeout_seconds": 1, "body_idle_seconds": 1, "body_timeout_seconds": 3, "keep_alive_seconds": 1,
        "max_requests_per_connection": 3})
    async with client(url) as http:
        await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
        before = await scrape(http)
        call = b"POST /v1/tools/read_note:call HTTP/1.1\r\nhost: x\r\nauthorization: Bearer reader-key\r\ncontent-length: 100\r\n\r\n{"
        slow_head, silent, stalled, trickled, idle, blank_lines = await asyncio.gather(
            timed_close(url, b"POST /mcp HTTP/1.1\r\n", b"x-slow: 1\r\n"),
            timed_close(url, b""),
            timed_close(url, call),
            timed_close(url, call, b" "),
            timed_close(url, b"GET /ui/ HTTP/1.1\r\nhost: x\r\n\r\n"),
            timed_close(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", b"\r\n"),
        )
        for (seconds, raw), setting in ((slow_head, "header_timeout_seconds"), (silent, "header_timeout_seconds"),
                                        (stalled, "body_idle_seconds"), (trickled, "body_timeout_seconds")):
            status, headers, body = parsed(raw)
            assert status == 408 and headers["connection"] == "close", raw
            assert body["limit"] == f"server.{setting}" and body["error_code"] == "timeout" and setting in body["message"]
        assert slow_head[0] >= 0.5 and silent[0] >= 0.5 and stalled[0] >= 0.5, "cut off before the deadline"
        assert trickled[0] >= 2, "a body that keeps trickling is cut at the whole-body deadline, not the idle one"
        for seconds, raw in (idle, blank_lines):
            assert raw.startswith(b"HTTP/1.1 ") and raw.count(b"HTTP/1.1 ") == 1, "closed with nothing more sent"
            assert seconds >= 0.5

        reader, writer = await connect(url)
        try:
            for n in range(3):
                writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                status, headers, _ = parsed(await one_answer(reader))
                assert status == 200 and (headers.get("connection") == "close") == (n == 2)
            assert await until_closed(reader) == b""
        finally:
            writer.close()

        after = await scrape(http)
    for reason, least in (("header_timeout", 2), ("body_idle", 1), ("body_timeout", 1), ("keep_alive_idle", 2)):
        grew = value(after, "dharma_http_connections_closed_total", reason=reason) - value(before, "dharma_http_connections_closed_total", reason=reason)
        assert grew >= least, (reason, grew)
    logged = log_events(log, "http.connections_timed_out")
    assert {line["reason"] for line in logged} == {"header_timeout", "body_idle", "body_timeout"}
    assert "Traceback" not in log.read_text()


async def test_a_client_still_sending_when_cut_off_reads_its_408_not_a_reset(served: Any) -> None:
    """A connection past its deadline is half-closed and drained, not closed with the client's bytes
    unread (which sends a reset that can destroy the 408 before the client reads it): a client that
    keeps writing after the answer gets end-of-stream, its further writes are taken, and its own
    close ends the connection."""
    url, server, _, _ = served(watch=False, server={"header_timeout_seconds": 1, "body_idle_seconds": 1, "body_timeout_seconds": 2})
    async with client(url) as http:
        await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
        for first, more in ((b"POST /mcp HTTP/1.1\r\n", b"x-slow: 1\r\n"),
                            (b"POST /v1/tools/read_note:call HTTP/1.1\r\nhost: x\r\ncontent-length: 999\r\n\r\n{", b" ")):
            reader, writer = await connect(url)
            try:
                writer.write(first)
                got = await until_closed(reader)
                assert parsed(got)[0] == 408, got
                for _ in range(20):  # a peer that had closed would answer these with a reset
                    writer.write(more)
                    await writer.drain()
                    await asyncio.sleep(0.01)
                assert not writer.transport.is_closing()
            finally:
                writer.close()
            await writer.wait_closed()


async def test_caps_per_address_and_in_total_refuse_with_an_answer_naming_the_limit(served: Any) -> None:
    url, server, log, _ = served(watch=False, server={
        "max_connections": 6, "max_connections_per_address": 4, "keep_alive_seconds": 600, "header_timeout_seconds": 600})
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with client(url) as http:  # one kept-alive connection from CLIENT: it counts in the total
            await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
            for path in ("/healthz", "/ui/", "/healthz", "/.well-known/jwks.json"):  # 4 from 127.0.0.1, each answered: admitted
                held.append(await connect(url))
                held[-1][1].write(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
                assert parsed(await one_answer(held[-1][0]))[0] in (200, 303), path

            _, raw = await timed_close(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            status, headers, body = parsed(raw)
            assert status == 429 and headers["retry-after"] == "1" and headers["content-type"] == "application/json"
            assert body["limit"] == "server.max_connections_per_address" and body["value"] == 4 and body["error_code"] == "rate_limited"

            held.append(await connect(url, "127.0.0.3"))  # the sixth connection in all
            held[-1][1].write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            assert parsed(await one_answer(held[-1][0]))[0] == 200
            _, raw = await timed_close(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", source="127.0.0.4")
            status, headers, body = parsed(raw)
            assert status == 503 and headers["retry-after"] == "1"
            assert body["limit"] == "server.max_connections" and body["value"] == 6 and "server.max_connections" in body["message"]

            metrics = await scrape(http)
            assert value(metrics, "dharma_http_connections_open") == 6
            assert value(metrics, "dharma_http_connections_refused_total", limit="max_connections_per_address") == 1
            assert value(metrics, "dharma_http_connections_refused_total", limit="max_connections") == 1
            assert value(metrics, "dharma_http_connections_limit", limit="max_connections_per_address") == 4

            held.pop(0)[1].close()  # a slot of 127.0.0.1 frees: its next connection is served

            async def served_again() -> bool:
                _, raw = await timed_close(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                return parsed(raw)[0] == 200

            await wait_for(served_again, "a connection from 127.0.0.1 to be served once one of its four closed", server)
    finally:
        for _, writer in held:
            writer.close()
    refused = log_events(log, "http.connections_refused")
    assert {(line["reason"], line["limit"]) for line in refused} == {
        ("max_connections_per_address", "server.max_connections_per_address"), ("max_connections", "server.max_connections")}


async def test_an_mcp_call_cut_off_mid_body_is_not_run(served: Any, tmp_path: Path) -> None:
    """A `tools/call` whose JSON is whole but whose body is shorter than its content-length stalls:
    the body deadline answers 408 and the call never reaches the upstream (a request that did not
    arrive whole is not run, even where its first bytes parse); the SDK client's next call runs."""
    sandbox = tmp_path / "sandbox"
    files = {"id": "files", "type": "mcp_stdio", "command": sys.executable, "args": ["-m", "examples.demo_mcp_server"],
             "env": {"DHARMA_DEMO_SANDBOX": str(sandbox), "PYTHONPATH": str(REPO)}}
    url, server, log, _ = served(watch=False, server={"body_idle_seconds": 1}, upstreams=[files])
    async with client(url) as http:
        await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
    call = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "write_file", "arguments": {"path": "cut.txt", "content": "never"}, "_meta": META}}).encode()
    head = (b"POST /mcp HTTP/1.1\r\nhost: x\r\nx-api-key: operator-key\r\ncontent-type: application/json\r\n"
            b"accept: application/json, text/event-stream\r\nmcp-protocol-version: %s\r\ncontent-length: %d\r\n\r\n"
            % (MODERN.encode(), len(call) + 10))
    _, raw = await timed_close(url, head + call)
    assert parsed(raw)[2]["limit"] == "server.body_idle_seconds"

    async with mcp_client(url + "/mcp", key=KEYS["operator"]) as mcp:
        result = await mcp.call_tool("write_file", {"path": "after.txt", "content": "ran"})
        assert not result.is_error
    assert (sandbox / "after.txt").read_text() == "ran"
    assert not (sandbox / "cut.txt").exists(), "a call whose body never arrived whole ran"


def test_connections_are_counted_per_ipv4_address_and_per_ipv6_64() -> None:
    assert address_key(("192.0.2.7", 5000)) == "192.0.2.7"
    assert address_key(("::ffff:192.0.2.7", 5000, 0, 0)) == "192.0.2.7"
    assert address_key(("2001:db8:1:2:aaaa::1", 5000, 0, 0)) == address_key(("2001:db8:1:2:ffff::9", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert address_key(("2001:db8:1:3::1", 5000, 0, 0)) != address_key(("2001:db8:1:2::1", 5000, 0, 0))
    assert address_key("/run/dharma.sock") == address_key("") == "local"


ATTACKERS = 600
NOFILE = 512


def _percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] if len(samples) > 1 else samples[0]


async def _latencies(http: httpx.AsyncClient, calls: int) -> list[float]:
    """`calls` governed calls on /v1, one after another, each on a new connection: their seconds."""
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        answer = await http.post("/v1/tools/read_note:call", json={"arguments": {"path": "a"}}, headers=READER)
        out.append(time.perf_counter() - started)
        assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
    return out


async def test_a_well_behaved_client_keeps_its_p99_under_a_slowloris_attack(served: Any) -> None:
    """600 slowloris sockets from 127.0.0.1, more than the gateway's file-descriptor limit (512,
    so its connection cap is lowered to 256): without the caps the gateway runs out of descriptors
    or fills its total, and the client from 127.0.0.2 (a new connection per call, as a sporadic
    agent makes them) gets refused or hangs. With them (the shipped defaults: 64 per address),
    the client's p99 under attack stays within 3x of its p99 idle."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < ATTACKERS + 256:
        if hard != resource.RLIM_INFINITY and hard < ATTACKERS + 256:
            pytest.skip(f"this process may hold {hard} file descriptors; the attack needs {ATTACKERS + 256}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (ATTACKERS + 256, hard))
    url, server, log, _ = served(watch=False, nofile=NOFILE)
    host, port = url.removeprefix("http://").split(":")
    async with client(url, keep_alive=False) as http, client(url) as scraper:
        await wait_for(lambda: healthy(scraper), "the gateway to be healthy", server)
        [limits] = log_events(log, "http.connection_limits")
        assert limits["level"] == "warning" and limits["max_connections"] == NOFILE // 2 and limits["nofile_soft"] == NOFILE
        await _latencies(http, 30)  # warm-up
        idle = await _latencies(http, 200)

        attacker = subprocess.Popen([sys.executable, str(HERE / "slowloris.py"), host, port, "127.0.0.1", str(ATTACKERS)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready = await asyncio.wait_for(asyncio.to_thread(attacker.stdout.readline), DEADLINE_S)  # type: ignore[union-attr]
            assert ready.strip() == "ready"

            async def pressed() -> bool:  # the attack holds what the gateway lets it and was refused the rest
                metrics = await scrape(scraper)
                refused = sum(value(metrics, "dharma_http_connections_refused_total", limit=limit)
                              for limit in ("max_connections", "max_connections_per_address"))
                return value(metrics, "dharma_http_connections_open") >= 64 and refused >= ATTACKERS - NOFILE // 2

            await wait_for(pressed, "the attack to hold its connections and be refused the rest", server)
            rounds = []
            for _ in range(3):  # a busy box can spoil one round's tail; every call of every round must succeed
                attacked = await _latencies(http, 200)
                rounds.append(_percentile(attacked, 99))
                if rounds[-1] <= 3 * _percentile(idle, 99):
                    break
            metrics = await scrape(scraper)
        finally:
            out, _ = attacker.communicate("", timeout=DEADLINE_S)
    idle_p99, attacked_p99 = _percentile(idle, 99), min(rounds)
    assert attacked_p99 <= 3 * idle_p99, f"p99 {attacked_p99 * 1000:.1f} ms under attack vs {idle_p99 * 1000:.1f} ms idle"
    assert value(metrics, "dharma_http_connections_open") <= 64 + 2, "127.0.0.1 holds no more than its cap"
    seen = json.loads(out.strip().splitlines()[-1])["seen"]
    assert seen.get("429", 0) >= ATTACKERS - 64, seen
    refused_lines = log_events(log, "http.connections_refused")
    refused_total = value(metrics, "dharma_http_connections_refused_total", limit="max_connections_per_address")
    assert sum(line["count"] for line in refused_lines) <= refused_total
    assert len(refused_lines) <= 10 and refused_total >= 10 * len(refused_lines), "refusals are logged once per interval, not once each"


async def test_malformed_requests_are_counted_and_logged_once_per_burst(served: Any) -> None:
    """A request uvicorn cannot parse gets its 400 and the connection closes, as before; but a
    client sending garbage on connection after connection must not write a log line each time:
    the guard counts them at /metrics and logs one line per burst."""
    url, server, log, _ = served(watch=False)
    async with client(url) as http:
        await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
        before = await scrape(http)
        for _ in range(40):
            reader, writer = await connect(url)
            writer.write(b"NOT HTTP AT ALL\x00\r\n\r\n")
            raw = await until_closed(reader)
            writer.close()
            assert raw.startswith(b"HTTP/1.1 400 "), raw
        after = await scrape(http)
    grew = (value(after, "dharma_http_connections_closed_total", reason="malformed_request")
            - value(before, "dharma_http_connections_closed_total", reason="malformed_request"))
    assert grew == 40
    text = log.read_text()
    assert text.count("Invalid HTTP request received") == 0, "uvicorn's warning once per request"
    assert 1 <= len(log_events(log, "http.requests_malformed")) <= 2
