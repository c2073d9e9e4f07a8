"""Auditor queries over the karma ledger, and their table / JSON lines / CSV rendering.

Filtering happens in the backend's indexed columns (SQL WHERE) wherever an index exists: a tool
glob narrows by its literal prefix there. What no column holds (the rest of a tool glob,
`error_code`, `approval_id`) is checked on the decoded record bytes, the verified truth, so only
the records the indexes let through are decoded. Read-only.

The indexes are not hashed: every hit is re-checked against its decoded bytes, and a hit whose
bytes do not match the filter (its index was edited) is dropped with a warning. A record whose
index was edited so that the filter misses it cannot be seen here at all: only `verify_ledger`,
which recomputes every index from the bytes, proves that none is missing.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any, Literal

import structlog

from audit.canon import canonical_bytes
from audit.records import KIND_DECISION, KIND_OUTCOME, KINDS, RecordFilter, decode_record, index_fields, normalize_time, rule_ids
from audit.store import LedgerReader

log = structlog.get_logger()

Format = Literal["table", "jsonl", "csv"]
Show = Literal["calls", "records", "unknown"]

TABLE_COLUMNS: tuple[tuple[str, int], ...] = (
    ("seq", 8),
    ("time", 27),
    ("principal", 20),
    ("tool", 24),
    ("decision", 16),
    ("enforced", 8),
    ("status", 16),
    ("error_code", 19),
    ("rules", 0),
)
CSV_COLUMNS = (
    "seq", "hash", "time", "request_id", "principal", "tier", "backend", "tool", "method", "session_id",
    "decision", "enforced", "matched_rules", "block_class", "stage", "sensitivity", "purpose", "disclosure",
    "policy_version", "approval_id", "idempotency_key", "status", "error_code", "latency_us", "dry_run",
    "args_digest", "args", "findings", "response_digest", "tool_digest",
)
CSV_EXTRA = "extra"
"""The CSV column holding, as one canonical JSON object, any record field not in CSV_COLUMNS."""
GLOB_CHARS = frozenset("*?[")
OUTCOME_UNKNOWN = "unknown"
"""A decision record's `outcome` when no outcome record answers it: the gateway stopped mid-call."""


def check_time(text: str) -> str:
    """`text` if it is an RFC 3339 time (or date), for a `since`/`until` filter.

    Raises:
        ValueError: anything else (a filter must not quietly match nothing).
    """
    try:
        datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise ValueError(f"not an RFC 3339 time: {text!r} (e.g. 2026-11-22T00:00:00Z)") from None
    return text


def check_kind(text: str) -> str:
    """`text` if it is a record kind (`audit.records.KINDS`), for a `kind` filter.

    Raises:
        ValueError: anything else (a filter must not quietly match nothing).
    """
    if text not in KINDS:
        raise ValueError(f"{text!r} is not one of: {', '.join(KINDS)}")
    return text


def query_records(
    reader: LedgerReader,
    *,
    principal: str | None = None,
    tool: str | None = None,
    decision: str | None = None,
    rule: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    limit: int | None = None,
    status: str | None = None,
    policy_version: str | None = None,
    request_id: str | None = None,
    error_code: str | None = None,
    approval_id: str | None = None,
    kind: str | None = None,
    newest_first: bool = False,
) -> Iterator[dict[str, Any]]:
    """Yield matching records, oldest first (newest first if asked), as flat dicts (seq, hash, then entry fields).

    `since` is inclusive and `until` exclusive; both are RFC 3339 strings or datetimes
    (naive ones are UTC). `rule` matches any id in the record's `matched_rules`. `tool` is a
    case-sensitive glob (`read_*`, `fs.?rite`, `[rw]*`); without `*`, `?` or `[` it is a name.
    `kind` keeps records of that kind (`audit.records.KINDS`, e.g. "reload" or "approval").
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    checks: list[Callable[[dict[str, Any]], bool]] = []
    tool_prefix = None
    if tool is not None and GLOB_CHARS.intersection(tool):
        tool_prefix = tool[: min(tool.index(c) for c in GLOB_CHARS if c in tool)] or None
        checks.append(lambda record, pattern=tool: isinstance(record.get("tool"), str) and fnmatchcase(record["tool"], pattern))
        tool = None
    for field, wanted in (("error_code", error_code), ("approval_id", approval_id), ("kind", kind)):
        if wanted is not None:
            checks.append(lambda record, field=field, wanted=wanted: record.get(field) == wanted)
    where = RecordFilter(
        principal=principal,
        tool=tool,
        tool_prefix=tool_prefix,
        decision=decision,
        status=status,
        rule=rule,
        policy_version=policy_version,
        request_id=request_id,
        since=None if since is None else normalize_time(since),
        until=None if until is None else normalize_time(until),
        limit=None if checks else limit,
        newest_first=newest_first,
    )
    raw = reader.select_records(where)
    decoded = (decode_record(seq, bytes(digest).hex(), bytes(body)) for seq, digest, body in raw)
    records = (record for record in decoded if _index_told_the_truth(record, where))
    if checks:
        records = (record for record in records if all(check(record) for check in checks))
        if limit is not None:
            records = itertools.islice(records, limit)
    try:
        yield from records
    finally:  # closing this generator early (a reader that stopped) closes the store's cursor now, not at GC
        close = getattr(raw, "close", None)
        if close is not None:
            close()


_EXACT_FILTERS = ("principal", "tool", "decision", "status", "policy_version", "request_id")


def _index_told_the_truth(record: dict[str, Any], where: RecordFilter) -> bool:
    """Re-check an index hit on the record's decoded bytes; warn about and drop a false one."""
    fields = index_fields(record)
    wrong = [name for name in _EXACT_FILTERS if getattr(where, name) is not None and getattr(fields, name) != getattr(where, name)]
    if where.tool_prefix is not None and not (fields.tool or "").startswith(where.tool_prefix):
        wrong.append("tool")
    if where.rule is not None and where.rule not in rule_ids(record):
        wrong.append("rule")
    if (where.since is not None or where.until is not None) and not (
        fields.time is not None
        and (where.since is None or fields.time >= where.since)
        and (where.until is None or fields.time < where.until)
    ):
        wrong.append("time")
    if wrong:
        log.warning("audit.query_hit_dropped", seq=record["seq"], filters=wrong,
                    reason="the ledger's index disagrees with the record bytes; run `dharma audit verify`")
    return not wrong


