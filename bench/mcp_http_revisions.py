"""mcp_http_revisions: `/mcp`'s cost per tools/call in two checkouts of the gateway, side by side.

    python -m bench.mcp_http_revisions OLD_CHECKOUT NEW_CHECKOUT [--pairs 6] [--blocks 4] [--calls 600]
                                       [--clients 1] [--client raw|sdk]

The `mcp_http` workload (`bench.mcp_http`: the SDK upstream answering JSON, the standard profile with
every rule set, SQLite FULL, receipts, info log to a file), one upstream for both checkouts. Each
checkout's `dharma serve` runs its own code (the checkout first on `PYTHONPATH`, its directory the
working directory), `--clients` clients (2025-11-25 sessions, each its own connection; raw httpx
POSTs, or `--client sdk` for the official SDK client as `bench.mcp_http`'s throughput rows use) each,
warmed up. Two processes of the same code differ by several per cent (allocation, hash seeds), so each
pair of fresh gateways (one per checkout, one `PYTHONHASHSEED`) runs `--blocks` blocks of `--calls`
calls each (split over the clients, calling back to back), alternating who goes first; per block, the
gateway's CPU per call (from /proc, all its threads), its calls/s and its calls' latencies. The figures
are the medians over `--pairs` pairs; a shared VM's speed drifts, so the per-pair new/old ratios are
printed too. Used for issue 26's /mcp cuts (an older commit's tree:
`git archive COMMIT | tar -x -C /tmp/old`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench import positive, table
from bench.mcp_http import Caller, RawHttp, SdkHttp, started_gateway, started_upstream
from bench.mcp_stdio import proc_cpu

NAMES = ("old", "new")


async def _block(clients: list[Caller], pid: int, calls: int) -> tuple[float, float, list[float]]:
    """`calls` echo calls, each client calling back to back its share: the gateway's CPU per call, the
    calls/s and each call's latency."""
    clock = time.perf_counter
    lat: list[float] = []

    async def one(client: Caller, n: int) -> None:
        for _ in range(n):
            t0 = clock()
            await client.echo()
            lat.append(clock() - t0)

    share = calls // len(clients)
    cpu0, wall0 = proc_cpu(pid), clock()
    await asyncio.gather(*(one(c, share) for c in clients))
    wall = clock() - wall0
    return (proc_cpu(pid) - cpu0) / len(lat), len(lat) / wall, lat


def _client(url: str, kind: str) -> Caller:
    return SdkHttp(url, "legacy") if kind == "sdk" else RawHttp(url)


async def _pair(checkouts: dict[str, Path], tmp: Path, upstream: str, seed: int, opts: argparse.Namespace,
                log_path: Path) -> dict[str, tuple[float, float, float]]:
    """One fresh gateway per checkout (hash seed `seed`), alternating blocks: each one's mean CPU
    per call, mean calls/s and p50 latency."""
    cpu: dict[str, list[float]] = {n: [] for n in NAMES}
    rate: dict[str, list[float]] = {n: [] for n in NAMES}
    lat: dict[str, list[float]] = {n: [] for n in NAMES}
    async with contextlib.AsyncExitStack() as clients:
        with contextlib.ExitStack() as stack, open(log_path, "ab") as log:
            gateways = {}
            for name in NAMES:
                state = tmp / f"{name}-{seed}"
                state.mkdir()
                gw, url, _ = await started_gateway(stack, state, upstream, log, log_path, None, checkouts[name],
                                                   PYTHONHASHSEED=str(seed))
                opened = []
                for _ in range(opts.clients):
                    client = _client(url, opts.client)
                    await client.initialize()
                    clients.push_async_callback(client.aclose)  # closed last opened first (SDK task groups nest)
                    opened.append(client)
                await _block(opened, gw.pid, 100 * opts.clients)  # warm up
                gateways[name] = (gw.pid, opened)
            for b in range(opts.blocks):
                for name in NAMES if (b + seed) % 2 == 0 else NAMES[::-1]:
                    pid, opened = gateways[name]
                    c, r, times = await _block(opened, pid, opts.calls)
                    cpu[name].append(c)
                    rate[name].append(r)
                    lat[name].extend(times)
            await clients.aclose()  # before the gateways stop
    # the mean of the blocks, not their median: /proc counts CPU in 10 ms ticks, and a mean over blocks
    # averages that rounding out where a median keeps it
    return {n: (statistics.fmean(cpu[n]), statistics.median(lat[n]), statistics.fmean(rate[n])) for n in NAMES}


