"""The operator's overview of a time range of the karma ledger: calls, refusals and holds per time
bucket, the rules that fired most, the principals and tools refused most, latency percentiles.

Read-only and bounded: the records of `[since, until)` are read through the time index newest
first (`RecordFilter(newest_first=True)`), at most `max_records` of them (one more, to know there
are more: SQL LIMIT). A range holding more is answered from its newest records and says so
(`truncated`, `read_since`): a large ledger costs the page a bounded read, never a scan. Each
record's bytes are decoded into only the fields counted here (msgspec, about 5x faster than the
whole record as a dict), and a hit whose bytes' time is not in the range (an edited index) is
dropped with a warning, as `audit.query` drops one.

What is counted (from the record bytes, the verified truth):
- a **call** is a record with a tool that is one whole call (no `kind`) or a call's outcome
  record (`kind: outcome`); a decision record is skipped (its outcome repeats it; a decision with
  no outcome yet is a call still running), and so is an MCP message relayed ungoverned (status
  `forwarded`).
- a call is **ok** when its status is `ok`; **refused** when it is `blocked` (any stage: tier gate,
  rules, rate limit, sanitizer, approval denied); an **error** when it is `error` (backend,
  timeout); the rest (a dry run) count only as calls.
- a **hold** is an approval record with event `held` (a call a human had to decide). The record
  of the call answered "pending approval" is not a call: the call is counted when it runs.
- **rules** are the ids in each call's `matched_rules`, whatever their effect or mode, once per
  call: a call that runs once approved (it has an `approval_id`) does not count again the rules
  its hold already counted.
- **latency** is each call's `latency_us`; p50 and p99 are nearest-rank percentiles.
- requests refused before anyone was authenticated (`kind: refusal`) add their `count` to `door`.
No I/O but the reader's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import structlog

from audit.records import KIND_APPROVAL, KIND_OUTCOME, KIND_REFUSAL, RecordFilter, normalize_time, rule_ids
from audit.store import LedgerReader

log = structlog.get_logger()

BUCKET_STEPS: tuple[int, ...] = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""Bucket widths in seconds, smallest first: the overview takes the smallest giving at most MAX_BUCKETS."""
MAX_BUCKETS = 60
TOP = 8
"""How many rules, principals and tools the overview names."""
STATUS_OK = "ok"
STATUS_BLOCKED = "blocked"
STATUS_ERROR = "error"
STATUS_FORWARDED = "forwarded"
STATUS_PENDING = "pending_approval"


@dataclass(slots=True)
class Bucket:
    """One time bucket: `[start, start + step)`; `read` is False when the bounded read stopped before it."""

    start: datetime
    calls: int = 0
    ok: int = 0
    refused: int = 0
    errors: int = 0
    held: int = 0
    latencies: list[int] = field(default_factory=list)
    read: bool = True

    @property
    def p50_us(self) -> int | None:
        return percentile(self.latencies, 50)

    @property
    def p99_us(self) -> int | None:
        return percentile(self.latencies, 99)


@dataclass(slots=True)
class Overview:
    """What the overview shows of `[since, until)`."""

    since: datetime
    until: datetime
    step: int
    buckets: list[Bucket]
    rules: Counter[str] = field(default_factory=Counter)
    refused_principals: Counter[str] = field(default_factory=Counter)
    refused_tools: Counter[str] = field(default_factory=Counter)
    door: int = 0
    scanned: int = 0
    truncated: bool = False
    read_since: datetime | None = None

    def total(self, name: str) -> int:
        return sum(getattr(b, name) for b in self.buckets)

    def latency(self, q: float) -> int | None:
        return percentile([v for b in self.buckets for v in b.latencies], q)


