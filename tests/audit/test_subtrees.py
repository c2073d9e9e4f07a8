"""Stored subtree hashes (the `subtrees` table, heights 8, 16, …) on each backend: writers store
them with the records, `audit verify` recomputes them and names a bad row, proofs read O(log n)
of them and stay correct when one is edited, deleted, or when the ledger has none (an older file).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from audit import proofs
from audit.checkpoint import CheckpointSigner, verify_checkpoint_jwks
from audit.merkle import consistency_proof, inclusion_proof, root_hash, verify_inclusion
from audit.postgres import grant_roles, migrate_ledger
from audit.verify import verify_ledger
from gateway.cli.main import main as dharma_main
from gateway.crypto.receipts import KeyStore

from .conftest import BACKENDS, Location, attacker, fill, new_location, open_ledger, open_reader

SIZE = 600  # two complete subtrees of height 8 (records 1..256 and 257..512), and a tail
ORIGIN = "example.com/karma"


@pytest.fixture(params=BACKENDS)
async def ledger_at(request: pytest.FixtureRequest, tmp_path: Path, state_root: Path) -> Location:
    """A closed ledger of SIZE records appended in several batches, its checkpoint signed at SIZE."""
    location = new_location(request.param, request, tmp_path)
    keys = KeyStore.open(state_root, create=True)
    ledger = await open_ledger(location, batch_max=100)
    for start in range(0, SIZE, 150):
        await fill(ledger, 150, start=start)
    await ledger.checkpoint(keys.checkpoint_key, keys.checkpoint_key_name, ORIGIN)
    await ledger.aclose()
    return location


def signer(state_root: Path) -> CheckpointSigner:
    keys = KeyStore.open(state_root, create=False)
    return CheckpointSigner(keys.checkpoint_key, keys.checkpoint_key_name, ORIGIN)


def cli(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    capsys.readouterr()
    code = dharma_main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out + captured.err


def leaves_of(location: Location) -> list[bytes]:
    with open_reader(location) as reader:
        return reader.leaf_hashes()


class CountingReader:
    """The real reader, counting the hashes proofs read through it."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.hashes_read = 0

    def leaf_range(self, lo: int, hi: int) -> list[bytes]:
        found = self.reader.leaf_range(lo, hi)
        self.hashes_read += len(found)
        return found

    def subtree_hashes(self, height: int, lo: int, hi: int) -> list[bytes]:
        found = self.reader.subtree_hashes(height, lo, hi)
        self.hashes_read += len(found)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def test_writers_store_every_complete_subtree(ledger_at: Location) -> None:
    leaves = leaves_of(ledger_at)
    with open_reader(ledger_at) as reader:
        assert list(reader.subtrees()) == [(8, 0, root_hash(leaves[:256])), (8, 1, root_hash(leaves[256:512]))]
        assert reader.keeps_subtrees()
        assert verify_ledger(reader).ok


def test_proofs_read_few_hashes_and_match_the_rfc_proofs(ledger_at: Location, state_root: Path) -> None:
    leaves = leaves_of(ledger_at)
    with open_reader(ledger_at) as reader:
        counting = CountingReader(reader)
        doc = proofs.inclusion(counting, 300, SIZE, signer(state_root))
        assert [bytes.fromhex(h) for h in doc["proof"]] == inclusion_proof(leaves, 299, SIZE)
        assert doc["root"] == root_hash(leaves).hex() and "warning" not in doc
        # the leaves beside record 300 inside its 256-record subtree, the stored hash of the other one
        # and the tail's leaves: fewer than the records (a proof from leaf hashes alone reads them all)
        assert counting.hashes_read < SIZE * 2 // 3, counting.hashes_read
        doc = proofs.consistency(reader, 100, SIZE, signer(state_root))
        assert [bytes.fromhex(h) for h in doc["proof"]] == consistency_proof(leaves, 100, SIZE)
        assert doc["old_root"] == root_hash(leaves[:100]).hex()


