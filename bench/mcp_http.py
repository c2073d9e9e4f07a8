"""mcp_http: latency and throughput of MCP Streamable HTTP through `dharma serve`'s `/mcp` (design §8).

Backend: `bench/mcp_server.py http --json` (official `mcp` SDK, one trivial `echo` tool, stateful
sessions, every POST answered with one JSON body: `json_response=True`) on 127.0.0.1.
Gateway: `dharma --config <tmp>/dharma.yaml serve --host 127.0.0.1 --port <free>` as a real
subprocess (uvicorn, one worker), the backend as its one `mcp_http` upstream (no prefix),
the shipped `policies/standard.yaml` with every rule set it names (rate limits raised; the anonymous
caller a principal of its `admin` tier), `mcp.anonymous_user` set (no credentials on the wire), a fresh state
root (SQLite ledger synchronous FULL, Ed25519 receipts), the default log level (info) to a file.
Clients, as real agents talk: the official SDK client (`mcp.Client` over
`mcp.client.streamable_http`), on both protocol eras (2025-11-25 sessions, and 2026-07-28),
sequential `tools/call echo`, direct and gateway calls interleaved one by one. One extra pair with
raw JSON-RPC POSTs over httpx (2025-11-25), so the gateway's share is visible without a client
library's. Throughput: 1, 8 and 32 concurrent SDK clients per era, each its own connection and MCP
session, calling back to back for a bounded time and count; the direct row at the same concurrency
runs just before the gateway's and is its baseline. Loopback only. 'cpu/call' = the CPU of the
server process the client talks to (the gateway alone, excluding the upstream; or the upstream,
per call it served, direct or forwarded by the gateway), from /proc; 'client cpu/call' = this
process, which drives all the clients (on a small box it competes for the same cores).
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from bench import Options, Results, Stats, Target, fmt_time, table
from bench.mcp_stdio import REPO, SERVER, child_env, proc_cpu
from bench.policygen import standard_document

PROTOCOL = "2025-11-25"
CONCURRENCY = (1, 8, 32)
ACCEPT = "application/json, text/event-stream"
TARGET_ADDED_MS = 2.0  # design §8: added p50 ≤ 2 ms
TARGET_CPU_MS = 2.0  # gateway CPU ≤ 2 ms per call
TARGET_RATIO = 0.7  # 8 clients ≥ 0.7× direct calls/s
ANONYMOUS = "bench"  # mcp.anonymous_user: the local user every HTTP caller is


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A server subprocess in its own process group, stopped (SIGTERM, then SIGKILL) on close."""

    def __init__(self, cmd: list[str], log: IO[bytes], env: dict[str, str], cwd: Path = REPO) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=cwd, env=env,
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


def start_upstream(tmp: Path, log: IO[bytes], log_path: Path, shape: str = "default") -> tuple[Proc, Path]:
    """`bench/mcp_server.py` over HTTP answering JSON, echo answering in `shape`; returns it and
    the file its URL appears in once it listens."""
    url_file = tmp / f"upstream-{shape}.url"
    url_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(SERVER), "http", "--json", "--shape", shape, "--url-file", str(url_file)]
    return Proc(cmd, log, child_env()), url_file


def gateway_policy(tmp: Path) -> tuple[Path, str]:
    """The shipped standard profile with every rule set (`standard_document`), the anonymous caller
    `bench` as a principal of its `admin` tier (the profile grants `echo` to no other tier); returns
    the file and what it is."""
    doc, missing = standard_document({"id": "bench", "local_user": ANONYMOUS, "tier": "admin"})
    path = tmp / "standard-bench.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    what = f"policies/standard.yaml + {len(doc['rule_sets'])} rule sets (rate limits raised)"
    return path, what + (f"; MISSING rule sets skipped: {', '.join(missing)}" if missing else "")


