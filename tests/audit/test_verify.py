"""verify_ledger against a real SQLite file tampered with by someone who drops the triggers."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import Checkpoint, verify_checkpoint
from audit.merkle import EMPTY_ROOT, leaf_hash
from audit.records import GENESIS_PREV, parse_record, record_bytes
from audit.verify import verify_ledger

from .conftest import Location, attacker, fill, move_head, open_ledger, open_reader

SIZE = 20


@pytest.fixture
def ledger_path(ledger_backend: Location) -> Location:
    """Every test here runs on each backend: the ledger is a SQLite file or a PostgreSQL database."""
    return ledger_backend


@pytest.fixture
async def built(ledger_path: Path, key: Ed25519PrivateKey) -> Checkpoint:
    """A closed ledger of 20 records with stored checkpoints at 10 and 20; returns the one at 20."""
    ledger = await open_ledger(ledger_path)
    await fill(ledger, 10)
    await ledger.checkpoint(key, "log", "example.com/karma")
    await fill(ledger, SIZE - 10, start=10)
    note = await ledger.checkpoint(key, "log", "example.com/karma")
    await ledger.aclose()
    return verify_checkpoint(note, key.public_key(), "log")


def verify(path: Path, checkpoint: Checkpoint | None = None, **options: bool):  # type: ignore[no-untyped-def]
    with open_reader(path) as reader:
        return verify_ledger(reader, checkpoint, **options)


def body_of(conn: sqlite3.Connection, seq: int) -> bytes:
    return bytes(conn.execute("SELECT body FROM records WHERE seq = ?", (seq,)).fetchone()[0])


def rechain(conn: sqlite3.Connection, start: int, edit: Callable[[bytes], bytes] = lambda e: e,
            first_prev: str | None = None) -> None:
    """Rewrite records start.. so that the chain is self-consistent again (a careful forger)."""
    if first_prev is not None:
        prev = first_prev
    elif start == 1:
        prev = GENESIS_PREV
    else:
        prev = bytes(conn.execute("SELECT hash FROM records WHERE seq = ?", (start - 1,)).fetchone()[0]).hex()
    rows = conn.execute("SELECT seq, body FROM records WHERE seq >= ? ORDER BY seq", (start,)).fetchall()
    for seq, body in rows:
        entry = parse_record(bytes(body)).entry
        new = record_bytes(edit(entry) if seq == start else entry, prev, seq)
        digest = leaf_hash(new)
        conn.execute("UPDATE records SET body = ?, hash = ? WHERE seq = ?", (new, digest, seq))
        prev = digest.hex()
    move_head(conn)


async def test_an_intact_ledger_verifies(built: Checkpoint, ledger_path: Path) -> None:
    report = verify(ledger_path, built)
    assert report.ok and report.problem == "" and report.first_bad_seq is None
    assert (report.size, report.root, report.checkpoints_checked) == (SIZE, built.root, 3)


async def test_an_empty_ledger_verifies(ledger_path: Path) -> None:
    await (await open_ledger(ledger_path)).aclose()
    report = verify(ledger_path, Checkpoint("o", 0, EMPTY_ROOT))
    assert report.ok and report.size == 0 and report.root == EMPTY_ROOT
    bad = verify(ledger_path, Checkpoint("o", 0, b"\x01" * 32))
    assert not bad.ok and "fork" in bad.problem


async def test_an_edited_record_is_named(built: Checkpoint, ledger_path: Path) -> None:
    conn = attacker(ledger_path)
    conn.execute("UPDATE records SET body = ? WHERE seq = 7", (body_of(conn, 7).replace(b"req-6", b"req-X"),))
    report = verify(ledger_path, built)
    assert (report.ok, report.first_bad_seq, report.size) == (False, 7, 6)
    assert report.problem == "record 7 was modified: its bytes (column body) do not hash to its stored hash (column hash)"


async def test_an_edited_record_with_a_rewritten_hash_is_named(built: Checkpoint, ledger_path: Path) -> None:
    conn = attacker(ledger_path)
    body = body_of(conn, 7).replace(b'"decision":"allow"', b'"decision":"deny"')
    conn.execute("UPDATE records SET body = ?, hash = ? WHERE seq = 7", (body, leaf_hash(body)))
    report = verify(ledger_path, stored_checkpoints=False)
    assert (report.ok, report.first_bad_seq) == (False, 7)
    assert report.problem.startswith("record 8 does not link to record 7")


async def test_a_deleted_record_is_named(built: Checkpoint, ledger_path: Path) -> None:
    attacker(ledger_path).execute("DELETE FROM records WHERE seq = 7")
    report = verify(ledger_path, built)
    assert (report.ok, report.first_bad_seq) == (False, 7)
    assert report.problem == "record 7 is missing (the next stored record is 8): a row was deleted or its column seq changed"


async def test_a_deleted_first_record_is_named(built: Checkpoint, ledger_path: Path) -> None:
    attacker(ledger_path).execute("DELETE FROM records WHERE seq = 1")
    report = verify(ledger_path, built)
    assert (report.first_bad_seq, report.size) == (1, 0)


async def test_swapped_records_are_named(built: Checkpoint, ledger_path: Path) -> None:
    conn = attacker(ledger_path)
    rows = {seq: (h, b) for seq, h, b in conn.execute("SELECT seq, hash, body FROM records WHERE seq IN (7, 8)")}
    conn.execute("UPDATE records SET hash = ?, body = ? WHERE seq = 7", rows[8])
    conn.execute("UPDATE records SET hash = ?, body = ? WHERE seq = 8", rows[7])
    report = verify(ledger_path, built)
    assert (report.ok, report.first_bad_seq) == (False, 7)
    assert "record 7 holds the record written as seq 8" in report.problem


async def test_a_deletion_hidden_by_renumbering_is_named(built: Checkpoint, ledger_path: Path) -> None:
    conn = attacker(ledger_path)
    conn.execute("DELETE FROM records WHERE seq = 7")
    for seq in range(8, SIZE + 1):
        conn.execute("UPDATE records SET seq = ? WHERE seq = ?", (seq - 1, seq))
    report = verify(ledger_path, built)
    assert (report.ok, report.first_bad_seq) == (False, 7)
    assert "record 7 holds the record written as seq 8" in report.problem


async def test_truncation_is_caught_only_against_a_checkpoint(built: Checkpoint, ledger_path: Path) -> None:
    conn = attacker(ledger_path)
    conn.execute("DELETE FROM records WHERE seq > 17")
    assert verify(ledger_path, stored_checkpoints=False).first_bad_seq == 18  # their rule rows still name them
    conn.execute("DELETE FROM record_rules WHERE seq > 17")
    move_head(conn)
    assert verify(ledger_path, stored_checkpoints=False).ok  # a careful truncation is self-consistent
    report = verify(ledger_path, built, stored_checkpoints=False)
    assert (report.ok, report.first_bad_seq, report.size) == (False, 18, 17)
    assert report.problem == "ledger has 17 records but checkpoint at size 20 — truncated"
    stored = verify(ledger_path)
    assert stored.first_bad_seq == 18 and "stored checkpoint at size 20" in stored.problem


async def test_a_rewritten_history_is_caught_only_against_a_checkpoint(built: Checkpoint, ledger_path: Path) -> None:
    conn = attacker(ledger_path)
    rechain(conn, 12, lambda entry: entry.replace(b'"enforced":true', b'"enforced":false'))
    assert verify(ledger_path, stored_checkpoints=False).ok
    report = verify(ledger_path, built, stored_checkpoints=False)
    assert (report.ok, report.first_bad_seq) == (False, None)
    assert report.problem == (
        "records 1..20 do not match the checkpoint at size 20: history was rewritten (a fork), "
        "somewhere in records 1..20"
    )
    narrowed = verify(ledger_path, built)
    assert narrowed.checkpoints_checked == 1 and "somewhere in records 11..20" in narrowed.problem


async def test_a_chain_that_does_not_start_at_zero_is_named(built: Checkpoint, ledger_path: Path) -> None:
    rechain(attacker(ledger_path), 1, first_prev="11" * 32)
    report = verify(ledger_path, stored_checkpoints=False)
    assert (report.first_bad_seq, report.problem) == (1, "record 1 does not start the chain (its prev is not 64 zeros)")


async def test_a_malformed_record_is_named(built: Checkpoint, ledger_path: Path) -> None:
    conn = attacker(ledger_path)
    conn.execute("UPDATE records SET body = ?, hash = ? WHERE seq = 3", (b"garbage", leaf_hash(b"garbage")))
    report = verify(ledger_path)
    assert report.first_bad_seq == 3 and report.problem.startswith("record 3 is malformed")


async def test_a_hash_stored_as_text_is_named(built: Checkpoint, ledger_path: Path) -> None:
    if not isinstance(ledger_path, Path):
        pytest.skip("SQLite-specific: a PostgreSQL bytea column cannot hold text")
    conn = attacker(ledger_path)
    conn.execute("UPDATE records SET hash = hex(hash) WHERE seq = 4")
    assert verify(ledger_path).first_bad_seq == 4


async def test_strict_mode_catches_a_non_canonical_entry(built: Checkpoint, ledger_path: Path) -> None:
    rechain(attacker(ledger_path), 5, lambda entry: entry.replace(b'"backend":"demo"', b'"backend" : "demo"'))
    assert verify(ledger_path, stored_checkpoints=False).ok
    report = verify(ledger_path, stored_checkpoints=False, strict=True)
    assert report.first_bad_seq == 5 and "not in canonical (RFC 8785) form" in report.problem


async def test_an_entry_sqlite_cannot_read_is_named_by_the_index_check(built: Checkpoint, ledger_path: Path) -> None:
    rechain(attacker(ledger_path), 5, lambda entry: b"{not json}")
    assert verify(ledger_path, stored_checkpoints=False, indexes=False).ok  # hashes and links are all fine
    report = verify(ledger_path, stored_checkpoints=False)
    assert (report.ok, report.first_bad_seq, report.size) == (False, 5, SIZE)
    assert report.problem == "record 5 holds no JSON entry object, so its indexed columns cannot be checked"


async def test_a_body_stored_as_text_is_named(built: Checkpoint, ledger_path: Path) -> None:
    if not isinstance(ledger_path, Path):
        pytest.skip("SQLite-specific: a PostgreSQL bytea column cannot hold text")
    conn = attacker(ledger_path)
    conn.execute("UPDATE records SET body = CAST(body AS TEXT), principal = 'nobody' WHERE seq = 6")
    report = verify(ledger_path)
    assert (report.ok, report.first_bad_seq) == (False, 6)
    assert report.problem == "record 6 is not stored as bytes (column body)"
