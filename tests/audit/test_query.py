"""query_records filters (through the indexes) and format_records output."""

from __future__ import annotations

import asyncio
import csv
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from audit.query import CSV_COLUMNS, CSV_EXTRA, cell_text, format_records, query_records
from audit.sqlite import SqliteLedgerReader

from .conftest import BACKENDS, Location, fill, make_entry, new_location, open_ledger, open_reader

COUNT = 120
ENTRIES = [make_entry(i) for i in range(COUNT)]


@pytest.fixture(scope="module", params=BACKENDS)
def reader(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqliteLedgerReader]:
    path = new_location(request.param, request, tmp_path_factory.mktemp("query"))

    async def build() -> None:
        ledger = await open_ledger(path)
        await fill(ledger, COUNT)
        await ledger.aclose()

    asyncio.run(build())
    with open_reader(path) as opened:
        yield opened


def ids(records: object) -> list[str]:
    return [r["request_id"] for r in records]  # type: ignore[attr-defined]


def expected(pred: object) -> list[str]:
    return [e["request_id"] for e in sorted(ENTRIES, key=lambda e: e["time"]) if pred(e)]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("filters", "pred"),
    [
        ({}, lambda e: True),
        ({"principal": "bob"}, lambda e: e["principal"] == "bob"),
        ({"tool": "fs.write"}, lambda e: e["tool"] == "fs.write"),
        ({"decision": "deny"}, lambda e: e["decision"] == "deny"),
        ({"rule": "rule-1"}, lambda e: "rule-1" in e["matched_rules"]),
        ({"rule": "rule-all"}, lambda e: "rule-all" in e["matched_rules"]),
        ({"rule": "nope"}, lambda e: False),
        ({"status": "error"}, lambda e: e["status"] == "error"),
        ({"policy_version": "pv-1"}, lambda e: e["policy_version"] == "pv-1"),
        ({"request_id": "req-42"}, lambda e: e["request_id"] == "req-42"),
        ({"error_code": "backend_error"}, lambda e: e["error_code"] == "backend_error"),
        ({"approval_id": "apr-1"}, lambda e: e["approval_id"] == "apr-1"),
        ({"tool": "fs.*"}, lambda e: e["tool"].startswith("fs.")),
        ({"tool": "*.read"}, lambda e: e["tool"] == "fs.read"),
        ({"tool": "fs.?rite"}, lambda e: e["tool"] == "fs.write"),
        ({"tool": "[hs]*"}, lambda e: e["tool"] in ("http.get", "shell.exec")),
        ({"tool": "fs.[!r]*"}, lambda e: e["tool"] == "fs.write"),
        ({"tool": "FS.*"}, lambda e: False),  # case-sensitive, like tool names
        ({"tool": "fs.*", "error_code": "backend_error", "principal": "alice"},
         lambda e: e["tool"].startswith("fs.") and e["error_code"] == "backend_error" and e["principal"] == "alice"),
        ({"since": "2026-11-22T01:01:00Z"}, lambda e: e["time"] >= "2026-11-22T01:01:00"),
        ({"until": "2026-11-22T01:00:30Z"}, lambda e: e["time"] < "2026-11-22T01:00:30"),
        (
            {"principal": "alice", "since": datetime(2026, 11, 22, 1, 0, 30, tzinfo=UTC), "until": "2026-11-22T02:01:30+01:00"},
            lambda e: e["principal"] == "alice" and "2026-11-22T01:00:30" <= e["time"] < "2026-11-22T01:01:30",
        ),
        ({"tool": "fs.read", "decision": "allow", "rule": "rule-all"},
         lambda e: e["tool"] == "fs.read" and e["decision"] == "allow" and "rule-all" in e["matched_rules"]),
    ],
)
async def test_each_filter(reader: SqliteLedgerReader, filters: dict, pred: object) -> None:
    want = expected(pred)
    assert ids(query_records(reader, **filters)) == want
    assert ids(query_records(reader, **filters, limit=3)) == want[:3]


async def test_records_carry_seq_hash_and_entry(reader: SqliteLedgerReader) -> None:
    [record] = query_records(reader, request_id="req-5")
    stored = reader.get(record["seq"])
    assert stored is not None and record["hash"] == stored.hash
    assert {k: v for k, v in record.items() if k not in ("seq", "hash")} == ENTRIES[5]