def start_gateway(tmp: Path, upstream_url: str, log: IO[bytes], policy: tuple[Path, str] | None = None,
                  checkout: Path | None = None, **env: str) -> tuple[Proc, str, str]:
    """`dharma serve` in front of `upstream_url` under `policy` (file, what it is; default
    `gateway_policy`), its state in `tmp`, the code of `checkout` (first on `PYTHONPATH`; default this
    one), `env` added to its environment; returns it, its /mcp URL and what its policy is."""
    port = _free_port()
    path, what = policy if policy is not None else gateway_policy(tmp)
    config = {
        "policy": str(path),
        "state_root": str(tmp / "state"),
        "upstreams": [{"id": "echo", "type": "mcp_http", "url": upstream_url}],
        # one principal opens every session: up to max(CONCURRENCY) at once, above the default cap of 16
        "mcp": {"anonymous_user": ANONYMOUS, "max_sessions_per_principal": 2 * max(CONCURRENCY)},
    }
    config_path = tmp / "dharma.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    cmd = [sys.executable, "-m", "gateway", "--config", str(config_path), "serve",
           "--host", "127.0.0.1", "--port", str(port)]
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    return Proc(cmd, log, child_env(**env), checkout or REPO), f"http://127.0.0.1:{port}/mcp", what


async def started_upstream(stack: contextlib.ExitStack, tmp: Path, log: IO[bytes], log_path: Path,
                           shape: str = "default") -> tuple[Proc, str]:
    """`start_upstream`, closed with `stack`, once it listens; returns it and its URL."""
    upstream, url_file = start_upstream(tmp, log, log_path, shape)
    stack.callback(upstream.close)

    async def ready() -> bool:
        return url_file.exists() and bool(url_file.read_text().strip())

    await _wait_until("the upstream MCP server", ready, upstream, log_path)
    return upstream, url_file.read_text().strip()


async def started_gateway(stack: contextlib.ExitStack, tmp: Path, upstream_url: str, log: IO[bytes], log_path: Path,
                          policy: tuple[Path, str] | None = None, checkout: Path | None = None,
                          **env: str) -> tuple[Proc, str, str]:
    """`start_gateway`, closed with `stack`, once /healthz answers; returns it, its /mcp URL and its policy."""
    gateway, url, what = start_gateway(tmp, upstream_url, log, policy, checkout, **env)
    stack.callback(gateway.close)
    health = url.rsplit("/", 1)[0] + "/healthz"

    async def ready() -> bool:
        try:
            async with httpx.AsyncClient(timeout=1.0) as h:
                return (await h.get(health)).status_code < 500
        except httpx.HTTPError:
            return False

    await _wait_until("dharma serve", ready, gateway, log_path, timeout=60.0)
    return gateway, url, what


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


class SdkHttp:
    """The official SDK client (`mcp.Client` over `mcp.client.streamable_http`) on one protocol era."""

    def __init__(self, url: str, mode: str) -> None:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        self.http = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=60.0))
        self.client = Client(streamable_http_client(url, http_client=self.http), mode=mode)  # type: ignore[arg-type]
        self.mode = mode
        self._stack = contextlib.AsyncExitStack()

    async def initialize(self) -> None:
        await self._stack.enter_async_context(self.client)
        era = self.client.protocol_version
        if era != ERAS[self.mode]:
            raise RuntimeError(f"the SDK client negotiated {era}, not {ERAS[self.mode]}")

    async def echo(self, text: str = "hello") -> dict[str, Any]:
        out = await self.client.call_tool("echo", {"text": text})
        if out.is_error:
            raise RuntimeError(f"echo failed: {out}")
        return {"_meta": out.meta or {}}

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()
        await self.http.aclose()


#: SDK `mode` → the protocol revision it negotiates.
ERAS = {"legacy": PROTOCOL, "2026-07-28": "2026-07-28"}
Caller = RawHttp | SdkHttp


async def _interleaved(a: Caller, b: Caller, seconds: float, warmup: int = 30) -> tuple[list[float], list[float]]:
    """Time `a` and `b` one call each in turn (alternating who goes first) for ~`seconds`."""
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


