"""ledger_verify: append N records with 256 concurrent appenders, then time `verify_ledger`.

Append: `SqliteLedger.append` (canonicalisation in the caller, group commit in the writer
thread), synchronous=NORMAL. Verify: `audit.verify.verify_ledger(SqliteLedgerReader(path))`
(hash of every record, chain links, Merkle root; not `strict`), on a freshly opened reader.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from audit.sqlite import SqliteLedgerReader
from audit.verify import verify_ledger
from bench import Options, Results, Target, table
from bench.ledgerfill import fill


async def run(opts: Options, results: Results) -> None:
    total = 5_000 if opts.quick else 100_000
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-verify-")))
        tmp.mkdir(parents=True, exist_ok=True)
        path = tmp / "verify.db"
        path.unlink(missing_ok=True)
        written, append_s = await fill(path, total, callers=256)
        rows = [["append (256 concurrent callers, NORMAL)", f"{written:,}", f"{append_s:.2f} s",
                 f"{written / append_s:,.0f}", "-"]]
        times: list[float] = []
        for attempt in range(2 if opts.quick else 3):
            with SqliteLedgerReader(path) as reader:
                t0 = time.perf_counter()
                report = verify_ledger(reader)
                elapsed = time.perf_counter() - t0
            times.append(elapsed)
            rows.append([f"verify_ledger (run {attempt + 1})", f"{report.size:,}", f"{elapsed:.3f} s",
                         f"{report.size / elapsed:,.0f}", "ok" if report.ok else f"FAILED: {report.problem}"])
        size_mb = path.stat().st_size / 1e6
    table("ledger_verify: append N records, then verify the whole chain and Merkle root",
          ["operation", "records", "time", "records/s", "result"], rows,
          note=f"ledger file {size_mb:.1f} MB; verify timed on a fresh reader (OS page cache warm)")
    rate = written / statistics.median(times) if times else None
    results.add(Target("ledger verify", rate, 100_000, "records/s", higher_is_better=True,
                       note=f"median of {len(times)} runs over {written:,} records"))
