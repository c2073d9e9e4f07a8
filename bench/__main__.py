"""`python -m bench [--quick] [--only NAME ...] [--dir PATH]`: print the §8 figures."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import platform
import sys
import time

from bench import BENCHMARKS, Options, Results, quiet_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a much shorter run (smoke test)")
    parser.add_argument("--only", action="append", choices=BENCHMARKS, metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")
    parser.add_argument("--dir", default=None, help="directory for the ledgers (default: a temp dir on /tmp)")
    args = parser.parse_args(argv)
    opts = Options(quick=args.quick, workdir=args.dir)
    quiet_logging()
    chosen = [b for b in BENCHMARKS if not args.only or b in args.only]
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
