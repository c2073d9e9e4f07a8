"""What a ledger writer tells the operator about itself: append lag and batch sizes.

A writer counts each committed batch here (one call per batch, in the writer's thread or task);
`/metrics` reads the counts when scraped. Plain integers and floats, no locks: a scrape may see a
batch half-counted, never a count that goes backwards. No I/O here.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

LAG_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Seconds from `append` to commit: where a durable fsync, a busy writer or PostgreSQL shows."""
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Records per committed batch (group commit)."""


@dataclass(slots=True)
class Histogram:
    """A cumulative-on-read histogram: per-bucket counts (the last one is +Inf), a sum and a count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(`le` label, cumulative count) pairs, `+Inf` last, as the exposition format lists them."""
        out, running = [], 0
        for bound, n in zip((*(_le(b) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


@dataclass(slots=True)
class AppendStats:
    """Append lag (seconds, per record) and batch size (records, per commit) of one ledger writer."""

    lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    batch: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    failed_batches: int = 0

    def committed(self, now: float, queued: Sequence[float]) -> None:
        """One batch committed at `now` (perf_counter) holding records queued at `queued`."""
        self.batch.observe(len(queued))
        for at in queued:
            self.lag.observe(now - at)

    def failed(self) -> None:
        self.failed_batches += 1
