"""ledger_append: records/s through the real ledger writers with 1, 8 and 64 concurrent callers.

Each row opens a fresh ledger (`SqliteLedger`, synchronous FULL then NORMAL; `PostgresLedger` on
a server with fsync on), lets N callers (`asyncio.gather`) each await `append` of the next
`bench.ledgerfill` entry in a loop for a fixed time, and counts the committed records. Group
commit batches whatever queued meanwhile, so more callers means larger batches. Latency is per
`append` call (canonicalisation, queueing, commit, answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

from audit.postgres import PostgresLedger
from audit.sqlite import SqliteLedger
from bench import BACKEND_NAMES, Options, Results, Stats, fmt_time, table
from bench.ledgerfill import entry

CALLERS = (1, 8, 64)
WARMUP = 20
SPREAD = 10_000_000  # entry times are spread as if the ledger held this many records


async def _open(backend: str, location: Path | str, synchronous: str) -> Any:
    if backend == "postgres":
        return await PostgresLedger.open(str(location))
    return await SqliteLedger.open(location, synchronous=synchronous)  # type: ignore[arg-type]


async def _drive(ledger: Any, callers: int, seconds: float) -> tuple[int, float, Stats]:
    """Append from `callers` concurrent loops for `seconds`; return (records, elapsed s, latency)."""
    numbers = itertools.count()
    for _ in range(WARMUP):
        await ledger.append(entry(next(numbers), SPREAD))
    latencies: list[float] = []
    clock = time.perf_counter
    deadline = clock() + seconds

    async def caller() -> None:
        while clock() < deadline:
            item = entry(next(numbers), SPREAD)
            t0 = clock()
            await ledger.append(item)
            latencies.append(clock() - t0)

    t0 = clock()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return len(latencies), clock() - t0, Stats.of(latencies)


async def run(opts: Options, results: Results) -> None:
    seconds = opts.append_seconds or (0.3 if opts.quick else 3.0)
    rows: list[list[str]] = []
    variants = [(b, s) for b in opts.ledger_backends() for s in (("FULL", "NORMAL") if b == "sqlite" else ("on",))]
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-append-")))
        tmp.mkdir(parents=True, exist_ok=True)
        for backend, durability in variants:
            for callers in CALLERS:
                location = opts.new_ledger(backend, tmp, "append")
                ledger = await _open(backend, location, durability)
                try:
                    count, elapsed, lat = await _drive(ledger, callers, seconds)
                finally:
                    await ledger.aclose()
                label = (f"SQLite, synchronous {durability}" if backend == "sqlite"
                         else "PostgreSQL, fsync on, synchronous_commit on")
                rows.append([label, str(callers), f"{count:,}", f"{count / elapsed:,.0f}", fmt_time(lat.p50),
                             fmt_time(lat.p99), fmt_time(lat.mean)])
    skipped = [BACKEND_NAMES[b] for b in opts.backends if b not in opts.ledger_backends()]
    table("ledger_append: records/s through the ledger writer (group commit), concurrent callers",
          ["ledger", "callers", "records", "records/s", "append p50", "append p99", "mean"], rows,
          note=f"~{seconds:g} s per row, a fresh ledger per row; entries shaped like the gateway's"
               + (f"\nnot run: {', '.join(skipped)} (PostgreSQL {opts.postgres_missing})" if skipped else ""))
