"""Every tamper class on a real ledger, on each backend: `audit verify` exits 1 and names where (CLI and library).

The attacker has the storage and drops (SQLite) or disables (PostgreSQL) the append-only triggers
first. The `tamper` fixture yields a backend-neutral object with one method per tamper class:
`SqliteTamper` on a ledger file, `PostgresTamper` on a real PostgreSQL database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from audit.canon import canonical_bytes
from audit.checkpoint import CheckpointSigner, parse_checkpoint
from audit.merkle import leaf_hash, root_hash
from audit.query import query_records
from audit.records import IndexFields, index_fields, parse_record, record_bytes, rule_ids
from audit.postgres import PostgresLedgerReader
from audit.sqlite import SqliteLedgerReader
from audit.verify import VerifyReport, verify_ledger
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

    def truncate(self, keep: int) -> None:
        super().truncate(keep)
        move_head(self._conn)

    def rewrite_history(self, seq: int) -> None:
        super().rewrite_history(seq)
        move_head(self._conn)


@pytest.fixture(params=BACKENDS)
async def tamper(request: pytest.FixtureRequest, tmp_path: Path, state_root: Path) -> Iterator[Tamper]:
    """A closed ledger of 20 records (stored checkpoints at 10 and 20), ready to be tampered with."""
    path = new_location(request.param, request, tmp_path)
    keys = KeyStore.open(state_root, create=True)
    ledger = await open_ledger(path)
    await fill(ledger, 10)
    await ledger.checkpoint(keys.checkpoint_key, keys.checkpoint_key_name, "example.com/karma")
    await fill(ledger, SIZE - 10, start=10)
    await ledger.checkpoint(keys.checkpoint_key, keys.checkpoint_key_name, "example.com/karma")
    await ledger.aclose()
    forger = PostgresTamper(path) if request.param == "postgres" else SqliteTamper(path)
    forger.signer = CheckpointSigner(keys.checkpoint_key, keys.checkpoint_key_name, "example.com/karma")
    yield forger
    forger.close()


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