async def run(old: Path, new: Path, opts: argparse.Namespace) -> list[dict[str, tuple[float, float, float]]]:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dharma-bench-http-rev-")))
        log_path = tmp / "servers.log"
        log = stack.enter_context(open(log_path, "ab"))
        _, upstream = await started_upstream(stack, tmp, log, log_path)
        checkouts = {"old": old, "new": new}
        out = []
        for seed in range(1, opts.pairs + 1):
            out.append(await _pair(checkouts, tmp, upstream, seed, opts, log_path))
            got = {n: f"{out[-1][n][0] * 1e6:,.0f} µs, {out[-1][n][2]:,.0f} calls/s" for n in NAMES}
            print(f"   pair {seed}/{opts.pairs}: old {got['old']}; new {got['new']} (load {os.getloadavg()[0]:.1f})",
                  flush=True)
        return out


def report(results: list[dict[str, tuple[float, float, float]]], opts: argparse.Namespace, load: tuple[float, float]) -> None:
    def col(name: str, i: int) -> list[float]:
        return [r[name][i] for r in results]

    rows = []
    for name in NAMES:
        cpu, p50, rate = col(name, 0), col(name, 1), col(name, 2)
        ratio = statistics.median(cpu) / statistics.median(col("old", 0))
        rows.append([f"{name}  {getattr(opts, name)}", f"{statistics.median(cpu) * 1e6:,.0f} µs",
                     f"{min(cpu) * 1e6:,.0f}-{max(cpu) * 1e6:,.0f} µs", f"{ratio:.3f}x",
                     f"{statistics.median(rate):,.0f}", f"{statistics.median(p50) * 1e3:.3f} ms"])
    ratios = sorted(r["new"][0] / r["old"][0] for r in results)
    diffs = sorted((r["new"][0] - r["old"][0]) * 1e6 for r in results)
    rates = sorted(r["new"][2] / r["old"][2] for r in results)
    who = "raw httpx" if opts.client == "raw" else "SDK"
    table(f"mcp_http_revisions: /mcp tools/call, {opts.pairs} gateway pairs x {opts.blocks} alternating blocks of "
          f"{opts.calls} calls from {opts.clients} {who} client(s) (load {load[0]:.1f} at start, {load[1]:.1f} at end)",
          ["checkout", "gateway cpu/call (median)", "pairs (min-max)", "vs old", "calls/s", "p50 latency"], rows,
          note="new/old cpu per pair, sorted: " + ", ".join(f"{r:.3f}" for r in ratios)
               + f"; new-old per pair: median {statistics.median(diffs):+.0f} µs ("
               + ", ".join(f"{d:+.0f}" for d in diffs) + ")\nnew/old calls/s per pair, sorted: "
               + ", ".join(f"{r:.3f}" for r in rates))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_http_revisions", description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--pairs", type=positive(int), default=6)
    parser.add_argument("--blocks", type=positive(int), default=4)
    parser.add_argument("--calls", type=positive(int), default=600)
    parser.add_argument("--clients", type=positive(int), default=1, help="concurrent clients per gateway")
    parser.add_argument("--client", choices=("raw", "sdk"), default="raw", help="raw httpx POSTs or the SDK client")
    opts = parser.parse_args(argv)
    for path in (opts.old, opts.new):
        if not (path / "gateway" / "__init__.py").is_file():
            parser.error(f"{path}: not a checkout of the gateway (no gateway/__init__.py)")
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    results = asyncio.run(run(opts.old.resolve(), opts.new.resolve(), opts))
    report(results, opts, (load0, os.getloadavg()[0]))
    print(f"   (took {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
