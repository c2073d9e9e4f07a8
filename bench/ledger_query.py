"""ledger_query: a query by principal and time window over a 1,000,000-record ledger, on each backend.

The ledger (1,000,000 records; `--query-records`; `--quick` 20,000) is built by the bulk loader
(`bench.ledgerfill` entries chained and inserted in batches: the records `append` would write),
the same records on every backend. 100 principals, times spread evenly over 30 days. The query
is `audit.query.query_records(reader, principal=..., since=..., until=...)`, fully consumed
(records decoded to dicts, each hit re-checked against its bytes). Its window is 1 day at 1M
records and scaled up by 1M/N for a smaller ledger, so it returns about as many records (~330)
as at 1M (capped at the 30 days the ledger spans). Timed: the first query on a freshly opened
reader ("cold": OS page cache warm, database cache cold), then repeated queries for other
principals ("warm"), then all of one principal's records.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from audit.query import query_records
from bench import BACKEND_NAMES, Options, Results, Stats, Target, fmt_time, table
from bench.ledger_verify import build, open_reader
from bench.ledgerfill import PRINCIPALS, SPAN, START

FULL_SIZE = 1_000_000
TARGET = "ledger query by principal+time (1M records)"


async def run(opts: Options, results: Results) -> None:
    total = opts.query_records or (20_000 if opts.quick else FULL_SIZE)
    window = min(timedelta(days=1) * (FULL_SIZE / total), SPAN)
    since = START + (SPAN - window) / 2
    until = since + window
    rows: list[list[str]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-query-")))
        tmp.mkdir(parents=True, exist_ok=True)
        locations, loaded = await build(opts, tmp, "query", total)
        sizes = []
        if "sqlite" in locations:
            sizes.append(f"SQLite file {Path(locations['sqlite']).stat().st_size / 1e6:,.0f} MB")
        for backend, location in locations.items():
            name = BACKEND_NAMES[backend]
            counts: list[int] = []
            samples: list[float] = []
            with open_reader(backend, location) as reader:
                t0 = time.perf_counter()
                first = list(query_records(reader, principal="user-007", since=since, until=until))
                cold_s = time.perf_counter() - t0
                for i in range(30 if opts.quick else 200):
                    who = f"user-{(i * 37) % PRINCIPALS:03d}"
                    t0 = time.perf_counter()
                    got = list(query_records(reader, principal=who, since=since, until=until))
                    samples.append(time.perf_counter() - t0)
                    counts.append(len(got))
                t0 = time.perf_counter()
                everything = sum(1 for _ in query_records(reader, principal="user-042"))
                all_s = time.perf_counter() - t0
            warm = Stats.of(samples)
            rows += [
                [f"{name}, 1 principal, time window, first (cold)", f"{total:,}", f"{len(first):,}", fmt_time(cold_s),
                 "-", "-", f"{len(first) / cold_s:,.0f}"],
                [f"{name}, 1 principal, time window, repeated (warm)", f"{total:,}", f"{sum(counts) / len(counts):,.0f} avg",
                 fmt_time(warm.p50), fmt_time(warm.p99), fmt_time(warm.mean), f"{sum(counts) / sum(samples):,.0f}"],
                [f"{name}, 1 principal, all time", f"{total:,}", f"{everything:,}", fmt_time(all_s), "-", "-",
                 f"{everything / all_s:,.0f}"],
            ]
            scale = "" if total >= FULL_SIZE else f"; over {total:,} records, window scaled to match 1M's result size"
            results.add(Target(f"{TARGET} ({name})", max(cold_s, warm.p99) * 1e3, 100, "ms", higher_is_better=False,
                               note=f"worst of cold and warm p99{scale}"))
    opts.skipped_backends(TARGET, results)
    table(
        "ledger_query: query_records(principal=..., since=..., until=...) over a large ledger",
        ["backend, query", "ledger records", "matched", "p50", "p99", "mean", "records/s decoded"], rows,
        note=(loaded
              + (f" ({', '.join(sizes)})" if sizes else "") + f"; window {window.total_seconds() / 3600:.1f} h"),
    )
