"""`python -m bench [--quick] [--only NAME ...] [--dir PATH]`: print the §8 figures."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import platform
import sys
import time

from bench import BENCHMARKS, LEDGER_BACKENDS, LEDGER_BENCHMARKS, Options, Results, positive, quiet_logging
from tests.pg import pg_bin, running_postgres


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a much shorter run (smoke test)")
    parser.add_argument("--only", action="append", choices=BENCHMARKS, metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")
    parser.add_argument("--dir", default=None, help="directory for the ledgers (default: a temp dir on /tmp)")
    parser.add_argument("--backend", action="append", choices=LEDGER_BACKENDS,
                        help="ledger backend of the ledger_* benchmarks (repeatable; default: both)")
    parser.add_argument("--append-seconds", type=positive(float), default=None, metavar="S",
                        help="ledger_append: seconds per row (default 3, --quick 0.3)")
    parser.add_argument("--verify-records", type=positive(int), default=None, metavar="N",
                        help="ledger_verify: ledger size (default 100,000, --quick 5,000)")
    parser.add_argument("--query-records", type=positive(int), default=None, metavar="N",
                        help="ledger_query: ledger size (default 1,000,000, --quick 20,000)")
    args = parser.parse_args(argv)
    quiet_logging()
    chosen = [b for b in BENCHMARKS if not args.only or b in args.only]
    backends = tuple(b for b in LEDGER_BACKENDS if not args.backend or b in args.backend)
    with contextlib.ExitStack() as stack:
        postgres, missing = None, "not chosen (--backend)"
        if "postgres" in backends and set(chosen) & {*LEDGER_BENCHMARKS, "replicas"}:
            bindir = pg_bin()
            missing = "binaries not installed (/usr/lib/postgresql/*/bin)"
            if bindir is not None:
                postgres = stack.enter_context(running_postgres(bindir, fsync=True))
        opts = Options(quick=args.quick, workdir=args.dir, backends=backends, postgres=postgres,
                       postgres_missing=missing, append_seconds=args.append_seconds,
                       verify_records=args.verify_records, query_records=args.query_records)
        return _run(opts, chosen)


def _run(opts: Options, chosen: list[str]) -> int:
    print(f"Dharma Gateway benchmarks ({'quick' if opts.quick else 'full'} run): Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform(terse=True)}")
    load = os.getloadavg()
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other processes share these CPUs: "
          "wall-clock p99s are noisy; cpu/call columns are not)")
    results = Results()
    started = time.perf_counter()
    for name in chosen:
        module = importlib.import_module(f"bench.{name}")
        t0 = time.perf_counter()
        asyncio.run(module.run(opts, results))
        print(f"   ({name} took {time.perf_counter() - t0:.1f} s)")
        sys.stdout.flush()
    print("\n== targets (design §8)")
    for target in results.targets:
        print("   " + target.line())
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
