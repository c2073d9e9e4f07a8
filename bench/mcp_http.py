"""mcp_http: latency and throughput of MCP Streamable HTTP through `dharma serve`'s `/mcp`.

Backend: `bench/mcp_server.py http` (official `mcp` SDK, one trivial `echo` tool; SDK defaults:
stateful sessions, each POST answered with a short SSE stream) on 127.0.0.1.
Gateway: `dharma --config <tmp>/dharma.yaml serve --host 127.0.0.1 --port <free>` as a real
subprocess (uvicorn, one worker), the backend as its one `mcp_http` upstream (no prefix),
`policies/permissive.yaml`, `mcp.anonymous_user` set (no credentials on the wire), a fresh state
root (SQLite ledger synchronous FULL, Ed25519 receipts), the default log level (info) to a file.
Client: raw JSON-RPC POSTs with httpx.AsyncClient (keep-alive; revision 2025-11-25; `initialize`
+ `notifications/initialized`, then sequential `tools/call echo`), so the figures are the
gateway's, not an MCP client library's. Direct and gateway calls are interleaved one by one.
Throughput: 1, 8 and 32 concurrent clients, each its own AsyncClient and its own MCP session,
calling back to back for a bounded time and count; direct rows at the same concurrency are the
baseline. Loopback only. 'cpu/call' = the CPU of the server process the client talks to (the
gateway alone, excluding the upstream; or the upstream, per call it served, direct or forwarded by
the gateway), from /proc; 'client cpu/call' =
this process, which drives all the clients (on a small box it competes for the same cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from bench import Options, Results, Stats, fmt_time, table
from bench.mcp_stdio import PERMISSIVE, REPO, SERVER, child_env, proc_cpu

PROTOCOL = "2025-11-25"
CONCURRENCY = (1, 8, 32)
ACCEPT = "application/json, text/event-stream"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A server subprocess in its own process group, stopped (SIGTERM, then SIGKILL) on close."""

    def __init__(self, cmd: list[str], log: IO[bytes], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=REPO, env=env,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


async def _wait_until(what: str, ready: Any, proc: Proc, log_path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await ready():
        if proc.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start: {log_path.read_text(errors='replace')[-2000:]}")
        await asyncio.sleep(0.05)


def start_upstream(tmp: Path, log: IO[bytes], log_path: Path) -> tuple[Proc, Path]:
    url_file = tmp / "upstream.url"
    url_file.unlink(missing_ok=True)
    return Proc([sys.executable, str(SERVER), "http", "--url-file", str(url_file)], log, child_env()), url_file


def start_gateway(tmp: Path, upstream_url: str, log: IO[bytes]) -> tuple[Proc, str]:
    port = _free_port()
    config = {
        "policy": str(PERMISSIVE),
        "state_root": str(tmp / "state"),
        "upstreams": [{"id": "echo", "type": "mcp_http", "url": upstream_url}],
        "mcp": {"anonymous_user": "bench"},
    }
    path = tmp / "dharma.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    cmd = [sys.executable, "-m", "gateway", "--config", str(path), "serve", "--host", "127.0.0.1", "--port", str(port)]
    return Proc(cmd, log, child_env()), f"http://127.0.0.1:{port}/mcp"


def _messages(response: httpx.Response) -> list[dict[str, Any]]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        out = []
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                out.append(json.loads(line[5:]))
        return out
    return [response.json()] if response.content else []


class RawHttp:
    """A minimal MCP Streamable HTTP client: JSON-RPC POSTs on one keep-alive connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        self.headers = {"accept": ACCEPT, "content-type": "application/json"}
        self._id = 0

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        wanted = self._id
        body = json.dumps({"jsonrpc": "2.0", "id": wanted, "method": method, "params": params}, separators=(",", ":"))
        r = await self.http.post(self.url, content=body, headers=self.headers)
        for msg in _messages(r):
            if msg.get("id") == wanted:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                if method == "initialize":
                    sid = r.headers.get("mcp-session-id")
                    if sid:
                        self.headers["mcp-session-id"] = sid
                return msg["result"]  # type: ignore[no-any-return]
        raise RuntimeError(f"{method}: HTTP {r.status_code}, no answer in {r.text[:300]!r}")

    async def initialize(self) -> None:
        await self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                          "clientInfo": {"name": "dharma-bench", "version": "1"}})
        self.headers["mcp-protocol-version"] = PROTOCOL
        r = await self.http.post(self.url, content='{"jsonrpc":"2.0","method":"notifications/initialized"}',
                                 headers=self.headers)
        if r.status_code >= 300:
            raise RuntimeError(f"notifications/initialized: HTTP {r.status_code} {r.text[:200]}")

    async def echo(self, text: str = "hello") -> dict[str, Any]:
        result = await self.request("tools/call", {"name": "echo", "arguments": {"text": text}})
        if result.get("isError"):
            raise RuntimeError(f"echo failed: {result}")
        return result

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.http.delete(self.url, headers=self.headers)
        await self.http.aclose()


async def _interleaved(a: RawHttp, b: RawHttp, seconds: float, warmup: int = 30) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        await a.echo()
        await b.echo()
    clock = time.perf_counter
    ta: list[float] = []
    tb: list[float] = []
    gc.collect()
    deadline = clock() + seconds
    i = 0
    while len(ta) < 30 or clock() < deadline:
        order = ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta))
        for client, out in order:
            t0 = clock()
            await client.echo()
            out.append(clock() - t0)
        i += 1
    return ta, tb


async def _throughput(url: str, pid: int, callers: int, seconds: float, max_calls: int) -> dict[str, float]:
    """`callers` clients, each with its own AsyncClient and MCP session, calling for ~`seconds`."""
    clients = [RawHttp(url) for _ in range(callers)]
    try:
        await asyncio.gather(*(c.initialize() for c in clients))
        await asyncio.gather(*(c.echo() for c in clients))  # warm each connection
        latencies: list[float] = []
        errors = 0
        clock = time.perf_counter
        deadline = clock() + seconds

        async def loop(c: RawHttp) -> None:
            nonlocal errors
            while clock() < deadline and len(latencies) < max_calls:
                t0 = clock()
                try:
                    await c.echo()
                except (RuntimeError, httpx.HTTPError):
                    errors += 1
                    continue
                latencies.append(clock() - t0)

        cpu0, own0, wall0 = proc_cpu(pid), time.process_time(), clock()
        await asyncio.gather(*(loop(c) for c in clients))
        wall = clock() - wall0
        n = max(1, len(latencies))
        st = Stats.of(latencies) if latencies else None
        return {"rate": len(latencies) / wall, "n": len(latencies), "errors": errors,
                "p50": st.p50 if st else float("nan"), "p99": st.p99 if st else float("nan"),
                "cpu": (proc_cpu(pid) - cpu0) / n, "client_cpu": (time.process_time() - own0) / n}
    finally:
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)


async def run(opts: Options, results: Results) -> None:
    seconds = 0.5 if opts.quick else 8.0
    tput_seconds = 0.3 if opts.quick else 2.5
    base_seconds = 0.2 if opts.quick else 1.5
    max_calls = 2_000 if opts.quick else 50_000
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-mcp-http-")))
        tmp = tmp / "mcp_http"
        tmp.mkdir(parents=True, exist_ok=True)
        log_path = tmp / "servers.log"
        log = stack.enter_context(open(log_path, "wb"))
        t_start = time.perf_counter()
        upstream, url_file = start_upstream(tmp, log, log_path)
        stack.callback(upstream.close)

        async def upstream_ready() -> bool:
            return url_file.exists() and bool(url_file.read_text().strip())

        await _wait_until("the upstream MCP server", upstream_ready, upstream, log_path)
        upstream_url = url_file.read_text().strip()
        gateway, gateway_url = start_gateway(tmp, upstream_url, log)
        stack.callback(gateway.close)
        health = gateway_url.rsplit("/", 1)[0] + "/healthz"

        async def gateway_ready() -> bool:
            try:
                async with httpx.AsyncClient(timeout=1.0) as h:
                    return (await h.get(health)).status_code < 500
            except httpx.HTTPError:
                return False

        await _wait_until("dharma serve", gateway_ready, gateway, log_path)
        startup = time.perf_counter() - t_start

        direct, governed = RawHttp(upstream_url), RawHttp(gateway_url)
        try:
            try:
                await direct.initialize()
                await governed.initialize()
            except (RuntimeError, httpx.HTTPError) as exc:
                log.flush()
                raise RuntimeError(f"{exc}; server logs:\n{log_path.read_text(errors='replace')[-2000:]}") from None
            receipt = (await governed.echo()).get("_meta", {}).get("dharma.gateway/receipt")
            cpu_d0, cpu_g0 = proc_cpu(upstream.pid), proc_cpu(gateway.pid)
            own0 = time.process_time()
            td, tg = await _interleaved(direct, governed, seconds)
            own = (time.process_time() - own0) / (len(td) + len(tg))
            cpu_d = (proc_cpu(upstream.pid) - cpu_d0) / (len(td) + len(tg))  # it also serves the gateway's calls
            cpu_g = (proc_cpu(gateway.pid) - cpu_g0) / len(tg)
        finally:
            await direct.aclose()
            await governed.aclose()
        d, g = Stats.of(td), Stats.of(tg)

        tput: list[tuple[str, int, dict[str, float]]] = []
        for callers in CONCURRENCY:
            tput.append(("direct", callers, await _throughput(upstream_url, upstream.pid, callers, base_seconds, max_calls)))
            tput.append(("gateway", callers, await _throughput(gateway_url, gateway.pid, callers, tput_seconds, max_calls)))

    def row(label: str, st: Stats, base: Stats | None, cpu: float) -> list[str]:
        return [label, str(st.n), fmt_time(st.p50), fmt_time(st.p99), fmt_time(st.mean), f"{1 / st.mean:,.0f}",
                fmt_time(cpu), "-" if base is None else f"+{fmt_time(st.p50 - base.p50)}",
                "-" if base is None else f"+{fmt_time(st.p99 - base.p99)}",
                "1.0x" if base is None else f"{st.p50 / base.p50:.2f}x"]

    table("mcp_http: sequential tools/call echo over Streamable HTTP, direct vs through `dharma serve` /mcp",
          ["path", "calls", "p50", "p99", "mean", "calls/s", "cpu/call", "added p50", "added p99", "x direct"],
          [row("raw httpx, upstream direct (baseline)", d, None, cpu_d),
           row("raw httpx, through dharma serve /mcp", g, d, cpu_g)],
          note=f"gateway: `dharma serve` subprocess (uvicorn), permissive policy, anonymous_user, SQLite ledger FULL + "
               f"Ed25519 receipts (receipt returned: {'yes' if receipt else 'NO'}), info log to a file\n"
               f"upstream replies SSE (SDK default); direct and gateway calls interleaved, ~{seconds:g} s; "
               f"client CPU {fmt_time(own)}/call; start-up of both servers: {startup:.2f} s")
    rows = []
    base_rate = {callers: r["rate"] for path, callers, r in tput if path == "direct"}
    for path, callers, r in tput:
        ratio = "1.0x" if path == "direct" else f"{r['rate'] / base_rate[callers]:.2f}x"
        rows.append([f"{'upstream direct' if path == 'direct' else 'through dharma serve'}", str(callers),
                     f"{int(r['n']):,}", f"{r['rate']:,.0f}", ratio, fmt_time(r["p50"]), fmt_time(r["p99"]),
                     fmt_time(r["cpu"]), fmt_time(r["client_cpu"]), str(int(r["errors"]))])
    table("mcp_http: calls/s with concurrent clients (each its own httpx.AsyncClient and MCP session)",
          ["path", "clients", "calls", "calls/s", "x direct", "p50", "p99", "cpu/call", "client cpu/call", "errors"],
          rows, note=f"~{tput_seconds:g} s per gateway row, ~{base_seconds:g} s per direct row, at most {max_calls:,} calls; "
                     "one client process drives every client (see 'client cpu/call')")
    gw_best = max((r["rate"] for path, _, r in tput if path == "gateway"), default=0.0)
    print(f"   best through the gateway: {gw_best:,.0f} calls/s; gateway added p50 {fmt_time(g.p50 - d.p50)} "
          "(no §8 target for HTTP; the stdio target is in mcp_stdio)")


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(run(Options(quick="--quick" in sys.argv), Results()))
