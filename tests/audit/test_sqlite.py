"""SqliteLedger and SqliteLedgerReader on real files: group commit, recovery, locking, refusals."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.canon import canonical_bytes
from audit.checkpoint import verify_checkpoint
from audit.errors import LedgerError, LedgerLocked, NotALedger
from audit.merkle import EMPTY_ROOT, leaf_hash, root_hash, verify_inclusion, verify_consistency
from audit.records import GENESIS_PREV, parse_record
from audit.sqlite import SqliteLedger, SqliteLedgerReader

from .conftest import Location, attacker, fill, make_entry, open_ledger, open_reader




async def test_appends_get_contiguous_seqs_and_chained_hashes(backend_ledger: Any, ledger_backend: Location) -> None:
    ledger, ledger_path = backend_ledger, ledger_backend
    results = await asyncio.gather(*(ledger.append(make_entry(i)) for i in range(300)))
    assert sorted(r.seq for r in results) == list(range(1, 301))
    assert ledger.size == 300
    with open_reader(ledger_path) as reader:
        rows = list(reader.iter_records())
        prev = GENESIS_PREV
        for seq, digest, body in rows:
            parsed = parse_record(body)
            assert (parsed.seq, parsed.prev) == (seq, prev)
            assert body == canonical_bytes({"entry": __import__("json").loads(parsed.entry), "prev": prev, "seq": seq})
            assert digest == leaf_hash(body) == hashlib.sha256(b"\x00" + body).digest()
            prev = digest.hex()
        assert ledger.head_hash == prev
        assert ledger.root() == root_hash([d for _, d, _ in rows])
        by_seq = {r.seq: r.hash for r in results}
        assert all(by_seq[seq] == digest.hex() for seq, digest, _ in rows)


async def test_the_answer_matches_what_was_stored(backend_ledger: Any, ledger_backend: Location) -> None:
    ledger, ledger_path = backend_ledger, ledger_backend
    appended = await ledger.append(make_entry(1))
    with open_reader(ledger_path) as reader:
        stored = reader.get(appended.seq)
        assert stored is not None and stored.hash == appended.hash
        assert stored.to_dict()["request_id"] == "req-1"
        assert reader.get(99) is None


async def test_empty_ledger_head(backend_ledger: Any) -> None:
    ledger = backend_ledger
    assert (ledger.size, ledger.head_hash, ledger.root()) == (0, GENESIS_PREV, EMPTY_ROOT)


async def test_schema_meta_indexes_and_triggers(ledger: SqliteLedger, ledger_path: Path, key: Ed25519PrivateKey) -> None:
    await fill(ledger, 3)
    await ledger.checkpoint(key, "log", "o")
    conn = sqlite3.connect(ledger_path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() == ("dharma-ledger/1",)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
    assert {"records_principal_time", "records_tool_time", "records_time", "record_rules_rule"} <= names
    assert "records_index_rules" not in names  # the writer fills the rule index (tests/audit/test_rule_index.py)
    for table in ("records", "record_rules", "checkpoints", "meta"):
        with pytest.raises(sqlite3.IntegrityError, match="karma ledger is append-only"):
            conn.execute(f"DELETE FROM {table}")
        with pytest.raises(sqlite3.IntegrityError, match="karma ledger is append-only"):
            conn.execute(f"UPDATE {table} SET rowid = rowid")
    conn.close()


async def test_reopen_rebuilds_the_head(ledger_path: Path, key: Ed25519PrivateKey) -> None:
    first = await SqliteLedger.open(ledger_path)
    await fill(first, 37)
    size, head, root = first.size, first.head_hash, first.root()
    await first.checkpoint(key, "log", "example.com/karma")
    await first.aclose()
    again = await SqliteLedger.open(ledger_path, synchronous="NORMAL")
    assert (again.size, again.head_hash, again.root()) == (size, head, root)
    appended = await again.append(make_entry(37))
    assert appended.seq == 38
    await again.aclose()


async def test_a_bad_entry_fails_only_its_caller(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path, batch_wait_ms=50)
    outcomes = await asyncio.gather(
        ledger.append(make_entry(0)),
        ledger.append({"x": float("nan")}),
        ledger.append(make_entry(1)),
        return_exceptions=True,
    )
    assert isinstance(outcomes[1], LedgerError) and str(ledger_path) in str(outcomes[1])
    assert [o.seq for o in (outcomes[0], outcomes[2])] == [1, 2]  # type: ignore[union-attr]
    await ledger.aclose()


async def test_a_failed_commit_fails_the_whole_batch_and_keeps_the_head(ledger_path: Path, ledger_logs: list[dict[str, Any]]) -> None:
    ledger = await SqliteLedger.open(ledger_path, batch_wait_ms=100)
    await fill(ledger, 2)
    before = (ledger.size, ledger.head_hash, ledger.root())
    saboteur = sqlite3.connect(ledger_path, isolation_level=None)
    saboteur.execute(
        "CREATE TRIGGER sabotage BEFORE INSERT ON records WHEN NEW.principal = 'boom' "
        "BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
    )
    outcomes = await asyncio.gather(
        ledger.append(make_entry(5)),
        ledger.append({**make_entry(6), "principal": "boom"}),
        ledger.append(make_entry(7)),
        return_exceptions=True,
    )
    assert all(isinstance(o, LedgerError) for o in outcomes), outcomes
    assert "records 3..5 were not committed" in str(outcomes[0]) and "disk on fire" in str(outcomes[0])
    assert any(e["event"] == "ledger.batch_failed" for e in ledger_logs)
    assert (ledger.size, ledger.head_hash, ledger.root()) == before
    assert saboteur.execute("SELECT count(*) FROM records").fetchone() == (2,)
    saboteur.execute("DROP TRIGGER sabotage")
    saboteur.close()
    again = await ledger.append(make_entry(8))
    assert again.seq == 3
    await ledger.aclose()
    from audit.verify import verify_ledger

    with SqliteLedgerReader(ledger_path) as reader:
        assert verify_ledger(reader).ok


async def test_group_commit_batches_concurrent_appends(ledger_path: Path, ledger_logs: list[dict[str, Any]]) -> None:
    ledger = await SqliteLedger.open(ledger_path, batch_max=64, batch_wait_ms=20)
    await fill(ledger, 200)
    batches = [e for e in ledger_logs if e["event"] == "ledger.batch_committed"]
    assert sum(e["count"] for e in batches) == 200
    assert max(e["count"] for e in batches) == 64
    assert len(batches) <= 8
    await ledger.aclose()


async def test_aclose_commits_what_was_queued_and_then_refuses(ledger_backend: Location) -> None:
    ledger_path = ledger_backend
    ledger = await open_ledger(ledger_path)
    tasks = [asyncio.create_task(ledger.append(make_entry(i))) for i in range(50)]
    await asyncio.sleep(0)
    await ledger.aclose()
    done = await asyncio.gather(*tasks)
    assert sorted(r.seq for r in done) == list(range(1, 51))
    with pytest.raises(LedgerError, match="closed"):
        await ledger.append(make_entry(0))
    await ledger.aclose()
    with open_reader(ledger_path) as reader:
        assert reader.size() == 50


async def test_checkpoint_is_signed_stored_and_provable(backend_ledger: Any, ledger_backend: Location, key: Ed25519PrivateKey) -> None:
    ledger, ledger_path = backend_ledger, ledger_backend
    await fill(ledger, 10)
    note10 = await ledger.checkpoint(key, "log", "example.com/karma")
    await fill(ledger, 7, start=10)
    note17 = await ledger.checkpoint(key, "log", "example.com/karma")
    cp10 = verify_checkpoint(note10, key.public_key(), "log")
    cp17 = verify_checkpoint(note17, key.public_key(), "log")
    assert (cp17.size, cp17.root) == (17, ledger.root())
    with open_reader(ledger_path) as reader:
        assert reader.latest_checkpoint() == note17
        assert reader.checkpoints() == [(10, note10), (17, note17)]
        assert verify_consistency(10, 17, cp10.root, cp17.root, reader.consistency_proof(10, 17))
        record = reader.get(4)
        assert record is not None
        proof = reader.inclusion_proof(4, 17)
        assert verify_inclusion(3, 17, bytes.fromhex(record.hash), proof, cp17.root)
    assert await ledger.checkpoint(key, "log", "example.com/karma") == note17
    with pytest.raises(LedgerError, match="key name"):
        await ledger.checkpoint(key, "bad name", "example.com/karma")


async def test_a_second_writer_in_the_same_process_is_locked_out(ledger: SqliteLedger, ledger_path: Path) -> None:
    with pytest.raises(LedgerLocked) as info:
        await SqliteLedger.open(ledger_path)
    assert str(ledger_path) in str(info.value) and "another gateway" in str(info.value)
    assert f"pid {os.getpid()}" in str(info.value)


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import structlog
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    from audit.sqlite import SqliteLedger
    from audit.errors import LedgerLocked

    async def main(path, mode):
        if mode == "try":
            try:
                ledger = await SqliteLedger.open(path)
            except LedgerLocked as exc:
                print("LOCKED", exc, flush=True)
                return
            print("OPENED", flush=True)
            await ledger.aclose()
            return
        ledger = await SqliteLedger.open(path)
        await ledger.append({"from": "child"})
        print("READY", flush=True)
        sys.stdin.readline()
        await ledger.aclose()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def _child(path: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


async def test_another_process_holding_the_ledger_locks_us_out(ledger_path: Path) -> None:
    child = _child(ledger_path, "hold")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        with pytest.raises(LedgerLocked, match=f"pid {child.pid}"):
            await SqliteLedger.open(ledger_path)
        with SqliteLedgerReader(ledger_path) as reader:
            assert reader.size() == 1
    finally:
        child.communicate("\n", timeout=30)
    assert child.returncode == 0
    ledger = await SqliteLedger.open(ledger_path)
    assert ledger.size == 1
    await ledger.aclose()


async def test_we_lock_out_another_process(ledger: SqliteLedger, ledger_path: Path) -> None:
    out, _ = _child(ledger_path, "try").communicate(timeout=30)
    assert out.startswith("LOCKED ") and str(ledger_path) in out and "another gateway" in out


async def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"my precious notes\n" * 100)
    with pytest.raises(NotALedger, match=r"notes.txt is not a Dharma karma ledger \(not an SQLite database\)"):
        await SqliteLedger.open(path)
    with pytest.raises(NotALedger):
        SqliteLedgerReader(path)
    assert path.read_bytes() == b"my precious notes\n" * 100


async def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users(name TEXT)")
    conn.execute("INSERT INTO users VALUES ('ann')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(NotALedger, match="without our meta table"):
        await SqliteLedger.open(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


async def test_a_sqlite_database_with_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('format', 'dharma-ledger/9')")
    conn.commit()
    conn.close()
    with pytest.raises(NotALedger, match="format 'dharma-ledger/9'"):
        await SqliteLedger.open(path)


async def test_an_empty_file_becomes_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    ledger = await SqliteLedger.open(path)
    assert (await ledger.append({"a": 1})).seq == 1
    await ledger.aclose()


async def test_unusable_paths_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="is a directory"):
        await SqliteLedger.open(tmp_path)
    with pytest.raises(LedgerError, match="does not exist"):
        await SqliteLedger.open(tmp_path / "missing" / "karma.db")
    with pytest.raises(LedgerError, match="no karma ledger here"):
        SqliteLedgerReader(tmp_path / "absent.db")
    with pytest.raises(LedgerError, match="synchronous"):
        await SqliteLedger.open(tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of their mode")
async def test_an_unreadable_file_raises_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(LedgerError, match="cannot be read"):
        await SqliteLedger.open(path)


async def test_a_damaged_ledger_is_not_opened_for_writing(ledger_path: Path, key: Ed25519PrivateKey) -> None:
    ledger = await SqliteLedger.open(ledger_path)
    await fill(ledger, 5)
    await ledger.checkpoint(key, "log", "o")
    await ledger.aclose()
    conn = attacker(ledger_path)
    conn.execute("DELETE FROM records WHERE seq = 5")
    conn.close()
    with pytest.raises(LedgerError, match="truncated"):
        await SqliteLedger.open(ledger_path)
    conn = attacker(ledger_path)
    conn.execute("DELETE FROM records WHERE seq = 2")
    conn.close()
    with pytest.raises(LedgerError, match="record 2 is missing or damaged"):
        await SqliteLedger.open(ledger_path)
    # the lock was released on the way out
    with pytest.raises(LedgerError, match="record 2"):
        await SqliteLedger.open(ledger_path)


async def test_reader_works_after_the_writer_is_gone(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path)
    await fill(ledger, 4)
    await ledger.aclose()
    assert not Path(f"{ledger_path}-wal").exists()
    with SqliteLedgerReader(ledger_path) as reader:
        assert reader.size() == 4
        assert [seq for seq, _, _ in reader.iter_records(start=3)] == [3, 4]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader._conn.execute("INSERT INTO meta VALUES ('x', 'y')")  # noqa: SLF001


async def test_a_batch_larger_than_one_insert_statement_is_still_one_transaction(ledger_path: Path, ledger_logs: list[dict[str, Any]]) -> None:
    ledger = await SqliteLedger.open(ledger_path, batch_max=3000, batch_wait_ms=200)
    await fill(ledger, 2500)
    assert max(e["count"] for e in ledger_logs if e["event"] == "ledger.batch_committed") > 1000
    await ledger.aclose()
    from audit.verify import verify_ledger

    with SqliteLedgerReader(ledger_path) as reader:
        report = verify_ledger(reader)
        assert report.ok and report.size == 2500


async def test_a_cancelled_caller_does_not_disturb_the_writer(backend_ledger: Any) -> None:
    ledger = backend_ledger
    task = asyncio.create_task(ledger.append(make_entry(0)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await ledger.append(make_entry(1))).seq == 2
    with pytest.raises(LedgerError, match="must be a JSON object"):
        await ledger.append(["not", "an", "object"])  # type: ignore[arg-type]
    assert ledger.size == 2


async def test_a_corrupt_sqlite_file_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 2000)
    with pytest.raises(NotALedger, match="broken.db is not a Dharma karma ledger"):
        await SqliteLedger.open(path)


async def test_the_lazily_computed_root_is_right_for_checkpoints_and_verify(ledger_backend: Location, key: Ed25519PrivateKey) -> None:
    """The writers no longer compute the Merkle root on each commit, only when a checkpoint or a head
    read needs it: after many commits of every batch size (crossing a stored-subtree boundary at 256),
    each checkpoint, `root()` and `verify_ledger` still agree with the root recomputed from the leaves."""
    from audit.checkpoint import CheckpointSigner
    from audit.verify import verify_ledger

    signer = CheckpointSigner(key, "log", "example.com/karma")
    ledger = await open_ledger(ledger_backend, checkpoint_signer=signer, checkpoint_interval=3600)
    notes: list[str] = []
    n = 0
    for round_ in range(12):
        for _ in range(round_ * 3 + 1):  # one record per commit
            await ledger.append(make_entry(n))
            n += 1
        await fill(ledger, round_ * 5, start=n)  # a concurrent burst: batches of several records
        n += round_ * 5
        if round_ % 3 == 1:
            notes.append(await ledger.checkpoint(key, "log", "example.com/karma"))
    assert ledger.size == n > 256
    with open_reader(ledger_backend) as reader:
        leaves = [d for _, d, _ in reader.iter_records()]
    assert ledger.root() == root_hash(leaves)
    for note in notes:
        cp = verify_checkpoint(note, key.public_key(), "log")
        assert cp.root == root_hash(leaves[: cp.size])
    await ledger.aclose()  # signs the final checkpoint on close
    with open_reader(ledger_backend) as reader:
        final = verify_checkpoint(reader.latest_checkpoint(), key.public_key(), "log")
        assert (final.size, final.root) == (n, root_hash(leaves))
        report = verify_ledger(reader, final)
    assert report.ok and report.size == n and report.root == root_hash(leaves)
    again = await open_ledger(ledger_backend)  # reopened: the head rebuilt from the file agrees
    try:
        assert (again.size, again.root()) == (n, root_hash(leaves))
        await again.append(make_entry(n))
        with open_reader(ledger_backend) as reader:
            assert again.root() == root_hash([d for _, d, _ in reader.iter_records()])
    finally:
        await again.aclose()


async def test_a_one_statement_batch_that_fails_leaves_nothing_and_no_open_transaction(ledger_path: Path) -> None:
    """Most batches are one INSERT run as its own (autocommit) transaction, without BEGIN/COMMIT:
    when it fails (a full disk) nothing of it is stored, the head stays, no transaction is left open,
    and the next append lands at the next seq once there is space again."""
    ledger = await SqliteLedger.open(ledger_path)
    try:
        await fill(ledger, 3)
        head = (ledger.size, ledger.head_hash, ledger.root())
        ledger.limit_pages(1)  # the file may not grow: the disk is "full"
        big = {**make_entry(99), "blob": os.urandom(60_000).hex()}
        for _ in range(2):
            with pytest.raises(LedgerError, match="were not committed"):
                await ledger.append(big)
        assert (ledger.size, ledger.head_hash, ledger.root()) == head
        with sqlite3.connect(ledger_path) as raw:
            assert raw.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 3
        ledger.limit_pages(None)
        appended = await ledger.append(big)
        assert appended.seq == 4
    finally:
        await ledger.aclose()
    with open_reader(ledger_path) as reader:
        from audit.verify import verify_ledger

        assert reader.size() == 4 and verify_ledger(reader).ok
