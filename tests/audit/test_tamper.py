"""Every tamper class on a real ledger, on each backend: `audit verify` exits 1 and names where (CLI and library).

The attacker has the storage and drops (SQLite) or disables (PostgreSQL) the append-only triggers
first. The `tamper` fixture yields a backend-neutral object with one method per tamper class:
`SqliteTamper` on a ledger file, `PostgresTamper` on a real PostgreSQL database.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.canon import canonical_bytes
from audit.checkpoint import CheckpointSigner, checkpoint_jwk, parse_checkpoint, read_stamp
from audit.merkle import leaf_hash, root_hash
from audit.query import query_records
from audit.records import SUBTREES_KEY, IndexFields, index_fields, parse_record, record_bytes, rule_ids
from audit.postgres import PostgresLedgerReader
from audit.sqlite import SqliteLedgerReader
from audit.sqlite_files import SCHEMA as SQLITE_SCHEMA
from audit.verify import VerifyReport, verify_ledger
from audit.verify_rows import META_KEYS
from gateway.cli.main import main as dharma_main
from gateway.crypto.receipts import KeyStore

from .conftest import BACKENDS, Location, attacker, fill, make_entry, move_head, new_location, open_ledger

SIZE = 20
INDEXED_COLUMNS = tuple(IndexFields.__dataclass_fields__)


class Tamper(Protocol):
    """What an attacker with write access to the ledger's storage can do, one method per class."""

    location: str
    signer: CheckpointSigner  # the ledger's checkpoint key (verify trusts it; a forger may hold it too)

    def edit_record_bytes(self, seq: int) -> None: ...
    def edit_column(self, seq: int, column: str, value: Any) -> None: ...
    def replace_body(self, seq: int, body: bytes) -> None: ...
    def delete_index_row(self, seq: int, rule: str) -> None: ...
    def insert_index_row(self, seq: int, rule: str) -> None: ...
    def delete_record(self, seq: int) -> None: ...
    def insert_record(self, seq: int) -> None: ...
    def swap_records(self, a: int, b: int) -> None: ...
    def truncate(self, keep: int) -> None: ...
    def rewrite_history(self, seq: int) -> None: ...
    def store_checkpoint(self, signer: CheckpointSigner) -> None: ...
    def sql(self, statement: str, params: Any = ()) -> list[Any]: ...
    def schema_columns(self) -> set[str]: ...
    def rules_of(self, seq: int) -> tuple[str, ...]: ...
    def reader(self) -> Any: ...