async def _throughput(make: Any, pid: int, callers: int, seconds: float, max_calls: int) -> dict[str, float]:
    """`callers` clients (`make()`), each with its own connection and MCP session, calling for ~`seconds`.
    Each client lives in one task from open to close (the SDK client's task groups require it)."""
    latencies: list[float] = []
    errors = 0
    clock = time.perf_counter
    ready = 0
    all_ready, go = asyncio.Event(), asyncio.Event()
    deadline = 0.0

    async def worker() -> None:
        nonlocal errors, ready
        c = make()
        try:
            await c.initialize()
            await c.echo()  # warm the connection
            ready += 1
            if ready == callers:
                all_ready.set()
            await go.wait()
            while clock() < deadline and len(latencies) < max_calls:
                t0 = clock()
                try:
                    await c.echo()
                except Exception:  # counted and shown in the 'errors' column
                    errors += 1
                    continue
                latencies.append(clock() - t0)
        finally:
            await c.aclose()

    tasks = [asyncio.ensure_future(worker()) for _ in range(callers)]
    waiter = asyncio.ensure_future(all_ready.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if not all_ready.is_set():  # a client failed to start: surface its error
        waiter.cancel()
        go.set()
        await asyncio.gather(*tasks)
    cpu0, own0, wall0 = proc_cpu(pid), time.process_time(), clock()
    deadline = wall0 + seconds
    go.set()
    await asyncio.gather(*tasks)
    wall = clock() - wall0
    n = max(1, len(latencies))
    st = Stats.of(latencies) if latencies else None
    return {"rate": len(latencies) / wall, "n": len(latencies), "errors": errors,
            "p50": st.p50 if st else float("nan"), "p99": st.p99 if st else float("nan"),
            "cpu": (proc_cpu(pid) - cpu0) / n, "client_cpu": (time.process_time() - own0) / n}


@dataclass
class Pair:
    """One sequential comparison: direct and through the gateway, interleaved."""

    label: str
    era: str
    direct: Stats
    governed: Stats
    cpu_direct: float  # the upstream's CPU per call it served (direct or forwarded)
    cpu_gateway: float  # the gateway process's CPU per governed call
    client_cpu: float
    receipt: bool


async def _pair(label: str, era: str, direct: Caller, governed: Caller, upstream: Proc, gateway: Proc,
                seconds: float) -> Pair:
    await direct.initialize()
    await governed.initialize()
    try:
        receipt = bool((await governed.echo()).get("_meta", {}).get("dharma.gateway/receipt"))
        cpu_d0, cpu_g0, own0 = proc_cpu(upstream.pid), proc_cpu(gateway.pid), time.process_time()
        td, tg = await _interleaved(direct, governed, seconds)
        own = (time.process_time() - own0) / (len(td) + len(tg))
        cpu_d = (proc_cpu(upstream.pid) - cpu_d0) / (len(td) + len(tg))  # it also serves the gateway's calls
        cpu_g = (proc_cpu(gateway.pid) - cpu_g0) / len(tg)
    finally:
        await governed.aclose()  # last opened, first closed (the SDK client's task groups nest)
        await direct.aclose()
    return Pair(label, era, Stats.of(td), Stats.of(tg), cpu_d, cpu_g, own, receipt)


async def run(opts: Options, results: Results) -> None:
    seconds = 0.4 if opts.quick else 5.0
    tput_seconds = 0.3 if opts.quick else 2.5
    max_calls = 2_000 if opts.quick else 50_000
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-mcp-http-")))
        tmp = tmp / "mcp_http"
        tmp.mkdir(parents=True, exist_ok=True)
        log_path = tmp / "servers.log"
        log = stack.enter_context(open(log_path, "wb"))
        t_start = time.perf_counter()
        upstream, upstream_url = await started_upstream(stack, tmp, log, log_path)
        gateway, gateway_url, policy = await started_gateway(stack, tmp, upstream_url, log, log_path)
        startup = time.perf_counter() - t_start

        pairs: list[Pair] = []
        tput: list[tuple[str, str, int, dict[str, float]]] = []
        try:
            for mode, era in ERAS.items():
                pairs.append(await _pair("SDK client", era, SdkHttp(upstream_url, mode), SdkHttp(gateway_url, mode),
                                         upstream, gateway, seconds))
            pairs.append(await _pair("raw httpx", PROTOCOL, RawHttp(upstream_url), RawHttp(gateway_url),
                                     upstream, gateway, seconds / 2))
            for mode, era in ERAS.items():
                for callers in CONCURRENCY:
                    for path, url, proc in (("direct", upstream_url, upstream), ("gateway", gateway_url, gateway)):
                        r = await _throughput(lambda u=url, m=mode: SdkHttp(u, m), proc.pid, callers, tput_seconds,
                                              max_calls)
                        tput.append((path, era, callers, r))
        except (RuntimeError, httpx.HTTPError, OSError) as exc:
            log.flush()
            raise RuntimeError(f"{exc}; server logs:\n{log_path.read_text(errors='replace')[-2000:]}") from None
    _report(pairs, tput, results, policy=policy, seconds=seconds, tput_seconds=tput_seconds, max_calls=max_calls,
            startup=startup)


def _report(pairs: list[Pair], tput: list[tuple[str, str, int, dict[str, float]]], results: Results, *, policy: str,
            seconds: float, tput_seconds: float, max_calls: int, startup: float) -> None:
    def row(label: str, era: str, st: Stats, base: Stats | None, cpu: float) -> list[str]:
        return [label, era, str(st.n), fmt_time(st.p50), fmt_time(st.p99), fmt_time(st.mean), f"{1 / st.mean:,.0f}",
                fmt_time(cpu), "-" if base is None else f"+{fmt_time(st.p50 - base.p50)}",
                "-" if base is None else f"+{fmt_time(st.p99 - base.p99)}",
                "1.0x" if base is None else f"{st.p50 / base.p50:.2f}x"]

    rows = []
    for p in pairs:
        rows += [row(f"{p.label}, upstream direct (baseline)", p.era, p.direct, None, p.cpu_direct),
                 row(f"{p.label}, through dharma serve /mcp", p.era, p.governed, p.direct, p.cpu_gateway)]
    receipts = all(p.receipt for p in pairs)
    table("mcp_http: sequential tools/call echo over Streamable HTTP, direct vs through `dharma serve` /mcp",
          ["client / path", "era", "calls", "p50", "p99", "mean", "calls/s", "cpu/call", "added p50", "added p99",
           "x direct"], rows,
          note=f"gateway: `dharma serve` subprocess (uvicorn), {policy}, anonymous_user, SQLite ledger FULL + "
               f"Ed25519 receipts (receipt returned: {'yes' if receipts else 'NO'}), info log to a file\n"
               f"upstream: SDK server answering JSON (json_response=True); direct and gateway calls interleaved, "
               f"~{seconds:g} s per SDK pair; cpu/call = the gateway process alone (its rows) or the upstream per "
               f"call it served (baseline rows), from /proc\n"
               f"client CPU/call: " + ", ".join(f"{p.label} {p.era} {fmt_time(p.client_cpu)}" for p in pairs)
               + f"; start-up of both servers: {startup:.2f} s")
    base_rate = {(era, callers): r["rate"] for path, era, callers, r in tput if path == "direct"}
    rows = []
    for path, era, callers, r in tput:
        ratio = "1.0x" if path == "direct" else f"{r['rate'] / base_rate[(era, callers)]:.2f}x"
        rows.append([f"{'upstream direct' if path == 'direct' else 'through dharma serve'}", era, str(callers),
                     f"{int(r['n']):,}", f"{r['rate']:,.0f}", ratio, fmt_time(r["p50"]), fmt_time(r["p99"]),
                     fmt_time(r["cpu"]), fmt_time(r["client_cpu"]), str(int(r["errors"]))])
    table("mcp_http: calls/s with concurrent SDK clients (each its own connection and MCP session)",
          ["path", "era", "clients", "calls", "calls/s", "x direct", "p50", "p99", "cpu/call", "client cpu/call",
           "errors"],
          rows, note=f"~{tput_seconds:g} s per row, direct and gateway rows back to back, at most {max_calls:,} calls; "
                     "one client process drives every client (see 'client cpu/call')")
    for p in pairs:
        if p.label != "SDK client":
            continue
        results.add(Target(f"mcp http added p50 ({p.era}, SDK client)", (p.governed.p50 - p.direct.p50) * 1e3,
                           TARGET_ADDED_MS, "ms", higher_is_better=False,
                           note=f"direct p50 {fmt_time(p.direct.p50)}, through the gateway {fmt_time(p.governed.p50)}"))
        results.add(Target(f"mcp http gateway CPU per call ({p.era})", p.cpu_gateway * 1e3, TARGET_CPU_MS, "ms",
                           higher_is_better=False,
                           note=f"from /proc, sequential SDK calls; the SDK upstream spent {fmt_time(p.cpu_direct)} "
                                f"a call it served in the same run ({p.cpu_gateway / p.cpu_direct:.2f}x that: compare "
                                "runs by this ratio, a shared VM's speed drifts)"))
    for path, era, callers, r in tput:
        if path == "gateway" and callers == 8:
            results.add(Target(f"mcp http 8 clients vs direct ({era})", r["rate"] / base_rate[(era, callers)],
                               TARGET_RATIO, "x", higher_is_better=True,
                               note=f"{r['rate']:,.0f} vs {base_rate[(era, callers)]:,.0f} calls/s direct"))


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(run(Options(quick="--quick" in sys.argv), Results()))
