"""mcp_http_sides: where `/mcp`'s CPU per call goes with the upstream's answer shape and the policy,
side by side (issue 26 item 4). Not part of `python -m bench`; run it on its own:

    python -m bench.mcp_http_sides [--rounds 6] [--calls 200]

Upstreams: `bench/mcp_server.py http --json` three times, echo answering in each shape of
`bench.mcp_server.SHAPES` (the SDK's default for a `str`: a text block, `structuredContent` and an
`outputSchema`; text only; a small object with its schema). Gateways: `dharma serve` as in
`mcp_http`, one per variant below, all running at once. One official SDK client (2025-11-25) per
gateway and per upstream. Each round runs one block of `--calls` sequential calls per variant, in an
order rotated every round, so a drift of the machine's speed falls on every variant alike. Per
block: the CPU per call of the gateway (from /proc; all its threads) and of its upstream. A slow
phase of a shared VM moves the upstream's CPU too, so the ratio gateway / upstream is printed beside
the milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import fmt_time, positive, table
from bench.mcp_http import REPO, SdkHttp, started_gateway, started_upstream
from bench.mcp_stdio import proc_cpu
from bench.mcp_server import SHAPES

PERMISSIVE = (REPO / "policies" / "permissive.yaml", "policies/permissive.yaml")


@dataclass
class Variant:
    """One path measured: a client to a gateway (or straight to an upstream)."""

    label: str
    shape: str
    policy: str
    server: int  # the pid whose CPU is this path's own: the gateway, or the upstream when direct
    upstream: int
    url: str
    client: SdkHttp | None = None
    own: list[float] = field(default_factory=list)  # CPU per call of `server`, one per block
    up: list[float] = field(default_factory=list)  # CPU per call of the upstream, one per block


async def _block(v: Variant, calls: int) -> None:
    assert v.client is not None
    own0, up0 = proc_cpu(v.server), proc_cpu(v.upstream)
    for _ in range(calls):
        await v.client.echo()
    v.own.append((proc_cpu(v.server) - own0) / calls)
    v.up.append((proc_cpu(v.upstream) - up0) / calls)


async def _variants(stack: contextlib.ExitStack, tmp: Path) -> list[Variant]:
    log_path = tmp / "servers.log"
    log = stack.enter_context(open(log_path, "wb"))
    out: list[Variant] = []
    for shape in SHAPES:
        upstream, url = await started_upstream(stack, tmp, log, log_path, shape)
        out.append(Variant("upstream direct", shape, "-", upstream.pid, upstream.pid, url))
        policies: list[tuple[Path, str] | None] = [None] if shape != "default" else [None, PERMISSIVE]
        for policy in policies:
            state = tmp / f"gw-{shape}-{len(out)}"
            state.mkdir()
            gateway, gurl, what = await started_gateway(stack, state, url, log, log_path, policy)
            out.append(Variant("through dharma serve", shape, what.split(" (")[0], gateway.pid, upstream.pid, gurl))
    return out


async def run(rounds: int, calls: int) -> list[Variant]:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dharma-bench-sides-")))
        variants = await _variants(stack, tmp)
        async with contextlib.AsyncExitStack() as clients:
            for v in variants:
                v.client = SdkHttp(v.url, "legacy")
                await v.client.initialize()
                clients.push_async_callback(v.client.aclose)
                for _ in range(50):  # warm: connections, caches, the first compile of every pattern
                    await v.client.echo()
            for r in range(rounds):
                k = r % len(variants)
                for v in variants[k:] + variants[:k]:
                    await _block(v, calls)
    return variants


def report(variants: list[Variant], rounds: int, calls: int, load: tuple[float, float]) -> None:
    direct = {v.shape: statistics.median(v.own) for v in variants if v.label == "upstream direct"}
    rows = []
    for v in variants:
        own, up = statistics.median(v.own), statistics.median(v.up)
        rows.append([v.label, v.shape, v.policy, fmt_time(own), f"{min(v.own) * 1e3:.3f}-{max(v.own) * 1e3:.3f} ms",
                     fmt_time(up), "-" if v.label == "upstream direct" else f"{own / direct[v.shape]:.2f}"])
    table("mcp_http_sides: CPU per tools/call echo by upstream answer shape and policy, side by side",
          ["path", "answer shape", "policy", "cpu/call (median)", "range of blocks", "upstream cpu/call",
           "gateway / direct upstream"], rows,
          note=f"{rounds} rounds x {calls} sequential SDK calls (2025-11-25) per path, order rotated each round; "
               f"load average {load[0]:.1f} at start, {load[1]:.1f} at end; cpu from /proc (all threads)")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_http_sides",
                                     description="/mcp's CPU per call by upstream answer shape and policy, side by side")
    parser.add_argument("--rounds", type=positive(int), default=6)
    parser.add_argument("--calls", type=positive(int), default=200, help="sequential calls per block")
    args = parser.parse_args()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    variants = asyncio.run(run(args.rounds, args.calls))
    report(variants, args.rounds, args.calls, (load0, os.getloadavg()[0]))
    print(f"   (took {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