def test_an_edited_subtree_row_fails_verify_and_never_yields_a_wrong_proof(
    ledger_at: Location, state_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    leaves = leaves_of(ledger_at)
    conn = attacker(ledger_at)
    conn.execute("UPDATE subtrees SET hash = ? WHERE height = 8 AND idx = 1", (b"\x07" * 32,))
    conn.close()
    code, out = cli(capsys, "audit", "verify", "--ledger", ledger_at)
    assert code == 1 and out.startswith("FAIL"), out
    assert "stored subtree hash at height 8, index 1 (records 257..512) does not match" in out, out

    code, out = cli(capsys, "audit", "proof", "--ledger", ledger_at, "--inclusion", "300")
    assert code == 0, out
    doc, _ = json.JSONDecoder().raw_decode(out)  # the tamper is also logged, maybe to the same stream
    anchor = verify_checkpoint_jwks(doc["checkpoint"], KeyStore.open(state_root, create=False).jwks())
    assert verify_inclusion(299, SIZE, leaves[299], [bytes.fromhex(h) for h in doc["proof"]], anchor.root)
    assert [bytes.fromhex(h) for h in doc["proof"]] == inclusion_proof(leaves, 299, SIZE)
    assert "stored subtree hashes do not match" in doc["warning"]
    with open_reader(ledger_at) as reader:  # the edited row is in this proof; no checkpoint vouches for the root
        doc = proofs.consistency(reader, 256, SIZE)
        assert [bytes.fromhex(h) for h in doc["proof"]] == consistency_proof(leaves, 256, SIZE)
        assert "stored subtree hashes do not match" in doc["warning"]


def test_a_deleted_or_added_subtree_row_fails_verify_naming_it(ledger_at: Location, state_root: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    leaves = leaves_of(ledger_at)
    conn = attacker(ledger_at)
    conn.execute("DELETE FROM subtrees WHERE height = 8 AND idx = 0")
    conn.close()
    code, out = cli(capsys, "audit", "verify", "--ledger", ledger_at)
    assert code == 1 and "stored subtree hash at height 8, index 0 (records 1..256) is missing" in out, out
    with open_reader(ledger_at) as reader:
        doc = proofs.inclusion(reader, 3, SIZE, signer(state_root))
        assert [bytes.fromhex(h) for h in doc["proof"]] == inclusion_proof(leaves, 2, SIZE)
    conn = attacker(ledger_at)
    conn.execute("INSERT INTO subtrees(height, idx, hash) VALUES (8, 0, ?), (8, 2, ?)", (root_hash(leaves[:256]), b"\x01" * 32))
    conn.close()
    code, out = cli(capsys, "audit", "verify", "--ledger", ledger_at)
    assert code == 1 and "height 8, index 2 (records 513..768) names records the ledger does not hold" in out, out


async def test_a_ledger_without_subtrees_proves_and_verifies_and_gets_them_from_its_writer(
    ledger_at: Location, state_root: Path
) -> None:
    """A ledger written before subtree hashes were stored (no table, no meta row): proofs fall back to
    the record hashes, verify passes, and the next writer to open it stores them."""
    leaves = leaves_of(ledger_at)
    conn = attacker(ledger_at)
    conn.execute("DELETE FROM meta WHERE key = 'subtrees'")
    conn.execute("DROP TABLE subtrees")
    conn.close()
    with open_reader(ledger_at) as reader:
        assert list(reader.subtrees()) == [] and not reader.keeps_subtrees()
        assert verify_ledger(reader).ok
        doc = proofs.inclusion(reader, 300, SIZE, signer(state_root))
        assert [bytes.fromhex(h) for h in doc["proof"]] == inclusion_proof(leaves, 299, SIZE) and "warning" not in doc
        assert reader.inclusion_proof(300) == inclusion_proof(leaves, 299, SIZE)
    writer = await open_ledger(ledger_at)
    await fill(writer, 1, start=SIZE)
    await writer.aclose()
    with open_reader(ledger_at) as reader:
        assert reader.keeps_subtrees()
        assert [(h, i) for h, i, _ in reader.subtrees()] == [(8, 0), (8, 1)]
        assert verify_ledger(reader).ok


def test_the_subtrees_table_is_insert_only(ledger_at: Location) -> None:
    """The writers' own schema refuses to change or remove a stored subtree hash, as for the records."""
    if str(ledger_at).startswith("postgresql://"):
        with psycopg.connect(str(ledger_at), autocommit=True) as conn:
            for statement in ("UPDATE subtrees SET hash = hash", "DELETE FROM subtrees", "TRUNCATE subtrees"):
                with pytest.raises(psycopg.Error, match="append-only"):
                    conn.execute(statement)
        return
    conn = sqlite3.connect(ledger_at)
    try:
        for statement in ("UPDATE subtrees SET hash = hash", "DELETE FROM subtrees"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                conn.execute(statement)
    finally:
        conn.close()


async def test_migrate_copies_the_subtree_hashes(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """`audit migrate` gives the PostgreSQL copy the subtree hashes the SQLite ledger stores."""
    source = tmp_path / "karma.db"
    ledger = await open_ledger(source)
    await fill(ledger, 300)
    await ledger.aclose()
    url = new_location("postgres", request, tmp_path)
    with open_reader(source) as reader:
        migrate_ledger(reader, str(source), str(url))
        wanted = list(reader.subtrees())
    with open_reader(url) as copied:
        assert [tuple(row) for row in copied.subtrees()] == wanted and len(wanted) == 1
        assert copied.keeps_subtrees() and verify_ledger(copied).ok


async def test_an_older_granted_ledger_keeps_working_and_grant_completes_it(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A PostgreSQL ledger granted before subtree hashes existed: its writer role may not create the
    table, so it logs that and keeps appending (no subtree rows); the owner's `grant_roles` then
    stores them, and the ledger verifies."""
    url = str(new_location("postgres", request, tmp_path))
    ledger = await open_ledger(url)
    await fill(ledger, 300)
    await ledger.aclose()
    conn = attacker(url)
    conn.execute("DELETE FROM meta WHERE key = 'subtrees'")
    conn.execute("DROP TABLE subtrees")
    conn.close()
    writer = f"w_{url.rsplit('/', 1)[1]}"
    with psycopg.connect(url, autocommit=True) as owner:
        owner.execute(f"CREATE ROLE {writer} LOGIN")
        for table, privileges in {"meta": "SELECT", "head": "SELECT, UPDATE", "records": "SELECT, INSERT",
                                  "record_rules": "SELECT, INSERT", "checkpoints": "SELECT, INSERT"}.items():
            owner.execute(f"GRANT {privileges} ON TABLE {table} TO {writer}")  # what an older grant gave
        owner.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {writer}")
    as_writer = url.replace("dharma@", f"{writer}@", 1)
    ledger = await open_ledger(as_writer)
    await fill(ledger, 10, start=300)
    await ledger.aclose()
    with open_reader(url) as reader:
        assert reader.size() == 310 and not reader.keeps_subtrees() and verify_ledger(reader).ok
    grant_roles(url, writer=writer, readers=[])
    with open_reader(url) as reader:
        assert reader.keeps_subtrees() and [(h, i) for h, i, _ in reader.subtrees()] == [(8, 0)]
        assert verify_ledger(reader).ok
