"""Dharma Gateway benchmarks: figures for design §8 (performance budget).

Run `python -m bench` (all, ~7 minutes), `python -m bench --quick` (seconds) or
`python -m bench --only decision` (names: decision, governed, ledger_append, ledger_verify,
ledger_query, mcp_stdio, mcp_http, replicas, detection).
These print figures; nothing here asserts on speed (see bench/README.md).
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCHMARKS: tuple[str, ...] = ("decision", "governed", "ledger_append", "ledger_verify", "ledger_query", "mcp_stdio",
                                "mcp_http", "replicas", "detection", "scanners")
LEDGER_BENCHMARKS: tuple[str, ...] = ("ledger_append", "ledger_verify", "ledger_query")
LEDGER_BACKENDS: tuple[str, ...] = ("sqlite", "postgres")
BACKEND_NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


@dataclass(frozen=True)
class Options:
    quick: bool = False
    workdir: str | None = None  # where ledgers go (default: a temporary directory)
    backends: tuple[str, ...] = LEDGER_BACKENDS
    postgres: Any = None  # a running tests.pg.PostgresServer, for the PostgreSQL rows
    postgres_missing: str = "not started"  # why there are no PostgreSQL rows (when `postgres` is None)
    append_seconds: float | None = None  # per ledger_append row (default 3; quick 0.3)
    verify_records: int | None = None  # ledger_verify's ledger (default 100,000; quick 5,000)
    query_records: int | None = None  # ledger_query's ledger (default 1,000,000; quick 20,000)

    def ledger_backends(self) -> list[str]:
        """The chosen ledger backends that can run (PostgreSQL only with a server)."""
        return [b for b in self.backends if b != "postgres" or self.postgres is not None]

    def new_ledger(self, backend: str, directory: Path, stem: str) -> Path | str:
        """A fresh, empty ledger location: a file in `directory` or a new PostgreSQL database."""
        if backend == "postgres":
            return str(self.postgres.new_database())
        path = directory / f"{stem}.db"
        for old in directory.glob(f"{stem}.db*"):
            old.unlink()
        return path

    def skipped_backends(self, target: str, results: Results) -> None:
        """Record a NOT MEASURED `target` line for each chosen backend that cannot run."""
        for backend in self.backends:
            if backend not in self.ledger_backends():
                results.add(Target(f"{target} ({BACKEND_NAMES[backend]})", None, _LIMITS[target], _UNITS[target],
                                   higher_is_better=target == "ledger verify",
                                   note=f"PostgreSQL {self.postgres_missing}"))


@dataclass
class Target:
    """One budget line of design §8 and what this run measured against it."""

    name: str
    measured: float | None
    limit: float
    unit: str
    higher_is_better: bool
    note: str = ""

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        head = f"{self.name}: target {op} {fmt_num(self.limit)} {self.unit}"
        if self.measured is None:
            return f"NOT MEASURED  {head}{' (' + self.note + ')' if self.note else ''}"
        got = f"measured {fmt_num(self.measured)} {self.unit}"
        met = self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit
        if met:
            verdict = "MET"
            margin = (self.measured / self.limit) if self.higher_is_better else (self.limit / max(self.measured, 1e-12))
            how = f"{margin:.1f}x headroom"
        else:
            verdict = "MISSED"
            factor = (self.limit / max(self.measured, 1e-12)) if self.higher_is_better else (self.measured / self.limit)
            how = f"by {factor:.2f}x" if self.measured > 0 or not self.higher_is_better else "by ∞"
        note = f"; {self.note}" if self.note else ""
        return f"{verdict:<7}{head}: {got} ({how}{note})"


@dataclass
class Results:
    targets: list[Target] = field(default_factory=list)

    def add(self, target: Target) -> None:
        self.targets.append(target)


_LIMITS = {"ledger verify": 100_000, "ledger query by principal+time (1M records)": 100}
_UNITS = {"ledger verify": "records/s", "ledger query by principal+time (1M records)": "ms"}


# ---- measurement --------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    n: int
    p50: float  # seconds
    p99: float
    mean: float
    minimum: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        ordered = sorted(samples)
        n = len(ordered)
        return cls(n, _pct(ordered, 50), _pct(ordered, 99), statistics.fmean(ordered), ordered[0])


def _pct(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted samples."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def sample_sync(fn: Callable[[], Any], *, seconds: float, min_n: int = 20, max_n: int = 200_000, warmup: int = 20) -> Stats:
    """Time `fn()` call by call until `seconds` have passed (at least `min_n` calls)."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter
    out: list[float] = []
    gc.collect()
    deadline = clock() + seconds
    while len(out) < max_n and (len(out) < min_n or clock() < deadline):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return Stats.of(out)


async def sample_async(fn: Callable[[], Any], *, seconds: float, min_n: int = 20, max_n: int = 200_000, warmup: int = 20) -> Stats:
    """Time `await fn()` call by call until `seconds` have passed (at least `min_n` calls)."""
    for _ in range(warmup):
        await fn()
    clock = time.perf_counter
    out: list[float] = []
    gc.collect()
    deadline = clock() + seconds
    while len(out) < max_n and (len(out) < min_n or clock() < deadline):
        t0 = clock()
        await fn()
        out.append(clock() - t0)
    return Stats.of(out)


# ---- printing -----------------------------------------------------------------------


def fmt_num(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def fmt_time(seconds: float) -> str:
    """A duration in µs below 1 ms, else in ms."""
    if math.isnan(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.3f} ms"


def table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]], note: str = "") -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(f"\n== {title}")
    if note:
        for line in note.splitlines():
            print(f"   {line}")
    print("   " + "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))))
    print("   " + "  ".join("-" * w for w in widths))
    for row in cells:
        print("   " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    sys.stdout.flush()


def quiet_logging() -> None:
    """Warnings only, to stderr: the per-call `call.decided` info line is not part of these figures."""
    from gateway.logging import configure_logging

    configure_logging("warning")
    logging.getLogger().setLevel(logging.WARNING)


def info_logging_to_devnull() -> Any:
    """The production logging chain (info, JSON, secret scrubbing) writing to /dev/null."""
    from gateway.logging import configure_logging

    sink = open(os.devnull, "w")  # noqa: SIM115 - closed by the caller
    saved, sys.stderr = sys.stderr, sink
    try:
        configure_logging("info")
    finally:
        sys.stderr = saved
    return sink


def positive(kind: type[int] | type[float]) -> Any:
    """An argparse type: a number of `kind` above zero, or a clear error naming the value."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be above zero")
        return value
    return parse