async def test_filters_use_the_indexes(reader: SqliteLedgerReader) -> None:
    if not isinstance(reader, SqliteLedgerReader):
        pytest.skip("SQLite query plans")
    def plan(sql: str, *params: object) -> str:
        return " ".join(row[-1] for row in reader._conn.execute("EXPLAIN QUERY PLAN " + sql, params))  # noqa: SLF001

    by_principal = "SELECT seq FROM records r WHERE r.principal = ? AND r.time >= ? ORDER BY r.time, r.seq"
    assert "records_principal_time" in plan(by_principal, "alice", "2026")
    assert "TEMP B-TREE" not in plan(by_principal, "alice", "2026")
    assert "records_tool_time" in plan("SELECT seq FROM records r WHERE r.tool = ? ORDER BY r.time, r.seq", "t")
    assert "records_tool_time (tool>? AND tool<?)" in plan("SELECT seq FROM records r WHERE r.tool GLOB ?", "fs.*")  # a glob's prefix
    assert "record_rules_rule" in plan(
        "SELECT r.seq FROM records r JOIN record_rules rr ON rr.seq = r.seq WHERE rr.rule_id = ?", "x"
    )


async def test_jsonl_lines_are_canonical_json(reader: SqliteLedgerReader) -> None:
    lines = list(format_records(query_records(reader, limit=2), "jsonl"))
    assert [json.loads(line)["request_id"] for line in lines] == ["req-0", "req-1"]
    assert lines[0].startswith('{"approval_id":null,"args":')


async def test_csv_has_a_header_and_one_row_per_record(reader: SqliteLedgerReader) -> None:
    lines = list(format_records(query_records(reader, principal="bob", limit=4), "csv"))
    rows = list(csv.DictReader(lines))
    assert len(rows) == 4 and rows[0]["principal"] == "bob" and rows[0]["request_id"] == "req-1"
    assert rows[0]["matched_rules"] == "rule-1,rule-all" and rows[0]["enforced"] == "true"


async def test_table_has_fixed_columns(reader: SqliteLedgerReader) -> None:
    lines = list(format_records(query_records(reader, limit=2)))
    assert lines[0].split() == ["seq", "time", "principal", "tool", "decision", "enforced", "status", "error_code", "rules"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[3].split() == ["2", "2026-11-22T01:00:01.000001Z", "bob", "fs.write", "deny", "true", "ok",
                                "rule-1,rule-all"]
    assert lines[2].split()[6:8] == ["error", "backend_error"]  # seq 1 is req-0: an error with its code
    long = {"seq": 1, "principal": "p" * 50}
    assert "p" * 19 + "…" in list(format_records([long]))[2]


async def test_csv_keeps_every_field_jsonl_has(reader: SqliteLedgerReader) -> None:
    odd = {"seq": 999, "hash": "ab", "tool": "x", "surprise": {"nested": [1, "two"]}, "args": {"path": "a,b"}}
    records = [*query_records(reader, limit=30), odd]
    as_json = [json.loads(line) for line in format_records(records, "jsonl")]
    rows = list(csv.DictReader(format_records(records, "csv")))
    assert list(rows[0])[: len(CSV_COLUMNS)] == list(CSV_COLUMNS) and list(rows[0])[-1] == CSV_EXTRA
    assert len(rows) == len(as_json) == 31
    for record, row in zip(as_json, rows, strict=True):
        extra = json.loads(row[CSV_EXTRA]) if row[CSV_EXTRA] else {}
        rebuilt = {k: row[k] for k in CSV_COLUMNS if k in record} | extra
        assert set(rebuilt) == set(record)  # same fields
        assert rebuilt == {k: (v if k in extra else cell_text(v)) for k, v in record.items()}  # same values
    assert json.loads(rows[-1][CSV_EXTRA]) == {"surprise": {"nested": [1, "two"]}}
    assert json.loads(rows[0]["args"]) == ENTRIES[0]["args"]


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        format_records([], "xml")  # type: ignore[arg-type]


async def test_the_rule_index_is_built_from_the_record_bytes(ledger_backend: Location) -> None:
    ledger_path = ledger_backend
    ledger = await open_ledger(ledger_path)
    await ledger.append({"matched_rules": ["a", "a", "b", 7, None]})
    await ledger.append({"matched_rules": "a"})
    await ledger.append({"matched_rules": {"x": "a"}})
    await ledger.append({"other": ["a"]})
    await ledger.aclose()
    with open_reader(ledger_path) as reader:
        assert [r["seq"] for r in query_records(reader, rule="a")] == [1, 2]
        assert [r["seq"] for r in query_records(reader, rule="b")] == [1]
        assert list(reader._conn.execute("SELECT count(*) FROM record_rules WHERE seq = 1")) == [(2,)]  # noqa: SLF001