def format_records(records: Iterable[dict[str, Any]], fmt: Format = "table") -> Iterator[str]:
    """Render records as lines (no trailing newline): a fixed-width table, JSON lines or CSV."""
    if fmt == "jsonl":
        return (canonical_bytes(record).decode("utf-8") for record in records)
    if fmt == "csv":
        return _csv_lines(records)
    if fmt == "table":
        return _table_lines(records)
    raise ValueError(f"unknown format {fmt!r}; use table, jsonl or csv")


def cell_text(value: Any) -> str:
    """One field as a table or CSV cell: text as is, lists of text comma-joined, others canonical JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    return canonical_bytes(value).decode("utf-8")


def _table_lines(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    yield _table_row([name for name, _ in TABLE_COLUMNS])
    yield _table_row(["-" * max(width, len(name)) for name, width in TABLE_COLUMNS])
    for record in records:
        values = {**record, "rules": record.get("matched_rules"), "status": status_text(record)}
        yield _table_row([cell_text(values.get(name)) for name, _ in TABLE_COLUMNS])


def _table_row(cells: list[str]) -> str:
    parts = []
    for (name, width), cell in zip(TABLE_COLUMNS, cells, strict=True):
        if not width:
            parts.append(cell)
            continue
        width = max(width, len(name))
        if len(cell) > width:
            cell = cell[: width - 1] + "…"
        parts.append(cell.ljust(width))
    return "  ".join(parts).rstrip()


def _csv_lines(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def line(cells: list[str]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(cells)
        return buffer.getvalue()[:-1]

    yield line([*CSV_COLUMNS, CSV_EXTRA])
    known = frozenset(CSV_COLUMNS)
    for record in records:
        extra = {k: v for k, v in record.items() if k not in known}
        yield line([*(cell_text(record.get(name)) for name in CSV_COLUMNS), canonical_bytes(extra).decode("utf-8") if extra else ""])


def outcome_seq(reader: LedgerReader, decision: dict[str, Any]) -> int | None:
    """The seq of the outcome record answering this decision record, or None (outcome unknown).

    Looked up through the indexed request id, then checked on the decoded record bytes.
    """
    where = RecordFilter(request_id=decision.get("request_id"))
    raw = reader.select_records(where)
    try:
        for seq, digest, body in raw:
            record = decode_record(seq, bytes(digest).hex(), bytes(body))
            if record.get("kind") == KIND_OUTCOME and record.get("decision_seq") == decision["seq"]:
                return seq
    finally:
        close = getattr(raw, "close", None)
        if close is not None:
            close()
    return None


def with_outcomes(reader: LedgerReader, records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Add `outcome` to each decision record: its outcome record's seq, or "unknown" (gateway stopped mid-call).

    `outcome` is derived (like seq and hash), not a field of the record bytes.
    """
    for record in records:
        if record.get("kind") == KIND_DECISION:
            found = outcome_seq(reader, record)
            record["outcome"] = OUTCOME_UNKNOWN if found is None else found
        yield record


def call_rows(reader: LedgerReader, records: Iterable[dict[str, Any]], *, show: Show = "calls") -> Iterator[dict[str, Any]]:
    """The records with their decision records' `outcome` (see `with_outcomes`), as `show` asks.

    "calls": one row per call; a decision record answered by an outcome record is left out (the
    outcome record repeats its fields and names it in `decision_seq`), an unanswered one stays.
    "records": every record. "unknown": only decision records with outcome unknown.
    """
    for record in with_outcomes(reader, records):
        if record.get("kind") == KIND_DECISION:
            if show != "records" and record["outcome"] != OUTCOME_UNKNOWN:
                continue
        elif show == "unknown":
            continue
        yield record


def status_text(record: dict[str, Any]) -> Any:
    """A record's status as shown in the table: a decision record has none, so say where its outcome is."""
    if record.get("kind") != KIND_DECISION:
        return record.get("status")
    found = record.get("outcome")
    if found == OUTCOME_UNKNOWN:
        return "outcome unknown"
    return "decided" if found is None else f"decided→{found}"
