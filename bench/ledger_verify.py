"""ledger_verify: verify a whole ledger, then generate inclusion and consistency proofs, on each backend.

The ledger (100,000 records; `--verify-records`; `--quick` 5,000) is built by the bulk loader
(`bench.ledgerbulk`: the records `append` would write, inserted in batches), the same records
on every backend, ending with a checkpoint signed by a throwaway key. Verify:
`audit.verify.verify_ledger(reader, keys=…)` on a freshly opened reader, as `dharma audit verify` runs it
(hash of every record, chain links, Merkle root, derived columns, rule-index rows and stored subtree
hashes against the records, every stored checkpoint, meta and head row; not `strict`), three times
(the target uses the median). Stored checkpoint rows: `audit.verify_rows.check_checkpoints` over
1,000 stamped rows with the key (a ledger stores about one a second while it grows), per row. Proofs: what `dharma audit proof` computes,
`audit.proofs.inclusion` for random records and `audit.proofs.consistency` from a random older
size to the current one, each read from the stored subtree hashes and checked against the root the
signed checkpoint vouches for; then the same proofs from every leaf hash (`reader.leaf_hashes`
and `audit.merkle`, what proofs cost before subtree hashes were stored), for the ratio.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import proofs
from audit.checkpoint import CheckpointSigner
from audit.postgres import PostgresLedgerReader
from audit.sqlite import SqliteLedgerReader
from audit.verify import verify_ledger
from audit.verify_rows import check_checkpoints
from bench import BACKEND_NAMES, Options, Results, Target, fmt_time, sample_sync, table
from bench.ledgerbulk import PostgresSink, SqliteSink, Sink, load


def open_reader(backend: str, location: Path | str) -> Any:
    """A reader of the ledger at `location` on `backend`."""
    return PostgresLedgerReader(str(location)) if backend == "postgres" else SqliteLedgerReader(location)


SIGNER = CheckpointSigner(Ed25519PrivateKey.generate(), "bench-checkpoints", "bench.example/karma")
"""The throwaway checkpoint key of the bulk-loaded ledgers."""
KEYS = [(SIGNER.key_name, SIGNER.private_key.public_key())]
CHECKPOINT_ROWS = 1_000


def checkpoint_row_cost() -> list[str]:
    """Seconds to check one stored checkpoint row (parse, signature, stamp, links), over CHECKPOINT_ROWS rows."""
    rows: list[tuple[int, str, str]] = []
    start = time.time_ns() // 1000
    for i in range(1, CHECKPOINT_ROWS + 1):
        note, created_at = SIGNER.sign_stored(i * 100, random.randbytes(32), rows[-1][0] if rows else None,
                                              start + i * 1_000_000)
        rows.append((i * 100, note, created_at))
    t0, cpu0 = time.perf_counter(), time.process_time()
    checked = check_checkpoints(rows, KEYS)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return ["stored checkpoint rows, check_checkpoints", f"{CHECKPOINT_ROWS:,}", f"{elapsed:.3f} s",
            f"{CHECKPOINT_ROWS / elapsed:,.0f}", f"{cpu:.3f} s", f"{CHECKPOINT_ROWS / cpu:,.0f}",
            checked.problem or "ok"]


async def build(opts: Options, directory: Path, stem: str, total: int) -> tuple[dict[str, Path | str], str]:
    """Bulk-load the same `total` records into a fresh ledger on each backend (with a checkpoint at
    the end signed by SIGNER); return the locations and a note saying how long it took."""
    locations = {b: opts.new_ledger(b, directory, stem) for b in opts.ledger_backends()}
    sinks: list[Sink] = [await PostgresSink.create(str(loc)) if b == "postgres" else await SqliteSink.create(Path(loc))
                         for b, loc in locations.items()]
    seconds = load(total, sinks, SIGNER)
    each = ", ".join(f"{BACKEND_NAMES[b]} writer {sink.seconds:.1f} s" for b, sink in zip(locations, sinks, strict=True))
    return locations, (f"bulk-loaded {total:,} records into {len(locations)} ledger(s) in {seconds:.1f} s "
                       f"({total / seconds:,.0f} records/s; {each}, side by side)")


async def run(opts: Options, results: Results) -> None:
    total = opts.verify_records or (5_000 if opts.quick else 100_000)
    runs = 2 if opts.quick else 3
    proofs_n = 5 if opts.quick else 20
    verify_rows: list[list[str]] = []
    proof_rows: list[list[str]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(opts.workdir) if opts.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="dharma-bench-verify-")))
        tmp.mkdir(parents=True, exist_ok=True)
        locations, loaded = await build(opts, tmp, "verify", total)
        for backend, location in locations.items():
            name = BACKEND_NAMES[backend]
            times: list[float] = []
            for attempt in range(runs):
                with open_reader(backend, location) as reader:
                    t0, cpu0 = time.perf_counter(), time.process_time()
                    report = verify_ledger(reader, keys=KEYS)
                    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                times.append(elapsed)
                verify_rows.append([f"{name}, verify_ledger (run {attempt + 1})", f"{report.size:,}", f"{elapsed:.3f} s",
                                    f"{report.size / elapsed:,.0f}", f"{cpu:.3f} s", f"{report.size / cpu:,.0f}",
                                    "ok" if report.ok else f"FAILED: {report.problem}"])
            results.add(Target(f"ledger verify ({name})", total / statistics.median(times), 100_000, "records/s",
                               higher_is_better=True, note=f"median of {runs} runs over {total:,} records"))
            pick = random.Random(7)
            with open_reader(backend, location) as reader:
                measured = {
                    "inclusion proof": lambda: proofs.inclusion(reader, pick.randint(1, total), total, SIGNER),
                    "consistency proof": lambda: proofs.consistency(reader, pick.randint(1, total - 1), total, SIGNER),
                    "inclusion proof, from every leaf hash": lambda: reader.inclusion_proof(pick.randint(1, total)),
                    "consistency proof, from every leaf hash": lambda: reader.consistency_proof(pick.randint(1, total - 1)),
                }
                stats = {kind: sample_sync(run, seconds=0.0, min_n=proofs_n, max_n=proofs_n, warmup=1)
                         for kind, run in measured.items()}
            for kind, got in stats.items():
                base = stats[kind.split(",")[0]]
                ratio = f"{got.p50 / base.p50:,.0f}x" if got is not base else "1x"
                proof_rows.append([f"{name}, {kind}", f"{total:,}", str(got.n), fmt_time(got.p50), fmt_time(got.p99),
                                   fmt_time(got.mean), ratio])
    verify_rows.append(checkpoint_row_cost())
    opts.skipped_backends("ledger verify", results)
    table("ledger_verify: verify the whole chain, Merkle root and indexes",
          ["backend, operation", "records (rows)", "time", "per s", "python cpu", "per s per python core", "result"],
          verify_rows,
          note=f"{loaded}; verify timed on a fresh reader (OS page cache warm); 'python cpu' = this process's "
               "CPU time (the database server's is not in it)")
    table("ledger_proof: proof generation, as `dharma audit proof` does it (stored subtree hashes, checked root)",
          ["backend, proof", "tree size", "proofs", "p50", "p99", "mean", "x stored"], proof_rows,
          note="random records (inclusion) and random older sizes (consistency to the current size); "
               "'from every leaf hash' = the same proof from all leaf hashes (the cost before subtree hashes were stored)")

