"""The overview page's data: a time range of the ledger aggregated (`audit.query_overview`) and
drawn as SVG (`charts`), the ledger's size, and its last verification, with "Verify now".

The last verification is the file `audit.verify_log` keeps, written by `dharma audit verify`
(pass or fail) and by "Verify now" here; a SQLite ledger verified by an older CLI, which wrote
only `<ledger>.verified` (passes), is shown from that. One "Verify now" runs at a time in this
process, in a worker thread, and not on a ledger over `ui.verify_max_records` records.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import structlog

from audit.query_overview import Overview, overview, window
from audit.verify import VerifyStamp, stamp_path, verify_ledger, write_stamp
from audit.verify_log import VerifyLog, last_verify, record_verify
from gateway.config import UiSettings
from gateway.ledger_access import open_ledger_reader, verify_log_path
from gateway.transports.http_api.audit import LedgerView
from gateway.transports.ui.charts import Series, bar_list, time_chart

log = structlog.get_logger()

RANGES: dict[str, int] = {"1h": 3600, "6h": 6 * 3600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
"""The ranges the page offers (the `range` query parameter), ending now."""
DEFAULT_RANGE = "24h"
TOP = 8


class VerifyBusy(Exception):
    """A "Verify now" is already running in this process."""


def settings_of(view: LedgerView) -> UiSettings:
    settings = getattr(view.gateway, "settings", None)
    return settings.ui if settings is not None else UiSettings()


def log_path(view: LedgerView) -> Path:
    """Where this gateway's ledger keeps its last verification."""
    location = view.location()
    settings = getattr(view.gateway, "settings", None)
    root = settings.state_dir if settings is not None else (location.parent if isinstance(location, Path) else Path("."))
    return verify_log_path(location, root)


def last_verification(view: LedgerView) -> VerifyLog | str | None:
    """The last verification on record (see the module doc)."""
    found = last_verify(log_path(view))
    location = view.location()
    if found is None and isinstance(location, Path):
        try:
            stamp = VerifyStamp.model_validate_json(stamp_path(location).read_bytes())
        except (OSError, ValueError):
            return None
        return VerifyLog(ok=True, size=stamp.size, root=stamp.root, verified_at=stamp.verified_at, via="cli")
    return found


@dataclass(frozen=True, slots=True)
class Aggregated:
    overview: Overview
    size: int


async def aggregate(view: LedgerView, seconds: int, now: datetime | None = None) -> Aggregated:
    """The range of `seconds` ending now, read in a worker thread within the configured bound."""
    since, until, step = window(now or datetime.now(UTC), seconds)
    limit = settings_of(view).overview_max_records

    def read() -> Aggregated:
        with contextlib.closing(open_ledger_reader(view.location())) as reader:
            return Aggregated(overview(reader, since, until, step, max_records=limit), reader.size())

    return await anyio.to_thread.run_sync(read)


def charts(ov: Overview) -> dict[str, Any]:
    """The page's SVG charts of `ov`."""
    starts = [b.start for b in ov.buckets]
    shown = [b.read for b in ov.buckets]

    def values(name: str) -> list[float | None]:
        return [getattr(b, name) if read else None for b, read in zip(ov.buckets, shown, strict=True)]

    other = [None if c is None else c - (o or 0) - (r or 0) - (e or 0)
             for c, o, r, e in zip(values("calls"), values("ok"), values("refused"), values("errors"), strict=True)]
    kinds = [Series("allowed", "allowed", values("ok")), Series("refused", "refused", values("refused")),
             Series("failed", "failed", values("errors"))]
    if any(other):
        kinds.append(Series("other (dry run)", "other", other))
    ms = [[None if v is None else v / 1000 for v in values(name)] for name in ("p50_us", "p99_us")]
    per = bucket_text(ov.step)
    return {
        "calls": time_chart("chart-calls", "Calls over time: allowed, refused and failed",
                            f"{ov.total('calls')} calls, {ov.total('refused')} refused, {ov.total('errors')} failed, "
                            f"in {len(starts)} buckets of {per}", starts, ov.step, kinds, y_label=f"calls per {per}"),
        "held": time_chart("chart-held", "Calls held for a human over time",
                           f"{ov.total('held')} calls held in {len(starts)} buckets of {per}", starts, ov.step,
                           [Series("held", "held", values("held"))], y_label=f"holds per {per}"),
        "latency": time_chart("chart-latency", "Latency over time: p50 and p99",
                              f"p50 {fmt_ms(ov.latency(50))}, p99 {fmt_ms(ov.latency(99))} over the range", starts, ov.step,
                              [Series("p50", "p50", ms[0]), Series("p99", "p99", ms[1])], y_label="milliseconds",
                              lines=True, fmt="{} ms"),
        "rules": bar_list("chart-rules", "Rules that fired most", ov.rules.most_common(TOP), "rule",
                          empty="no rule matched a call in this range"),
        "principals": bar_list("chart-principals", "Principals refused most", ov.refused_principals.most_common(TOP),
                               "refused", empty="nobody was refused in this range"),
        "tools": bar_list("chart-tools", "Tools refused most", ov.refused_tools.most_common(TOP), "refused",
                          empty="no tool was refused in this range"),
    }


def bucket_text(step: int) -> str:
    """A bucket width for a person: "10 min", "3 h", "1 day"."""
    return f"{step // 60} min" if step < 3600 else f"{step // 3600} h" if step < 86_400 else f"{step // 86_400} day"


def utc_text(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def fmt_ms(us: int | None) -> str:
    return "–" if us is None else f"{us / 1000:,.1f} ms"


class Verifier:
    """"Verify now" of one `/ui` app: one verification at a time."""

    def __init__(self, view: LedgerView) -> None:
        self.view = view
        self.lock = anyio.Lock()

    async def __call__(self, by: str) -> VerifyLog:
        """Verify the ledger now with the gateway's checkpoint key; record and return the result.

        Raises:
            VerifyBusy: one is running already. ValueError: the ledger is over `ui.verify_max_records`.
        """
        if self.lock.locked():
            raise VerifyBusy("a verification is already running; its result appears here when it ends")
        async with self.lock:
            return await anyio.to_thread.run_sync(_verify, self.view, by)


def _verify(view: LedgerView, by: str) -> VerifyLog:
    location, bound = view.location(), settings_of(view).verify_max_records
    keys = view.gateway.keys
    with contextlib.closing(open_ledger_reader(location)) as reader:
        size = reader.size()
        if bound and size > bound:
            raise ValueError(f"the ledger holds {size:,} records, over ui.verify_max_records ({bound:,}): "
                             "run `dharma audit verify` where it may take its time")
        started = time.perf_counter()
        report = verify_ledger(reader, None, keys=[(keys.checkpoint_key_name, keys.checkpoint_key.public_key())])
        elapsed = time.perf_counter() - started
    if report.ok and isinstance(location, Path):
        write_stamp(location, report)
    entry = record_verify(log_path(view), report, via="ui", by=by, seconds=elapsed)
    log.info("ledger.verified", ok=report.ok, size=report.size, by=by, via="ui", seconds=round(elapsed, 3),
             problem=report.problem or None)
    return entry
