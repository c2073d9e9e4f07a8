"""ledger_query: a query by principal and time window over a large ledger.

The ledger is written through `SqliteLedger.append` (256 concurrent appenders, batches of up
to 1,024, synchronous=NORMAL): 1,000,000 records, or 300,000 when the first 20,000 show that
1M would take more than ~60 s (the run says so). 100 principals, times spread evenly over 30
days. The query is `audit.query.query_records(reader, principal=..., since=..., until=...)`,
fully consumed (records decoded to dicts). Its window is 1 day at 1M records and scaled up
by 1M/N for a smaller ledger, so it returns about as many records (~330) as at 1M (capped
at the 30 days the quick run's 20,000 records span, ~200 per principal).
Timed: the first query on a freshly opened reader ("cold": OS page cache warm, SQLite cache
cold), then repeated queries for other principals ("warm").
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from audit.query import query_records
from audit.sqlite import SqliteLedgerReader
from bench import Options, Results, Stats, Target, fmt_time, table
from bench.ledgerfill import PRINCIPALS, SPAN, START, fill

FULL_SIZE = 1_000_000
FALLBACK_SIZE = 300_000
BUDGET_S = 60.0


async def run(opts: Options, results: Results) -> None:
    total = 20_000 if opts.quick else FULL_SIZE
    note = ""
    fallback = False

    def too_slow(done: int, elapsed: float) -> bool:
        nonlocal fallback
        if total == FULL_SIZE and done >= 20_000 and not fallback and elapsed / done * FULL_SIZE > BUDGET_S:
            fallback = True
        return fallback and done >= FALLBACK_SIZE

    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-query-")))
        tmp.mkdir(parents=True, exist_ok=True)
        path = tmp / "query.db"
        path.unlink(missing_ok=True)
        written, append_s = await fill(path, total, callers=256, batch_max=1024, stop_if=too_slow)
        if fallback:
            note = (f"1M records would take ~{append_s / written * FULL_SIZE:.0f} s to append at "
                    f"{written / append_s:,.0f}/s: used {written:,} records instead")
        # Entry times are spread for `total` records over 30 days (an early stop keeps that
        # density over a shorter span). A window of 1 day * 1M/total holds what 1 day holds at 1M.
        covered = SPAN * (written / total)
        window = min(timedelta(days=1) * (FULL_SIZE / total), covered)
        since = START + (covered - window) / 2
        until = since + window
        cold: Stats | None = None
        counts: list[int] = []
        with SqliteLedgerReader(path) as reader:
            t0 = time.perf_counter()
            first = list(query_records(reader, principal="user-007", since=since, until=until))
            cold_s = time.perf_counter() - t0
            samples: list[float] = []
            for i in range(30 if opts.quick else 200):
                who = f"user-{(i * 37) % PRINCIPALS:03d}"
                t0 = time.perf_counter()
                got = list(query_records(reader, principal=who, since=since, until=until))
                samples.append(time.perf_counter() - t0)
                counts.append(len(got))
            warm = Stats.of(samples)
            t0 = time.perf_counter()
            everything = sum(1 for _ in query_records(reader, principal="user-042"))
            all_s = time.perf_counter() - t0
        cold = Stats.of([cold_s])
        size_mb = path.stat().st_size / 1e6
    table(
        "ledger_query: query_records(principal=..., since=..., until=...) over a large ledger",
        ["query", "ledger records", "matched", "p50", "p99", "mean", "records/s decoded"],
        [
            ["1 principal, time window, first (cold)", f"{written:,}", f"{len(first):,}", fmt_time(cold.p50), "-", "-",
             f"{len(first) / cold_s:,.0f}"],
            ["1 principal, time window, repeated (warm)", f"{written:,}", f"{sum(counts) / len(counts):,.0f} avg",
             fmt_time(warm.p50), fmt_time(warm.p99), fmt_time(warm.mean), f"{sum(counts) / sum(samples):,.0f}"],
            ["1 principal, all time", f"{written:,}", f"{everything:,}", fmt_time(all_s), "-", "-",
             f"{everything / all_s:,.0f}"],
        ],
        note=(f"appended {written:,} records in {append_s:.1f} s ({written / append_s:,.0f} records/s), "
              f"file {size_mb:.0f} MB; window {window.total_seconds() / 3600:.1f} h"
              + (f"\n{note}" if note else "")),
    )
    scale = "" if written >= FULL_SIZE else f"over {written:,} records, window scaled to match 1M's result size"
    if note:
        scale = note + "; window scaled to match 1M's result size"
    results.add(Target("ledger query by principal+time (1M records)", max(cold_s, warm.p99) * 1e3, 100, "ms",
                       higher_is_better=False, note=f"worst of cold and warm p99; {scale}" if scale else
                       "worst of cold and warm p99"))
