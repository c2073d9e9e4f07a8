"""revisions: a governed call's CPU in two checkouts of the gateway, side by side.

    python -m bench.revisions OLD_CHECKOUT NEW_CHECKOUT [--pairs 10] [--blocks 3] [--calls 400]

Each checkout runs in processes of its own under this interpreter, the checkout first on `sys.path`
(so its `gateway`, `audit` and `bench` are imported, whatever is installed): `Gateway.call` as in
`bench.governed` (the standard profile with its rule sets, a durable SQLite ledger, receipts), warmed
up, then blocks of `--calls` calls whose process CPU it reports. Two processes of one and the same
code differ by up to ~10 % (where the allocator puts objects, and the id-based hashes and set orders
that follow), so one process per checkout decides nothing: each pair of processes (one per
checkout, one hash seed) runs `--blocks` blocks each, alternating, and the figure is the median
over `--pairs` fresh pairs. Used for issue 26's "the governed call's CPU within 10 % of the code
before it" (a checkout of the older commit: `git worktree add --detach /tmp/old <commit>`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench import table

#: What each checkout's process runs: setup once, then one block per line read, its CPU per call printed.
CHILD = r"""
import asyncio, json, sys, tempfile, time
from pathlib import Path
from bench.governed import CALLS, _open, choose_policy
from bench import quiet_logging

async def main(calls):
    quiet_logging()
    tmp = Path(tempfile.mkdtemp(prefix="dharma-bench-revisions-"))
    policy, _, key = choose_policy(tmp)
    gw = await _open(tmp, "ledger", policy, "FULL")
    async def block(n):
        for i in range(n):
            tool, args = CALLS[i % len(CALLS)]
            out = await gw.call(tool, args, api_key=key, session_id="seq")
            assert out.status.value == "ok", out.status
    await block(calls)
    print("ready", flush=True)
    for _ in sys.stdin:
        cpu = time.process_time()
        await block(calls)
        print(json.dumps((time.process_time() - cpu) / calls), flush=True)

asyncio.run(main(int(sys.argv[1])))
"""


def start(checkout: Path, calls: int, seed: int) -> subprocess.Popen[str]:
    """A process running `CHILD` on `checkout`'s code with hash seed `seed`, once it has said it is ready."""
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED=str(seed))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(calls)], cwd=checkout, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"{checkout}: the governed call did not start (exit {proc.wait()})")
    return proc


def block(proc: subprocess.Popen[str]) -> float:
    """One block's CPU seconds a call."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return float(json.loads(proc.stdout.readline()))


def pair(old: Path, new: Path, seed: int, blocks: int, calls: int) -> tuple[float, float]:
    """One fresh process per checkout, `blocks` blocks each in alternation: their median CPU a call."""
    procs = {"old": start(old, calls, seed), "new": start(new, calls, seed)}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    try:
        for b in range(blocks):
            for name in ("old", "new") if (b + seed) % 2 == 0 else ("new", "old"):
                cpu[name].append(block(procs[name]))
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    return statistics.median(cpu["old"]), statistics.median(cpu["new"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.revisions", description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--calls", type=int, default=400)
    opts = parser.parse_args(argv)
    pairs = [pair(opts.old.resolve(), opts.new.resolve(), seed, opts.blocks, opts.calls) for seed in range(1, opts.pairs + 1)]
    olds, news = [o for o, _ in pairs], [n for _, n in pairs]
    old, new = statistics.median(olds), statistics.median(news)

    def us(values: list[float]) -> str:
        return f"{min(values) * 1e6:,.0f}-{max(values) * 1e6:,.0f} µs"

    table(f"revisions: governed call CPU, {opts.pairs} process pairs x {opts.blocks} alternating blocks of "
          f"{opts.calls} calls (load {os.getloadavg()[0]:.1f})",
          ["checkout", "median CPU/call", "pairs (min-max)", "vs old"],
          [[f"old  {opts.old}", f"{old * 1e6:,.0f} µs", us(olds), "1.00x"],
           [f"new  {opts.new}", f"{new * 1e6:,.0f} µs", us(news), f"{new / old:.3f}x"]],
          note="new/old per pair, sorted: " + ", ".join(f"{r:.2f}" for r in sorted(n / o for o, n in pairs)))


if __name__ == "__main__":
    main()
