"""The overview's aggregate over a time range of the ledger, on a real SQLite file and a real
PostgreSQL server: what counts as a call, a refusal and a hold, per bucket; the rules and who and
what was refused; latency percentiles; the bound on records read, newest first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from audit import query_overview
from audit.query import query_records
from audit.query_overview import bucket_step, overview, percentile, window
from tests.audit.conftest import Location, attacker, open_ledger, open_reader
from tests.helpers import all_logs

SINCE = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
STEP = 600


def at(minutes: float) -> str:
    return (SINCE + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def call(minutes: float, *, status: str = "ok", principal: str = "alice", tool: str = "read-file", rules: tuple[str, ...] = (),
         latency: int = 1000, kind: str | None = None, approval_id: str | None = None) -> dict[str, Any]:
    entry = {"time": at(minutes), "request_id": f"r-{minutes}-{tool}-{status}", "principal": principal, "tool": tool,
             "decision": "deny" if status == "blocked" else "allow", "status": status, "matched_rules": list(rules),
             "latency_us": latency, "approval_id": approval_id, "policy_version": "pv"}
    if kind is not None:
        entry["kind"] = kind
    return entry


def traffic() -> list[dict[str, Any]]:
    """Two buckets of calls of every sort, and records that are not calls."""
    return [
        call(-5),  # before the range
        {**call(1, status=None, kind="decision"), "status": None},  # answered by the outcome below: not a call
        call(1.5, kind="outcome", latency=2000),
        call(2, status="blocked", rules=("no-traversal",), latency=300),
        call(3, status="blocked", principal="bob", tool="get-sum", rules=("no-traversal", "warn-sum"), latency=200),
        call(4, status="error", tool="get-sum", latency=9000),
        call(5, status="forwarded", tool="tools/list"),  # relayed ungoverned: not a call
        {"kind": "approval", "event": "held", "time": at(6), "principal": "alice", "tool": "delete.file", "request_id": None},
        call(6, status="pending_approval", tool="delete.file", rules=("confirm-delete",)),
        {"kind": "approval", "event": "approved", "time": at(12), "principal": "alice", "tool": "delete.file", "request_id": None},
        call(12.5, tool="delete.file", rules=("confirm-delete",), approval_id="apr-1", latency=5000),
        call(13, status="blocked", principal="bob", tool="get-sum", rules=("warn-sum",), latency=100),
        {"kind": "refusal", "time": at(14), "count": 7, "reason": "unknown_key", "principal": None, "request_id": None},
        call(61),  # after the range
    ]


@pytest.fixture
async def filled(ledger_backend: Location) -> Location:
    ledger = await open_ledger(ledger_backend)
    try:
        for entry in traffic():
            await ledger.append(entry)
    finally:
        await ledger.aclose()
    return ledger_backend


def test_buckets_count_calls_refusals_holds_and_latency(filled: Location) -> None:
    with open_reader(filled) as reader:
        ov = overview(reader, SINCE, SINCE + timedelta(hours=1), STEP, max_records=1000)
    assert [b.start for b in ov.buckets] == [SINCE + timedelta(seconds=STEP * i) for i in range(6)]
    first, second = ov.buckets[0], ov.buckets[1]
    assert (first.calls, first.ok, first.refused, first.errors, first.held) == (4, 1, 2, 1, 1)
    assert (second.calls, second.ok, second.refused, second.errors, second.held) == (2, 1, 1, 0, 0)
    assert all(b.calls == b.held == 0 for b in ov.buckets[2:])
    assert sorted(first.latencies) == [200, 300, 2000, 9000] and first.p50_us == 300 and first.p99_us == 9000
    assert ov.total("calls") == 6 and (ov.latency(50), ov.latency(99)) == (300, 9000)
    assert dict(ov.rules) == {"no-traversal": 2, "warn-sum": 2, "confirm-delete": 1}
    assert dict(ov.refused_principals) == {"alice": 1, "bob": 2}
    assert dict(ov.refused_tools) == {"read-file": 1, "get-sum": 2}
    assert ov.door == 7 and not ov.truncated and ov.scanned == 12


def test_a_range_over_the_bound_reads_its_newest_records_and_says_so(filled: Location) -> None:
    with open_reader(filled) as reader:
        ov = overview(reader, SINCE, SINCE + timedelta(hours=1), STEP, max_records=4)
    assert ov.truncated and ov.scanned == 4
    assert ov.read_since == SINCE + timedelta(minutes=12)  # the 4 newest in range: 14, 13, 12.5, 12
    assert [b.read for b in ov.buckets] == [False, True, True, True, True, True]
    assert (ov.buckets[1].calls, ov.buckets[1].refused) == (2, 1) and ov.buckets[0].calls == 0
    assert ov.door == 7 and dict(ov.rules) == {"warn-sum": 1}


def test_a_record_whose_time_index_was_edited_into_the_range_is_not_counted(filled: Location,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    conn = attacker(filled)
    try:  # seq 1 is the call before the range; its indexed time now says minute 30, its bytes still say -5
        conn.execute("UPDATE records SET time = ? WHERE seq = 1", (at(30),))
    finally:
        conn.close()
    with open_reader(filled) as reader, all_logs(monkeypatch, query_overview) as logs:
        ov = overview(reader, SINCE, SINCE + timedelta(hours=1), STEP, max_records=1000)
    assert ov.scanned == 13 and ov.buckets[3].calls == 0 and ov.total("calls") == 6
    assert [(e["event"], e["seq"], e["filters"]) for e in logs if e["log_level"] == "warning"] == [
        ("audit.query_hit_dropped", 1, ["time"])]


def test_newest_first_reads_the_time_index_backwards(filled: Location) -> None:
    with open_reader(filled) as reader:
        newest = [r["time"] for r in query_records(reader, since=SINCE, until=SINCE + timedelta(hours=1), newest_first=True)]
        oldest = [r["time"] for r in query_records(reader, since=SINCE, until=SINCE + timedelta(hours=1))]
        limited = [r["time"] for r in query_records(reader, limit=2, newest_first=True)]
    assert newest == oldest[::-1] and len(newest) == 12
    assert limited == [at(61), at(14)]


def test_bucket_widths_follow_the_range() -> None:
    assert [bucket_step(s) for s in (3600, 6 * 3600, 86_400, 7 * 86_400, 30 * 86_400)] == [60, 600, 1800, 10800, 43200]
    since, until, step = window(datetime(2026, 11, 22, 10, 7, 30, tzinfo=UTC), 3600)
    assert (since, until, step) == (datetime(2026, 11, 22, 9, 8, tzinfo=UTC), datetime(2026, 11, 22, 10, 8, tzinfo=UTC), 60)
    assert percentile([], 50) is None and percentile([5], 99) == 5 and percentile(list(range(1, 101)), 99) == 99