class SqliteTamper:
    """Tampering done with a raw sqlite3 connection after dropping the triggers."""

    def __init__(self, location: Location) -> None:
        self.location = str(location)
        self._conn = attacker(location)

    def close(self) -> None:
        self._conn.close()

    def reader(self) -> SqliteLedgerReader:
        return SqliteLedgerReader(self.location)

    def sql(self, statement: str, params: Any = ()) -> list[Any]:
        """Any statement (`?` placeholders), its rows."""
        cur = self._conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def schema_columns(self) -> set[str]:
        """Every `table.column` of the ledger's tables, as the database describes them."""
        tables = [t for (t,) in self.sql("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {f"{table}.{row[1]}" for table in tables for row in self.sql(f"PRAGMA table_info({table})")}

    def _body(self, seq: int) -> bytes:
        return bytes(self._conn.execute("SELECT body FROM records WHERE seq = ?", (seq,)).fetchone()[0])

    def _hash(self, seq: int) -> bytes:
        return bytes(self._conn.execute("SELECT hash FROM records WHERE seq = ?", (seq,)).fetchone()[0])

    def rules_of(self, seq: int) -> tuple[str, ...]:
        return tuple(r for (r,) in self._conn.execute("SELECT rule_id FROM record_rules WHERE seq = ? ORDER BY rule_id", (seq,)))

    def edit_record_bytes(self, seq: int) -> None:
        body = self._body(seq)
        assert b'"request_id":"req-' in body
        self._conn.execute("UPDATE records SET body = ? WHERE seq = ?", (body.replace(b'"request_id":"req-', b'"request_id":"rex-'), seq))

    def replace_body(self, seq: int, body: bytes) -> None:
        self._conn.execute("UPDATE records SET body = ? WHERE seq = ?", (body, seq))

    def edit_column(self, seq: int, column: str, value: Any) -> None:
        assert column in INDEXED_COLUMNS
        self._conn.execute(f"UPDATE records SET {column} = ? WHERE seq = ?", (value, seq))

    def delete_index_row(self, seq: int, rule: str) -> None:
        assert self._conn.execute("DELETE FROM record_rules WHERE seq = ? AND rule_id = ?", (seq, rule)).rowcount == 1

    def insert_index_row(self, seq: int, rule: str) -> None:
        self._conn.execute("INSERT INTO record_rules(seq, rule_id) VALUES (?, ?)", (seq, rule))

    def delete_record(self, seq: int) -> None:
        self._conn.execute("DELETE FROM records WHERE seq = ?", (seq,))
        self._conn.execute("DELETE FROM record_rules WHERE seq = ?", (seq,))

    def insert_record(self, seq: int) -> None:
        """A forged record at `seq`, chained to seq - 1 and indexed; the later ones move up by one."""
        for table in ("records", "record_rules"):
            self._conn.execute(f"UPDATE {table} SET seq = -(seq + 1) WHERE seq >= ?", (seq,))
            self._conn.execute(f"UPDATE {table} SET seq = -seq WHERE seq < 0")
        entry = {**make_entry(10_000), "decision": "allow", "principal": "mallory"}
        body = record_bytes(canonical_bytes(entry), self._hash(seq - 1).hex(), seq)
        f = index_fields(entry)
        self._conn.execute(
            "INSERT INTO records(seq, hash, body, time, principal, tool, decision, status, request_id, policy_version)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, leaf_hash(body), body, f.time, f.principal, f.tool, f.decision, f.status, f.request_id, f.policy_version),
        )
        self._conn.executemany("INSERT INTO record_rules(seq, rule_id) VALUES (?, ?)", [(seq, r) for r in rule_ids(entry)])

    def swap_records(self, a: int, b: int) -> None:
        """Swap two whole records (bytes, hash, columns and rule rows) between their positions."""
        for table in ("records", "record_rules"):
            self._conn.execute(f"UPDATE {table} SET seq = -1 WHERE seq = ?", (a,))
            self._conn.execute(f"UPDATE {table} SET seq = ? WHERE seq = ?", (a, b))
            self._conn.execute(f"UPDATE {table} SET seq = ? WHERE seq = -1", (b,))

    def truncate(self, keep: int) -> None:
        """Drop every record after `keep`, their rule rows and the stored checkpoints that saw them."""
        for table in ("records", "record_rules"):
            self._conn.execute(f"DELETE FROM {table} WHERE seq > ?", (keep,))
        self._conn.execute("DELETE FROM checkpoints WHERE size > ?", (keep,))

    def rewrite_history(self, seq: int) -> None:
        """Change record `seq` and re-chain every later one, deleting the stored checkpoints (a careful forger)."""
        prev = self._hash(seq - 1).hex()
        rows = self._conn.execute("SELECT seq, body FROM records WHERE seq >= ? ORDER BY seq", (seq,)).fetchall()
        for at, body in rows:
            entry = parse_record(bytes(body)).entry
            if at == seq:
                entry = entry.replace(b'"backend":"demo"', b'"backend":"evil"')  # a field no index holds
            new = record_bytes(entry, prev, at)
            digest = leaf_hash(new)
            self._conn.execute("UPDATE records SET body = ?, hash = ? WHERE seq = ?", (new, digest, at))
            prev = digest.hex()
        self._conn.execute("DELETE FROM checkpoints")

    def store_checkpoint(self, signer: CheckpointSigner) -> None:
        """What a forger holding the checkpoint key can do: sign the records as they now are and store it, stamped."""
        hashes = [bytes(h) for (h,) in self._conn.execute("SELECT hash FROM records ORDER BY seq").fetchall()]
        latest = self._conn.execute("SELECT max(size) FROM checkpoints").fetchone()[0]
        note, created_at = signer.sign_stored(len(hashes), root_hash(hashes), latest)
        self._conn.execute("INSERT INTO checkpoints(size, note, created_at) VALUES (?, ?, ?)", (len(hashes), note, created_at))


class PostgresTamper(SqliteTamper):
    """The same tampering by the owner of a PostgreSQL ledger, its triggers disabled (the attacker's
    `execute` takes `?` placeholders). A careful forger also moves the `head` row, so writers still open."""

    def reader(self) -> PostgresLedgerReader:  # type: ignore[override]
        return PostgresLedgerReader(self.location)

    def schema_columns(self) -> set[str]:
        return {f"{t}.{c}" for t, c in self.sql("SELECT table_name, column_name FROM information_schema.columns"
                                                 " WHERE table_schema = current_schema()")}

    def truncate(self, keep: int) -> None:
        super().truncate(keep)
        move_head(self._conn)

    def rewrite_history(self, seq: int) -> None:
        super().rewrite_history(seq)
        move_head(self._conn)


async def built(request: pytest.FixtureRequest, tmp_path: Path, state_root: Path, checkpoints: tuple[int, ...]) -> Tamper:
    """A closed ledger on the backend `request.param` names, with a stored checkpoint at each of
    `checkpoints` (the last is its size), signed by the state root's checkpoint key; and its forger."""
    path = new_location(request.param, request, tmp_path)
    keys = KeyStore.open(state_root, create=True)
    ledger = await open_ledger(path)
    done = 0
    for size in checkpoints:
        await fill(ledger, size - done, start=done)
        await ledger.checkpoint(keys.checkpoint_key, keys.checkpoint_key_name, "example.com/karma")
        done = size
    await ledger.aclose()
    forger = PostgresTamper(path) if request.param == "postgres" else SqliteTamper(path)
    forger.signer = CheckpointSigner(keys.checkpoint_key, keys.checkpoint_key_name, "example.com/karma")
    request.addfinalizer(forger.close)
    return forger


@pytest.fixture(params=BACKENDS)
async def tamper(request: pytest.FixtureRequest, tmp_path: Path, state_root: Path) -> Tamper:
    """A closed ledger of 20 records (stored checkpoints at 10 and 20), ready to be tampered with."""
    return await built(request, tmp_path, state_root, (10, SIZE))


def library_verify(tamper: Tamper, checkpoint: Path | None = None) -> VerifyReport:
    note = None if checkpoint is None else parse_checkpoint(checkpoint.read_text(encoding="utf-8"))
    reader = tamper.reader()
    try:
        return verify_ledger(reader, note, keys=[(tamper.signer.key_name, tamper.signer.private_key.public_key())])
    finally:
        reader.close()


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    capsys.readouterr()
    code = dharma_main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out + captured.err


def assert_caught(tamper: Tamper, capsys: pytest.CaptureFixture[str], seq: int | None, *needles: str,
                  checkpoint: Path | None = None) -> VerifyReport:
    """verify fails (library: first_bad_seq; CLI: exit 1, `at seq N`) and says each of `needles`."""
    report = library_verify(tamper, checkpoint)
    assert not report.ok and report.first_bad_seq == seq, report
    for needle in needles:
        assert needle in report.problem, report.problem
    extra = ("--checkpoint", checkpoint) if checkpoint is not None else ()
    code, out = cli(capsys, "audit", "verify", "--ledger", tamper.location, *extra)
    assert code == 1 and out.startswith("FAIL"), out
    if seq is not None:
        assert f"at seq {seq}:" in out, out
    for needle in needles:
        assert needle in out, out
    return report


def save_checkpoint(tamper: Tamper, capsys: pytest.CaptureFixture[str], path: Path) -> Path:
    code, note = cli(capsys, "audit", "checkpoint", "--ledger", tamper.location)
    assert code == 0, note
    path.write_text(note, encoding="utf-8")
    return path


def first_seq_with_rules(tamper: Tamper, start: int = 7) -> int:
    return next(seq for seq in range(start, SIZE + 1) if tamper.rules_of(seq))


def test_an_intact_ledger_verifies(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    assert library_verify(tamper).ok
    code, out = cli(capsys, "audit", "verify", "--ledger", tamper.location)
    assert code == 0 and out.startswith("OK") and f"{SIZE} records" in out, out


def test_edited_record_bytes(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    tamper.edit_record_bytes(7)
    assert_caught(tamper, capsys, 7, "record 7 was modified")


@pytest.mark.parametrize("column", INDEXED_COLUMNS)
@pytest.mark.parametrize("forged", ["forged", None])
def test_edited_derived_column(tamper: Tamper, capsys: pytest.CaptureFixture[str], column: str, forged: str | None) -> None:
    tamper.edit_column(7, column, forged)
    assert_caught(tamper, capsys, 7, f"record 7: indexed column {column} holds {forged!r}")


def test_a_blob_smuggled_into_a_column(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    if isinstance(tamper, PostgresTamper):
        pytest.skip("PostgreSQL's text columns refuse a blob; SQLite's dynamic typing takes one")
    with tamper.reader() as reader:
        principal = next(iter(reader.index_suspects()), None)
    assert principal is None  # nothing to re-check in an intact ledger
    tamper.edit_column(9, "principal", b"alice")
    assert_caught(tamper, capsys, 9, "record 9: indexed column principal holds b'alice'")


def test_deleted_index_row(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    seq = first_seq_with_rules(tamper)
    rule = tamper.rules_of(seq)[0]
    tamper.delete_index_row(seq, rule)
    assert_caught(tamper, capsys, seq, f"record {seq}: rule index rows differ", f"missing ['{rule}']")


def test_inserted_index_row(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    tamper.insert_index_row(5, "fs-no-traversal")
    assert_caught(tamper, capsys, 5, "record 5: rule index rows differ", "extra ['fs-no-traversal']")


def test_duplicated_index_row(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    seq = first_seq_with_rules(tamper)
    rule = tamper.rules_of(seq)[0]
    tamper.insert_index_row(seq, rule)
    assert_caught(tamper, capsys, seq, f"duplicated ['{rule}']")


def test_index_row_for_no_record(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    tamper.insert_index_row(SIZE + 5, "rule-all")
    assert_caught(tamper, capsys, SIZE + 5, f"the rule index has a row ('rule-all') for record {SIZE + 5}, which is not in the ledger")


def test_deleted_record(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    tamper.delete_record(7)
    assert_caught(tamper, capsys, 7, "record 7 is missing")


def test_inserted_record(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    tamper.insert_record(7)
    assert_caught(tamper, capsys, 7, "record 8 holds the record written as seq 7", "inserted")


def test_reordered_records(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    tamper.swap_records(7, 12)
    assert_caught(tamper, capsys, 7, "record 7 holds the record written as seq 12")


def test_truncation_against_a_checkpoint_file(tamper: Tamper, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    saved = save_checkpoint(tamper, capsys, tmp_path / "checkpoint.txt")
    tamper.truncate(17)
    assert library_verify(tamper).ok  # what is left is self-consistent: only the checkpoint kept outside tells
    assert_caught(tamper, capsys, 18, "ledger has 17 records but checkpoint at size 20", "truncated", checkpoint=saved)


def test_fork_two_signed_checkpoints_of_one_size(tamper: Tamper, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    before = save_checkpoint(tamper, capsys, tmp_path / "before.txt")
    tamper.rewrite_history(12)
    tamper.store_checkpoint(tamper.signer)  # the forger holds the key: the ledger stores a checkpoint again
    after = save_checkpoint(tamper, capsys, tmp_path / "after.txt")
    old, new = (parse_checkpoint(p.read_text(encoding="utf-8")) for p in (before, after))
    assert old.size == new.size == SIZE and old.root != new.root  # both signed by the checkpoint key: a fork
    assert library_verify(tamper, after).ok  # the rewritten ledger agrees with the forger's checkpoint
    assert_caught(tamper, capsys, None, "history was rewritten (a fork)", "somewhere in records 1..20", checkpoint=before)


def test_queries_recheck_hits_and_only_verify_finds_a_hidden_record(tamper: Tamper) -> None:
    with tamper.reader() as reader:
        denied = [r["seq"] for r in query_records(reader, decision="deny")]
        ruled = [r["seq"] for r in query_records(reader, rule="rule-all")]
    hidden, relabelled = denied[0], denied[1]
    tamper.edit_column(hidden, "decision", "allow")  # hide a deny from `--decision deny`
    tamper.delete_index_row(ruled[0], "rule-all")  # hide a record from `--rule rule-all`
    tamper.edit_column(relabelled, "principal", "nobody")
    with tamper.reader() as reader:
        assert hidden not in [r["seq"] for r in query_records(reader, decision="deny")]  # missed: only verify tells
        assert hidden not in [r["seq"] for r in query_records(reader, decision="allow")]  # a false hit is dropped
        assert [r["seq"] for r in query_records(reader, principal="nobody")] == []
        assert ruled[0] not in [r["seq"] for r in query_records(reader, rule="rule-all")]
    report = library_verify(tamper)
    assert not report.ok and report.first_bad_seq == min(hidden, ruled[0], relabelled)


def test_an_unverified_ledger_makes_query_warn(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    if isinstance(tamper, PostgresTamper):
        pytest.skip("the verified-stamp reminder is a file beside a SQLite ledger; a PostgreSQL ledger has none")
    code, out = cli(capsys, "audit", "query", "--ledger", tamper.location, "--decision", "deny", "--format", "jsonl")
    assert code == 0 and "not been verified" in out, out
    assert cli(capsys, "audit", "verify", "--ledger", tamper.location)[0] == 0
    code, out = cli(capsys, "audit", "query", "--ledger", tamper.location, "--decision", "deny", "--format", "jsonl")
    assert code == 0 and "not been verified" not in out and '"decision":"deny"' in out, out


def test_the_index_check_hands_python_only_the_suspects(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    """The backend's SQL pass returns no record of an intact ledger and exactly the edited ones after
    tampering; a body the database cannot read as JSON still reaches the exact check."""
    with tamper.reader() as reader:
        assert list(reader.index_suspects()) == []
    ruled = first_seq_with_rules(tamper, start=10)
    tamper.edit_column(7, "decision", "forged")
    tamper.delete_index_row(ruled, tamper.rules_of(ruled)[0])
    with tamper.reader() as reader:
        assert [r.seq for r in reader.index_suspects()] == [7, ruled]
    tamper.replace_body(3, b"\xff not json")
    with tamper.reader() as reader:
        assert 3 in [r.seq for r in reader.index_suspects()]  # the window falls back to every record
    assert_caught(tamper, capsys, 3, "record 3")


# --- every stored row: a case per column of every table, and rows deleted or added ----------------

WIDE = 300  # past 256 records: the ledger stores a subtree hash row too
WIDE_CHECKPOINTS = (100, 200, WIDE)
ORIGIN = "example.com/karma"


@pytest.fixture(params=BACKENDS)
async def wide(request: pytest.FixtureRequest, tmp_path: Path, state_root: Path) -> Tamper:
    """A closed ledger with rows in every table: 300 records and their rule rows, the subtree hash of
    records 1..256, stored checkpoints at 100, 200 and 300, the meta rows and (PostgreSQL) the head row."""
    return await built(request, tmp_path, state_root, WIDE_CHECKPOINTS)


Found = tuple[int | None, tuple[str, ...]]
"""Where verify must fail (a record's seq, or None for a row beside the records) and what it must say."""


def _indexed_case(column: str) -> Callable[[Tamper], Found]:
    def edit(t: Tamper) -> Found:
        t.edit_column(7, column, "forged")
        return 7, (f"record 7: indexed column {column} holds 'forged'",)
    return edit


def _rule_row(t: Tamper) -> tuple[int, str]:
    seq = first_seq_with_rules(t)
    return seq, t.rules_of(seq)[0]


def _rule_seq(t: Tamper) -> Found:
    seq, rule = _rule_row(t)
    t.sql("UPDATE record_rules SET seq = ? WHERE seq = ? AND rule_id = ?", (WIDE + 1000, seq, rule))
    return seq, (f"record {seq}: rule index rows differ", "table record_rules", f"missing ['{rule}']")


def _rule_id(t: Tamper) -> Found:
    seq, rule = _rule_row(t)
    t.sql("UPDATE record_rules SET rule_id = 'forged' WHERE seq = ? AND rule_id = ?", (seq, rule))
    return seq, (f"record {seq}: rule index rows differ", "table record_rules", "extra ['forged']")


def _note_with_another_root(t: Tamper) -> Found:
    (note,) = t.sql("SELECT note FROM checkpoints WHERE size = 200")[0]
    root = note.split("\n")[2]
    t.sql("UPDATE checkpoints SET note = ? WHERE size = 200", (note.replace(root, base64.b64encode(b"\x07" * 32).decode()),))
    return None, ("stored checkpoint at size 200: column note:", "does not verify")


def _sql_case(statement: str, params: tuple[Any, ...], seq: int | None, *needles: str) -> Callable[[Tamper], Found]:
    def edit(t: Tamper) -> Found:
        t.sql(statement, params)
        return seq, needles
    return edit


def _head_one(t: Tamper) -> Found:
    t.sql("ALTER TABLE head DROP CONSTRAINT head_one_check")  # the owner may; then `one` can be false
    t.sql("UPDATE head SET one = false")
    return None, ("the head row: column one holds False",)


COLUMN_CASES: dict[str, Callable[[Tamper], Found]] = {
    "records.seq": _sql_case("UPDATE records SET seq = 100000 WHERE seq = 7", (), 7, "record 7 is missing", "column seq"),
    "records.hash": _sql_case("UPDATE records SET hash = ? WHERE seq = 7", (b"\x01" * 32,), 7, "record 7 was modified",
                              "(column hash)"),
    "records.body": lambda t: (t.edit_record_bytes(7), (7, ("record 7 was modified", "(column body)")))[1],
    **{f"records.{column}": _indexed_case(column) for column in INDEXED_COLUMNS},
    "record_rules.seq": _rule_seq,
    "record_rules.rule_id": _rule_id,
    "subtrees.height": _sql_case("UPDATE subtrees SET height = 16 WHERE height = 8 AND idx = 0", (), None,
                                 "stored subtree hash at height 16, index 0", "column height or idx"),
    "subtrees.idx": _sql_case("UPDATE subtrees SET idx = 3 WHERE height = 8 AND idx = 0", (), None,
                              "stored subtree hash at height 8, index 3", "column height or idx"),
    "subtrees.hash": _sql_case("UPDATE subtrees SET hash = ? WHERE height = 8 AND idx = 0", (b"\x01" * 32,), None,
                               "stored subtree hash at height 8, index 0 (records 1..256) does not match", "column hash"),
    "checkpoints.size": _sql_case("UPDATE checkpoints SET size = 150 WHERE size = 100", (), None,
                                  "stored checkpoint at size 150: column size holds 150 but its note (column note) is for size 100"),
    "checkpoints.note": _note_with_another_root,
    "checkpoints.created_at": _sql_case("UPDATE checkpoints SET created_at = ? WHERE size = 200", ("2026-01-01T00:00:00.000000Z",),
                                        None, "stored checkpoint at size 200: column created_at holds "
                                        "'2026-01-01T00:00:00.000000Z' but its stamp says"),
    "meta.key": _sql_case("UPDATE meta SET key = 'created_ax' WHERE key = 'created_at'", (), None,
                          "meta row 'created_ax': column key holds a key no ledger writes"),
    "meta.value": _sql_case("UPDATE meta SET value = '16' WHERE key = ?", (SUBTREES_KEY,), None,
                            f"meta {SUBTREES_KEY}: column value holds '16'"),
    "head.one": _head_one,
    "head.size": _sql_case("UPDATE head SET size = size - 1", (), None, f"the head row: column size holds {WIDE - 1}"),
    "head.hash": _sql_case("UPDATE head SET hash = ?", (b"\x02" * 32,), None, "the head row: column hash holds " + "02" * 32),
}
"""One edit per column of every ledger table and what verify must say about it. A column the schema
gains without a case here fails `test_an_edited_column_is_caught` (SQLite's schema, read at
collection) and `test_every_column_of_every_table_has_a_case` (each backend's, read from a ledger)."""
POSTGRES_ONLY = {"head"}  # SQLite keeps no head row


def _sqlite_columns() -> set[str]:
    """Every `table.column` of a new SQLite ledger, from the schema it is created with."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SQLITE_SCHEMA)
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {f"{table}.{row[1]}" for table in tables for row in conn.execute(f"PRAGMA table_info({table})")}
    finally:
        conn.close()


@pytest.mark.parametrize("column", sorted(_sqlite_columns() | set(COLUMN_CASES)))
def test_an_edited_column_is_caught(wide: Tamper, capsys: pytest.CaptureFixture[str], column: str) -> None:
    edit = COLUMN_CASES.get(column)
    assert edit is not None, (f"the ledger's schema has column {column} and no tamper case: add one to COLUMN_CASES, "
                              "and the check in audit.verify or audit.verify_rows that names it")
    if column.split(".")[0] in POSTGRES_ONLY and not isinstance(wide, PostgresTamper):
        pytest.skip("a SQLite ledger keeps no head row")
    assert library_verify(wide).ok
    seq, needles = edit(wide)
    assert_caught(wide, capsys, seq, *needles)


def test_every_column_of_every_table_has_a_case(tamper: Tamper) -> None:
    """The schema as each backend describes it (PRAGMA table_info, information_schema) has no column
    without a tamper case, and no case names a column that is gone."""
    wanted = {c for c in COLUMN_CASES if isinstance(tamper, PostgresTamper) or c.split(".")[0] not in POSTGRES_ONLY}
    assert tamper.schema_columns() == wanted


META_EDITS = {"format": "dharma-ledger/9", "created_at": "yesterday", SUBTREES_KEY: "16"}


@pytest.mark.parametrize("key", sorted(META_EDITS))
def test_an_edited_meta_value_is_caught(tamper: Tamper, capsys: pytest.CaptureFixture[str], key: str) -> None:
    assert {k for (k,) in tamper.sql("SELECT key FROM meta")} == set(META_EDITS) == set(META_KEYS)  # every key is checked
    tamper.sql("UPDATE meta SET value = ? WHERE key = ?", (META_EDITS[key], key))
    if key == "format":  # no reader opens it: it is not a ledger of this format
        code, out = cli(capsys, "audit", "verify", "--ledger", tamper.location)
        assert code == 2 and "format 'dharma-ledger/9', expected 'dharma-ledger/1'" in out, out
        return
    assert_caught(tamper, capsys, None, f"meta {key}: column value holds {META_EDITS[key]!r}")


def test_a_ledger_created_in_the_future_is_caught(tamper: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    tamper.sql("UPDATE meta SET value = '2999-01-01T00:00:00.000000Z' WHERE key = 'created_at'")
    assert_caught(tamper, capsys, None, "meta created_at: column value holds '2999-01-01T00:00:00.000000Z', a time in the future")


@pytest.mark.parametrize(("statement", "needle"), [
    ("DELETE FROM meta WHERE key = 'created_at'", "meta has no created_at row"),
    (f"DELETE FROM meta WHERE key = '{SUBTREES_KEY}'", f"meta has no {SUBTREES_KEY} row, yet the ledger stores subtree hashes"),
    ("INSERT INTO meta(key, value) VALUES ('owner', 'mallory')", "meta row 'owner': column key holds a key no ledger writes"),
    ("DELETE FROM head", "the head table holds 0 rows"),
])
def test_a_deleted_or_added_meta_or_head_row_is_caught(wide: Tamper, capsys: pytest.CaptureFixture[str], statement: str,
                                                       needle: str) -> None:
    if "head" in statement and not isinstance(wide, PostgresTamper):
        pytest.skip("a SQLite ledger keeps no head row")
    wide.sql(statement)
    assert_caught(wide, capsys, None, needle)


def test_an_intact_ledger_says_how_far_its_stored_checkpoints_reach(wide: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    report = library_verify(wide)
    assert report.ok and report.reach is not None
    assert (report.reach.size, report.reach.count, report.reach.unstamped) == (WIDE, 3, 0)
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location)
    assert code == 0, out
    assert f"the newest stored checkpoint reaches size {WIDE} of {WIDE} (stored {report.reach.created_at}); 3 stored checkpoint(s) checked" in out


@pytest.mark.parametrize("deleted", [100, 200])
def test_a_deleted_first_or_middle_checkpoint_is_named_by_the_next_ones_stamp(wide: Tamper, capsys: pytest.CaptureFixture[str],
                                                                             deleted: int) -> None:
    wide.sql("DELETE FROM checkpoints WHERE size = ?", (deleted,))
    after = deleted + 100
    assert_caught(wide, capsys, None, f"stored checkpoint at size {after}: its stamp says the stored checkpoint before it is at "
                  f"size {deleted}, and no row holds it: the stored checkpoint at size {deleted} was deleted")


def test_a_deleted_newest_checkpoint_shows_as_a_gap_against_a_saved_one(wide: Tamper, capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    saved = save_checkpoint(wide, capsys, tmp_path / "checkpoint.txt")
    assert read_stamp(saved.read_text(encoding="utf-8")) is not None  # `audit checkpoint` printed the stored one
    wide.sql("DELETE FROM checkpoints WHERE size = ?", (WIDE,))
    report = library_verify(wide)
    assert report.ok and report.reach is not None and report.reach.size == 200  # nothing inside the ledger tells
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location)
    assert code == 0 and f"the newest stored checkpoint reaches size 200 of {WIDE}" in out, out
    assert f"records 201..{WIDE} are under none yet" in out
    assert_caught(wide, capsys, None, "the ledger's newest stored checkpoint reaches size 200 (stored ",
                  f"your checkpoint at size {WIDE} was stored in this ledger", "stored checkpoints were deleted", checkpoint=saved)


def test_a_gap_against_a_checkpoint_signed_outside_the_ledger(wide: Tamper, capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    code, note = cli(capsys, "audit", "checkpoint", "--ledger", wide.location, "--origin", ORIGIN)  # signed now, never stored
    assert code == 0 and read_stamp(note) is None, note
    saved = tmp_path / "checkpoint.txt"
    saved.write_text(note, encoding="utf-8")
    wide.sql("DELETE FROM checkpoints WHERE size = ?", (WIDE,))
    assert_caught(wide, capsys, None, "the ledger's newest stored checkpoint reaches size 200",
                  f"your checkpoint reaches size {WIDE}: the stored checkpoints after size 200 are missing", checkpoint=saved)


async def test_a_deleted_checkpoint_signed_again_is_not_the_one_the_auditor_holds(wide: Tamper, capsys: pytest.CaptureFixture[str],
                                                                                  tmp_path: Path) -> None:
    saved = save_checkpoint(wide, capsys, tmp_path / "checkpoint.txt")
    wide.sql("DELETE FROM checkpoints WHERE size = ?", (WIDE,))
    ledger = await open_ledger(wide.location if isinstance(wide, PostgresTamper) else Path(wide.location))
    await ledger.checkpoint(wide.signer.private_key, wide.signer.key_name, ORIGIN)  # a writer signs the size again
    await ledger.aclose()
    assert library_verify(wide).ok  # stamped and linked again: only the auditor's copy tells
    assert_caught(wide, capsys, None, f"the stored checkpoint at size {WIDE} (stored ", "is not the one you hold",
                  "deleted and the size signed again", checkpoint=saved)


def test_a_checkpoint_row_added_by_another_key_is_named(wide: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    other = CheckpointSigner(Ed25519PrivateKey.generate(), wide.signer.key_name, ORIGIN)
    with wide.reader() as reader:
        root = root_hash(reader.leaf_hashes(250))
    note, created_at = other.sign_stored(250, root, 200)
    wide.sql("INSERT INTO checkpoints(size, note, created_at) VALUES (?, ?, ?)", (250, note, created_at))
    assert_caught(wide, capsys, None, "stored checkpoint at size 250: column note is stamped by none of the known checkpoint keys")


def test_a_stamp_removed_from_a_stored_checkpoint_is_named(wide: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    (note,) = wide.sql("SELECT note FROM checkpoints WHERE size = ?", (WIDE,))[0]
    wide.sql("UPDATE checkpoints SET note = ? WHERE size = ?", (note[: note.rstrip("\n").rfind("\n") + 1], WIDE))
    assert_caught(wide, capsys, None, f"stored checkpoint at size {WIDE}: column note carries no stamp, yet the stored "
                  "checkpoint at size 200 before it does")


def test_a_stamp_removed_from_the_first_checkpoint_is_named_by_the_next_ones(wide: Tamper,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (note,) = wide.sql("SELECT note FROM checkpoints WHERE size = 100")[0]
    wide.sql("UPDATE checkpoints SET note = ?, created_at = '2026-01-01T00:00:00.000000Z' WHERE size = 100",
             (note[: note.rstrip("\n").rfind("\n") + 1],))  # it would pass for one stored before stamps existed
    assert_caught(wide, capsys, None, "stored checkpoint at size 200: its stamp says the stored checkpoint before it "
                  "(size 100) carries a stamp, and it carries none: its stamp was removed")


def test_a_line_after_a_stamp_is_named(wide: Tamper, capsys: pytest.CaptureFixture[str]) -> None:
    (note,) = wide.sql("SELECT note FROM checkpoints WHERE size = 100")[0]
    witness = CheckpointSigner(Ed25519PrivateKey.generate(), "witness", ORIGIN)
    with wide.reader() as reader:
        line = witness.sign(100, root_hash(reader.leaf_hashes(100))).split("\n\n")[1]
    wide.sql("UPDATE checkpoints SET note = ? WHERE size = 100", (note + line,))
    assert_caught(wide, capsys, None, "stored checkpoint at size 100: column note carries no stamp and 3 signature lines")


def test_unstamped_checkpoints_of_an_older_ledger_are_checked_for_form_and_order(wide: Tamper,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for (size, note), day in zip(wide.sql("SELECT size, note FROM checkpoints ORDER BY size"), (1, 2, 3), strict=True):
        wide.sql("UPDATE checkpoints SET note = ?, created_at = ? WHERE size = ?",
                 (note[: note.rstrip("\n").rfind("\n") + 1], f"2026-01-0{day}T00:00:00.000000Z", size))
    report = library_verify(wide)
    assert report.ok and report.reach is not None and report.reach.unstamped == 3
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location)
    assert code == 0 and "the first 3 stored checkpoint(s) were stored before checkpoints were stamped" in out, out
    wide.sql("UPDATE checkpoints SET created_at = '2025-12-31T00:00:00.000000Z' WHERE size = ?", (WIDE,))
    assert_caught(wide, capsys, None, f"stored checkpoint at size {WIDE}: column created_at holds '2025-12-31T00:00:00.000000Z', "
                  "before the stored checkpoint at size 200", "go back in time")
    wide.sql("UPDATE checkpoints SET created_at = 'yesterday' WHERE size = 200")
    assert_caught(wide, capsys, None, "stored checkpoint at size 200: column created_at holds 'yesterday', not an RFC 3339 UTC time")


def test_verify_checks_stored_signatures_with_the_published_keys_or_refuses(wide: Tamper, capsys: pytest.CaptureFixture[str],
                                                                            tmp_path: Path, state_root: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(KeyStore.open(state_root, create=False).jwks()), encoding="utf-8")
    saved = save_checkpoint(wide, capsys, tmp_path / "checkpoint.txt")
    monkeypatch.setenv("DHARMA_STATE_ROOT", str(tmp_path / "elsewhere"))  # an auditor's machine: no keys here
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location)
    assert code == 2 and "no checkpoint key is here to check them" in out and "pass --jwks FILE" in out, out
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location, "--checkpoint", saved)
    assert code == 2 and f"cannot check the signature of {saved}" in out, out
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location, "--jwks", jwks, "--checkpoint", saved)
    assert code == 0 and "3 stored checkpoint(s) checked" in out and "without their signatures" not in out, out
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location, "--no-signature-check")
    assert code == 0 and "without their signatures (--no-signature-check)" in out, out
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"keys": [checkpoint_jwk("dharma-gateway", Ed25519PrivateKey.generate().public_key())]}),
                     encoding="utf-8")
    code, out = cli(capsys, "audit", "verify", "--ledger", wide.location, "--jwks", other)
    assert code == 1 and "stored checkpoint at size 100: column note is stamped by none of the known checkpoint keys" in out, out
