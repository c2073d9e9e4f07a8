"""ledger_verify: verify a whole ledger, then generate inclusion and consistency proofs, on each backend.

The ledger (100,000 records; `--verify-records`; `--quick` 5,000) is built by the bulk loader
(`bench.ledgerbulk`: the records `append` would write, inserted in batches), the same records
on every backend. Verify: `audit.verify.verify_ledger(reader)` on a freshly opened reader (hash
of every record, chain links, Merkle root, derived columns and rule-index rows against the
record bytes; not `strict`), three times (the target uses the median). Proofs: what `dharma
audit proof` computes, `reader.inclusion_proof(seq)` for random records and
`reader.consistency_proof(old)` from a random older size to the current one; both read every
leaf hash of the tree, so they grow with the ledger.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from audit.postgres import PostgresLedgerReader
from audit.sqlite import SqliteLedgerReader
from audit.verify import verify_ledger
from bench import BACKEND_NAMES, Options, Results, Target, fmt_time, sample_sync, table
from bench.ledgerbulk import PostgresSink, SqliteSink, Sink, load


def open_reader(backend: str, location: Path | str) -> Any:
    """A reader of the ledger at `location` on `backend`."""
    return PostgresLedgerReader(str(location)) if backend == "postgres" else SqliteLedgerReader(location)


async def build(opts: Options, directory: Path, stem: str, total: int) -> tuple[dict[str, Path | str], float]:
    """Bulk-load the same `total` records into a fresh ledger on each backend; return locations and seconds."""
    locations = {b: opts.new_ledger(b, directory, stem) for b in opts.ledger_backends()}
    sinks: list[Sink] = [await PostgresSink.create(str(loc)) if b == "postgres" else await SqliteSink.create(Path(loc))
                         for b, loc in locations.items()]
    return locations, load(total, sinks)


async def run(opts: Options, results: Results) -> None:
    total = opts.verify_records or (5_000 if opts.quick else 100_000)
    runs = 2 if opts.quick else 3
    proofs = 5 if opts.quick else 20
    verify_rows: list[list[str]] = []
    proof_rows: list[list[str]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-verify-")))
        tmp.mkdir(parents=True, exist_ok=True)
        locations, load_s = await build(opts, tmp, "verify", total)
        for backend, location in locations.items():
            name = BACKEND_NAMES[backend]
            times: list[float] = []
            for attempt in range(runs):
                with open_reader(backend, location) as reader:
                    t0 = time.perf_counter()
                    report = verify_ledger(reader)
                    elapsed = time.perf_counter() - t0
                times.append(elapsed)
                verify_rows.append([f"{name}, verify_ledger (run {attempt + 1})", f"{report.size:,}", f"{elapsed:.3f} s",
                                    f"{report.size / elapsed:,.0f}", "ok" if report.ok else f"FAILED: {report.problem}"])
            results.add(Target(f"ledger verify ({name})", total / statistics.median(times), 100_000, "records/s",
                               higher_is_better=True, note=f"median of {runs} runs over {total:,} records"))
            pick = random.Random(7)
            with open_reader(backend, location) as reader:
                inclusion = sample_sync(lambda: reader.inclusion_proof(pick.randint(1, total)), seconds=0.0,
                                        min_n=proofs, max_n=proofs, warmup=1)
                consistency = sample_sync(lambda: reader.consistency_proof(pick.randint(1, total - 1)), seconds=0.0,
                                          min_n=proofs, max_n=proofs, warmup=1)
            for kind, stats in (("inclusion", inclusion), ("consistency", consistency)):
                proof_rows.append([f"{name}, {kind} proof", f"{total:,}", str(stats.n), fmt_time(stats.p50),
                                   fmt_time(stats.p99), fmt_time(stats.mean)])
    opts.skipped_backends("ledger verify", results)
    table("ledger_verify: verify the whole chain, Merkle root and indexes",
          ["backend, operation", "records", "time", "records/s", "result"], verify_rows,
          note=f"bulk-loaded {total:,} records into {len(locations)} ledger(s) in {load_s:.1f} s; "
               "verify timed on a fresh reader (OS page cache warm)")
    table("ledger_proof: proof generation (reads every leaf hash of the tree, as `dharma audit proof` does)",
          ["backend, proof", "tree size", "proofs", "p50", "p99", "mean"], proof_rows,
          note="random records (inclusion) and random older sizes (consistency to the current size)")

