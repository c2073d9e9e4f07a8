"""The SQLite ledger's rule index (`record_rules`), filled by the writer in each record's commit.

It used to be filled by a trigger (`records_index_rules`, json_each over every record's bytes on
every insert). The writer now inserts exactly the rows that trigger made, in the same rowid order;
a ledger an older gateway wrote (and re-armed the trigger on) gets the trigger dropped when a writer
opens it, so no record is indexed twice, and `dharma audit verify` passes across the upgrade.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from audit.canon import canonical_bytes
from audit.errors import LedgerError
from audit.merkle import leaf_hash
from audit.query import query_records
from audit.records import index_fields, record_bytes, rule_ids
from audit.sqlite import SqliteLedger, SqliteLedgerReader
from audit.verify import verify_ledger

from .conftest import fill, make_entry

# The retired trigger, verbatim as the gateway created it before the writer filled the index:
# an older gateway still creates it when it opens a ledger.
RETIRED_TRIGGER = """CREATE TRIGGER IF NOT EXISTS records_index_rules AFTER INSERT ON records BEGIN
    INSERT INTO record_rules(seq, rule_id)
    SELECT DISTINCT NEW.seq, value FROM json_each(CAST(NEW.body AS TEXT), '$.entry.matched_rules')
    WHERE type = 'text' AND typeof(key) != 'text';
END"""
# Its SELECT, over one stored record's bytes: the rows it inserted for that record, in order.
RETIRED_SELECT = (
    "SELECT DISTINCT value FROM json_each(CAST(? AS TEXT), '$.entry.matched_rules')"
    " WHERE type = 'text' AND typeof(key) != 'text'"
)

SHAPES: list[Any] = [
    ["b", "a", "b", "c"],
    ["z", 7, None, True, ["nested"], {"k": "v"}, "y", "z"],
    "solo",
    ("t2", "t1", "t2"),  # a tuple is recorded as a JSON array
    {"x": "not-a-rule"},
    42,
    None,
    [],
    ["é", "e\u0301", "quote\"back\\slash", "tab\tnl\n", "🦀 beyond the BMP", "\x1f"],
]


def _entries() -> list[dict[str, Any]]:
    out = [{**make_entry(i), "matched_rules": shape} for i, shape in enumerate(SHAPES)]
    without = make_entry(100)
    del without["matched_rules"]
    return [*out, without, *(make_entry(i) for i in range(200, 260))]  # make_entry: two rules or none


def _rows(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute("SELECT seq, rule_id FROM record_rules ORDER BY rowid"))


def _retired_rows(path: Path) -> list[tuple[int, str]]:
    """The rows the retired trigger would have inserted for every stored record, in insertion order."""
    with sqlite3.connect(path) as conn:
        records = list(conn.execute("SELECT seq, body FROM records ORDER BY seq"))
        return [(seq, value) for seq, body in records for (value,) in conn.execute(RETIRED_SELECT, (body,))]


def _verify(path: Path) -> None:
    with SqliteLedgerReader(path) as reader:
        report = verify_ledger(reader)
    assert report.ok, report


async def test_the_writer_stores_exactly_the_rows_the_retired_trigger_made(ledger_path: Path) -> None:
    """Every shape of `matched_rules` (duplicates, non-text items, one string, a tuple, an object, a
    number, null, escapes, characters beyond the BMP, absent), one at a time and in concurrent
    batches mixing records with and without rules: the rows, their order included, are what the
    trigger's own SELECT gives over the stored bytes, and verify passes."""
    entries = _entries()
    ledger = await SqliteLedger.open(ledger_path, batch_wait_ms=5)
    try:
        for e in entries[: len(SHAPES) + 1]:
            await ledger.append(e)
        await asyncio.gather(*(ledger.append(e) for e in entries))
    finally:
        await ledger.aclose()
    rows = _rows(ledger_path)
    assert rows == _retired_rows(ledger_path)
    assert (1, "b") in rows and [r for s, r in rows if s == 2] == ["z", "y"] and (3, "solo") in rows
    assert [r for s, r in rows if s == 4] == ["t2", "t1"]
    assert len(rows) == 2 * sum(len(rule_ids(e)) for e in entries[: len(SHAPES) + 1]) + 30 * 2
    _verify(ledger_path)


async def test_a_rule_id_holding_nul_is_stored_whole(ledger_path: Path) -> None:
    """The one place the writer differs from the retired trigger: SQLite's json_each cut a text
    value at U+0000 ("a\\u0000b" became "a"), so verify failed such a record. The writer stores the
    id as recorded: verify passes and `--rule` finds it."""
    ledger = await SqliteLedger.open(ledger_path)
    try:
        await ledger.append({**make_entry(1), "matched_rules": ["a", "a\x00b"]})
    finally:
        await ledger.aclose()
    assert _rows(ledger_path) == [(1, "a"), (1, "a\x00b")]
    _verify(ledger_path)
    with SqliteLedgerReader(ledger_path) as reader:
        assert [r["seq"] for r in query_records(reader, rule="a\x00b")] == [1]