def percentile(values: list[int], q: float) -> int | None:
    """The nearest-rank `q`th percentile of `values` (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def bucket_step(seconds: float) -> int:
    """The bucket width for a range of `seconds`: the smallest of BUCKET_STEPS giving at most MAX_BUCKETS."""
    return next((s for s in BUCKET_STEPS if seconds / s <= MAX_BUCKETS), BUCKET_STEPS[-1])


def window(now: datetime, seconds: int) -> tuple[datetime, datetime, int]:
    """(since, until, step) of the range of `seconds` ending at `now`, on bucket boundaries (UTC)."""
    step = bucket_step(seconds)
    epoch = int(now.timestamp())
    end = (epoch // step + 1) * step
    start = end - math.ceil(seconds / step) * step
    return datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), step


class Counted(msgspec.Struct):
    """The fields of an entry the overview counts (any type: a strange value is skipped, not an error)."""

    time: Any = None
    kind: Any = None
    event: Any = None
    status: Any = None
    tool: Any = None
    principal: Any = None
    matched_rules: Any = None
    latency_us: Any = None
    approval_id: Any = None
    count: Any = None


class _Record(msgspec.Struct):
    entry: Counted


_decode = msgspec.json.Decoder(_Record).decode


def _time_of(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _add(overview: Overview, bucket: Bucket, e: Counted) -> None:
    """Count one record into its bucket and the top lists (see the module doc for what counts)."""
    if e.kind == KIND_APPROVAL:
        bucket.held += e.event == "held"
        return
    if e.kind == KIND_REFUSAL:
        overview.door += e.count if _whole(e.count) else 1
        return
    if e.kind not in (None, KIND_OUTCOME) or not isinstance(e.tool, str) or e.status == STATUS_FORWARDED:
        return
    if e.status == STATUS_PENDING or not e.approval_id:
        overview.rules.update(rule_ids({"matched_rules": e.matched_rules}))
    if e.status == STATUS_PENDING:
        return
    bucket.calls += 1
    if _whole(e.latency_us) and e.latency_us >= 0:
        bucket.latencies.append(e.latency_us)
    if e.status == STATUS_OK:
        bucket.ok += 1
    elif e.status == STATUS_ERROR:
        bucket.errors += 1
    elif e.status == STATUS_BLOCKED:
        bucket.refused += 1
        overview.refused_principals[str(e.principal or "(unauthenticated)")] += 1
        overview.refused_tools[e.tool] += 1


def _counted(seq: int, body: bytes, lo: str, hi: str) -> Counted | None:
    """The counted fields of a record's bytes; None (with a warning) when they are not in [lo, hi) after all."""
    try:
        e = _decode(body).entry
    except (msgspec.DecodeError, msgspec.ValidationError):
        log.warning("audit.overview_record_unreadable", seq=seq)
        return None
    at = normalize_time(e.time) if isinstance(e.time, str) else None
    if at is None or not lo <= at < hi:
        log.warning("audit.query_hit_dropped", seq=seq, filters=["time"],
                    reason="the ledger's index disagrees with the record bytes; run `dharma audit verify`")
        return None
    return e


def overview(reader: LedgerReader, since: datetime, until: datetime, step: int, *, max_records: int) -> Overview:
    """Aggregate the records of `[since, until)` into buckets of `step` seconds, reading at most `max_records`."""
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, not {max_records}")
    count = math.ceil((until - since).total_seconds() / step)
    result = Overview(since, until, step, [Bucket(since + timedelta(seconds=i * step)) for i in range(count)])
    lo, hi = normalize_time(since), normalize_time(until)
    raw = reader.select_records(RecordFilter(since=lo, until=hi, limit=max_records + 1, newest_first=True))
    try:
        for seq, _, body in raw:
            if result.scanned == max_records:
                result.truncated = True
                break
            result.scanned += 1
            e = _counted(seq, bytes(body), lo, hi)
            at = None if e is None else _time_of(e.time)
            if e is None or at is None:
                continue
            result.read_since = at
            index = int((at - since).total_seconds() // step)
            if 0 <= index < count:
                _add(result, result.buckets[index], e)
    finally:
        close = getattr(raw, "close", None)
        if close is not None:
            close()
    if result.truncated and result.read_since is not None:
        for bucket in result.buckets:
            bucket.read = bucket.start + timedelta(seconds=step) > result.read_since
    return result