async def test_rule_rows_share_their_record_commit(ledger_path: Path) -> None:
    """Every batch is one BEGIN IMMEDIATE … COMMIT; one with rule rows inserts them after its records
    inside it."""
    ledger = await SqliteLedger.open(ledger_path)
    statements: list[str] = []
    try:
        await ledger.append(make_entry(0))  # the connection's statement cache and schema are warm
        ledger._conn.set_trace_callback(statements.append)  # noqa: SLF001
        await ledger.append(make_entry(2))
        assert [s.split("(")[0] for s in statements] == ["BEGIN IMMEDIATE", "INSERT INTO records", "COMMIT"]
        statements.clear()
        await ledger.append(make_entry(3))
        assert [s.split("(")[0].split(" VALUES")[0] for s in statements] == [
            "BEGIN IMMEDIATE", "INSERT INTO records", "INSERT INTO record_rules", "INSERT INTO record_rules", "COMMIT"]
    finally:
        ledger._conn.set_trace_callback(None)  # noqa: SLF001
        await ledger.aclose()
    assert _rows(ledger_path) == [(3, "rule-1"), (3, "rule-all")]


async def test_a_failed_rule_row_fails_its_whole_batch(ledger_path: Path) -> None:
    """Records and their rule rows commit together: when a rule row cannot be stored, neither is its
    record nor any other of the batch, the head stays, and the ledger goes on afterwards."""
    ledger = await SqliteLedger.open(ledger_path, batch_wait_ms=100)
    try:
        for i in range(2):
            await ledger.append(make_entry(i))
        head = (ledger.size, ledger.head_hash)
        with sqlite3.connect(ledger_path, isolation_level=None) as saboteur:
            saboteur.execute("CREATE TRIGGER sabotage BEFORE INSERT ON record_rules WHEN NEW.rule_id = 'boom' "
                             "BEGIN SELECT RAISE(ABORT, 'disk on fire'); END")
        outcomes = await asyncio.gather(
            ledger.append(make_entry(4)),
            ledger.append({**make_entry(5), "matched_rules": ["fine", "boom"]}),
            ledger.append(make_entry(7)),
            return_exceptions=True,
        )
        assert all(isinstance(o, LedgerError) and "disk on fire" in str(o) for o in outcomes), outcomes
        assert (ledger.size, ledger.head_hash) == head
        with sqlite3.connect(ledger_path, isolation_level=None) as raw:
            assert raw.execute("SELECT max(seq) FROM records").fetchone() == (2,)
            assert raw.execute("SELECT count(*) FROM record_rules WHERE seq > 2").fetchone() == (0,)
            raw.execute("DROP TRIGGER sabotage")
        assert (await ledger.append({**make_entry(5), "matched_rules": ["fine"]})).seq == 3
    finally:
        await ledger.aclose()
    assert _rows(ledger_path) == [(2, "rule-1"), (2, "rule-all"), (3, "fine")]
    _verify(ledger_path)


def _append_as_older_gateway(path: Path, entries: list[dict[str, Any]]) -> None:
    """What a gateway of the trigger's time does with the ledger: open it (re-creating the trigger)
    and insert chained records, leaving their rule rows to the trigger."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(RETIRED_TRIGGER)
        seq, prev = conn.execute("SELECT seq, hash FROM records ORDER BY seq DESC LIMIT 1").fetchone()
        for entry in entries:
            seq += 1
            body = record_bytes(canonical_bytes(entry), prev.hex(), seq)
            prev = leaf_hash(body)
            f = index_fields(entry)
            conn.execute(
                "INSERT INTO records(seq, hash, body, time, principal, tool, decision, status, request_id,"
                " policy_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, prev, body, f.time, f.principal, f.tool, f.decision, f.status, f.request_id, f.policy_version),
            )
    finally:
        conn.close()


def _has_trigger(path: Path) -> bool:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'records_index_rules'").fetchone() is not None


async def test_a_ledger_an_older_gateway_wrote_is_indexed_once_after_the_upgrade(ledger_path: Path) -> None:
    """New writer, then an older gateway (re-creating the trigger, its rows made by it), then the new
    writer again, twice over: the trigger is gone after each open, every record has its rule rows
    exactly once and in the trigger's order, and verify passes on the mixed ledger."""
    n = 0
    for _ in range(2):
        ledger = await SqliteLedger.open(ledger_path, batch_wait_ms=5)
        try:
            assert not _has_trigger(ledger_path)
            await asyncio.gather(*(ledger.append(make_entry(i)) for i in range(n, n + 20)))
            await ledger.append({**make_entry(n + 20), "matched_rules": ["b", "a", "b"]})
        finally:
            await ledger.aclose()
        n += 21
        _verify(ledger_path)
        _append_as_older_gateway(ledger_path, [make_entry(i) for i in range(n, n + 9)])
        n += 9
        assert _has_trigger(ledger_path)
        _verify(ledger_path)
    ledger = await SqliteLedger.open(ledger_path)
    try:
        assert not _has_trigger(ledger_path)
        await ledger.append(make_entry(n + 1))
    finally:
        await ledger.aclose()
    rows = _rows(ledger_path)
    assert rows == _retired_rows(ledger_path)
    assert len(rows) == len(set(rows)) > 60
    _verify(ledger_path)


@pytest.mark.parametrize("bad", ["DELETE FROM record_rules WHERE rowid = (SELECT max(rowid) FROM record_rules)",
                                 "INSERT INTO record_rules(seq, rule_id) SELECT seq, rule_id FROM record_rules LIMIT 1"])
async def test_verify_still_catches_a_tampered_rule_index(ledger_path: Path, bad: str) -> None:
    ledger = await SqliteLedger.open(ledger_path)
    try:
        await fill(ledger, 6)
    finally:
        await ledger.aclose()
    _verify(ledger_path)
    with sqlite3.connect(ledger_path, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER record_rules_no_delete")
        conn.execute(bad)
    with SqliteLedgerReader(ledger_path) as reader:
        report = verify_ledger(reader)
    assert not report.ok and "rule index rows differ" in report.problem, report
