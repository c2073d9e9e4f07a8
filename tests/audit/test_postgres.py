"""The PostgreSQL karma ledger on a real server: several writers, append-only, refusals, outages."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import read_stamp, verify_checkpoint
from audit.errors import LedgerError, NotALedger
from audit.merkle import CompactRange
from audit.postgres import PostgresLedger, PostgresLedgerReader, display_url
from audit.query import query_records
from audit.records import index_fields
from audit.sqlite import SqliteLedger, SqliteLedgerReader
from audit.verify import verify_ledger
from gateway.config import Settings
from gateway.runtime import open_ledger

from .conftest import PostgresServer, attacker, fill, make_entry


@pytest.fixture
def url(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    database = postgres.new_database()
    request.addfinalizer(lambda: postgres.drop_database(database))
    return database


def raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


async def test_two_writers_serialize_on_the_head_row(url: str, key: Ed25519PrivateKey) -> None:
    first, second = await PostgresLedger.open(url), await PostgresLedger.open(url)
    answers = await asyncio.gather(*(
        (first if i % 2 else second).append(make_entry(i)) for i in range(200)
    ))
    assert sorted(a.seq for a in answers) == list(range(1, 201))  # no gap, no duplicate
    note = await first.checkpoint(key, "log", "example.com/karma")  # covers the other writer's records too
    await first.aclose()
    await second.aclose()
    checkpoint = verify_checkpoint(note, key.public_key(), "log")
    with PostgresLedgerReader(url) as reader:
        report = verify_ledger(reader, checkpoint)
        assert (report.ok, report.size) == (True, 200)
        by_seq = {seq: digest.hex() for seq, digest, _ in reader.iter_records()}
        assert [size for size, _ in reader.checkpoints()] == [200]
    assert all(by_seq[a.seq] == a.hash for a in answers)


async def test_the_checkpoints_two_writers_store_link_up(url: str, key: Ed25519PrivateKey) -> None:
    """Each stored checkpoint's stamp names the one stored before it, whichever replica stored that one:
    both read it under the head row's lock. A size already stored is not stored twice."""
    first, second = await PostgresLedger.open(url), await PostgresLedger.open(url)
    notes = []
    for i, writer in enumerate((first, second, first, second)):
        await writer.append(make_entry(i))
        notes.append(await writer.checkpoint(key, "log", "example.com/karma"))
    assert await second.checkpoint(key, "log", "example.com/karma") == notes[-1]  # the stored note of that size
    await first.aclose()
    await second.aclose()
    stamps = [read_stamp(note) for note in notes]
    assert [s.prev for s in stamps if s is not None] == [None, 1, 2, 3]
    with PostgresLedgerReader(url) as reader:
        assert [note for _, note in reader.checkpoints()] == notes
        report = verify_ledger(reader, keys=[("log", key.public_key())])
    assert report.ok and report.reach is not None and (report.reach.size, report.reach.count) == (4, 4), report


async def test_a_writer_catches_up_with_records_another_wrote(url: str) -> None:
    first = await PostgresLedger.open(url)
    await fill(first, 5)
    second = await PostgresLedger.open(url)
    await fill(second, 7, start=5)
    appended = await first.append(make_entry(99))
    assert appended.seq == 13 and first.size == 13
    with PostgresLedgerReader(url) as reader:
        frontier = CompactRange()
        frontier.extend([digest for _, digest, _ in reader.iter_records()])
    assert first.root() == frontier.root()  # the frontier includes the other writer's records
    await first.aclose()
    await second.aclose()


async def test_derived_columns_and_rule_index_match_sqlite(url: str) -> None:
    ledger = await PostgresLedger.open(url)
    await ledger.append(make_entry(3))
    await ledger.append({"matched_rules": ["a", "a", "b", 7, None], "time": "2026-11-22T02:00:00+01:00"})
    await ledger.append({"matched_rules": "a"})
    await ledger.append({"matched_rules": {"x": "a"}})
    await ledger.append({"matched_rules": ("t2", "t1", "t2")})  # recorded as a JSON array, indexed as one
    await ledger.aclose()
    with raw(url) as conn:
        row = conn.execute("SELECT time, principal, tool, decision, status, request_id, policy_version "
                           "FROM records WHERE seq = 1").fetchone()
        assert row == tuple(getattr(index_fields(make_entry(3)), f) for f in
                            ("time", "principal", "tool", "decision", "status", "request_id", "policy_version"))
        assert conn.execute("SELECT time FROM records WHERE seq = 2").fetchone() == ("2026-11-22T01:00:00.000000Z",)
        rules = conn.execute("SELECT seq, rule_id FROM record_rules ORDER BY seq, rule_id").fetchall()
    assert rules == [(1, "rule-1"), (1, "rule-all"), (2, "a"), (2, "b"), (3, "a"), (5, "t1"), (5, "t2")]
    with PostgresLedgerReader(url) as reader:
        assert verify_ledger(reader).ok


async def test_update_delete_and_truncate_are_refused(url: str) -> None:
    ledger = await PostgresLedger.open(url)
    await fill(ledger, 3)
    await ledger.aclose()
    with raw(url) as conn:
        for sql in ("UPDATE records SET body = 'x' WHERE seq = 1", "DELETE FROM records WHERE seq = 3",
                    "TRUNCATE records", "DELETE FROM checkpoints", "UPDATE meta SET value = 'x'",
                    "DELETE FROM record_rules", "UPDATE head SET size = 1", "DELETE FROM head"):
            with pytest.raises(psycopg.Error, match="append-only|cannot move back"):
                conn.execute(sql)
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (3,)


async def test_reopen_rebuilds_the_head(url: str, key: Ed25519PrivateKey) -> None:
    ledger = await PostgresLedger.open(url)
    await fill(ledger, 9)
    await ledger.checkpoint(key, "log", "o")
    size, head, root = ledger.size, ledger.head_hash, ledger.root()
    await ledger.aclose()
    again = await PostgresLedger.open(url)
    assert (again.size, again.head_hash, again.root()) == (size, head, root)
    assert (await again.append(make_entry(9))).seq == 10
    await again.aclose()


async def test_a_damaged_ledger_is_not_opened_for_writing(url: str) -> None:
    ledger = await PostgresLedger.open(url)
    await fill(ledger, 4)
    await ledger.aclose()
    with raw(url) as conn:
        conn.execute("ALTER TABLE records DISABLE TRIGGER USER")
        conn.execute("DELETE FROM records WHERE seq = 4")
    with pytest.raises(LedgerError, match="head says 4 records but 3 are stored"):
        await PostgresLedger.open(url)


async def test_a_database_with_other_tables_is_refused_untouched(url: str) -> None:
    with raw(url) as conn:
        conn.execute("CREATE TABLE customers(id int)")
    with pytest.raises(NotALedger, match=r"ledger_\w+ is not a Dharma karma ledger \(it holds other tables: customers\)"):
        await PostgresLedger.open(url)
    with pytest.raises(NotALedger, match="customers"):
        PostgresLedgerReader(url)
    with raw(url) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        assert [t for (t,) in tables] == ["customers"]


async def test_a_meta_table_of_another_format_is_refused(url: str) -> None:
    with raw(url) as conn:
        conn.execute("CREATE TABLE meta(key text, value text)")
        conn.execute("INSERT INTO meta VALUES ('format', 'other/9')")
    with pytest.raises(NotALedger, match="format 'other/9', expected 'dharma-ledger/1'"):
        await PostgresLedger.open(url)


def test_a_reader_of_an_empty_database_says_there_is_no_ledger(url: str) -> None:
    with pytest.raises(LedgerError, match="no karma ledger there"):
        PostgresLedgerReader(url)


async def test_an_unreachable_server_is_a_clear_error(postgres: PostgresServer) -> None:
    url = postgres.url.rsplit(":", 1)[0] + ":1/ledger"
    with pytest.raises(LedgerError, match=r"127\.0\.0\.1:1/ledger: cannot connect to PostgreSQL"):
        await PostgresLedger.open(url)
    with pytest.raises(LedgerError, match="cannot connect to PostgreSQL"):
        PostgresLedgerReader(url)


def test_messages_never_show_the_password() -> None:
    assert display_url("postgresql://u:secret@db:5433/l") == "postgresql://u@db:5433/l"
    assert display_url("postgresql://db/l") == "postgresql://db/l"


async def test_appends_fail_closed_while_the_server_is_down_and_resume_after(url: str, postgres: PostgresServer) -> None:
    ledger = await PostgresLedger.open(url)
    await ledger.append(make_entry(0))
    postgres.stop()
    try:
        with pytest.raises(LedgerError, match="not committed"):
            await ledger.append(make_entry(1))
        with pytest.raises(LedgerError, match="cannot connect to PostgreSQL"):
            await ledger.append(make_entry(2))
    finally:
        postgres.start()
    appended = await ledger.append(make_entry(3))
    assert appended.seq == 2  # nothing of the failed appends was written
    await ledger.aclose()
    with PostgresLedgerReader(url) as reader:
        assert verify_ledger(reader).ok and reader.size() == 2


def dharma(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would; never a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_")}
    env.update(DHARMA_STATE_ROOT=str(cwd / "state"), PYTHONPATH=str(Path(__file__).parents[2]))
    done = subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60, check=False)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


async def test_audit_verify_and_query_take_a_postgres_url(url: str, tmp_path: Path) -> None:
    ledger = await PostgresLedger.open(url)
    await fill(ledger, 12)
    await ledger.aclose()
    verified = dharma("audit", "verify", "--ledger", url, cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith(f"OK {url}: 12 records"), verified.stdout
    queried = dharma("audit", "query", "--ledger", url, "--principal", "bob", "--format", "jsonl", cwd=tmp_path)
    assert [json.loads(line)["seq"] for line in queried.stdout.splitlines()] == [2, 5, 8, 11]
    (tmp_path / "dharma.yaml").write_text(f"ledger: {{url: '{url}'}}\n")
    assert dharma("--config", "dharma.yaml", "audit", "verify", cwd=tmp_path).stdout.startswith(f"OK {url}: 12 records")
    with raw(url) as conn:
        conn.execute("ALTER TABLE records DISABLE TRIGGER USER")
        conn.execute("UPDATE records SET body = 'x'::bytea WHERE seq = 5")
    failed = dharma("audit", "verify", "--ledger", url, cwd=tmp_path)
    assert failed.returncode == 1 and f"FAIL {url} at seq 5" in failed.stdout


def test_audit_commands_refuse_a_database_that_is_not_a_ledger(url: str, tmp_path: Path) -> None:
    with raw(url) as conn:
        conn.execute("CREATE TABLE customers(id int)")
    done = dharma("audit", "verify", "--ledger", url, cwd=tmp_path)
    assert done.returncode == 2 and "is not a Dharma karma ledger (it holds other tables: customers)" in done.stderr


async def test_the_gateway_writes_to_the_ledger_dharma_yaml_names(url: str, tmp_path: Path) -> None:
    settings = Settings.model_validate({"state_root": str(tmp_path), "ledger": {"url": url}})
    ledger = await open_ledger(settings)
    assert isinstance(ledger, PostgresLedger)
    assert (await ledger.append(make_entry(0))).seq == 1
    await ledger.aclose()
    settings = Settings.model_validate({"state_root": str(tmp_path), "ledger": {"url": url.rsplit(":", 1)[0] + ":1/x"}})
    with pytest.raises(LedgerError, match="cannot connect to PostgreSQL"):
        await open_ledger(settings)


async def test_migrate_copies_a_sqlite_ledger_byte_for_byte(url: str, tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = tmp_path / "karma.db"
    source = await SqliteLedger.open(path)
    await fill(source, 30)
    note = await source.checkpoint(key, "log", "example.com/karma")
    await source.aclose()
    done = dharma("audit", "migrate", f"sqlite://{path}", url, cwd=tmp_path)
    assert done.returncode == 0 and f"OK {path} -> {url}: 30 records" in done.stdout, done.stdout + done.stderr
    with SqliteLedgerReader(path) as original, PostgresLedgerReader(url) as copy:
        assert list(copy.iter_records()) == list(original.iter_records())
        assert copy.checkpoints() == [(30, note)]
        assert copy.checkpoint_rows() == original.checkpoint_rows()  # created_at too: its stamp says it
        assert verify_ledger(copy, keys=[("log", key.public_key())]).ok
        assert [r["seq"] for r in query_records(copy, rule="rule-1")] == [
            r["seq"] for r in query_records(original, rule="rule-1")]
    again = dharma("audit", "migrate", str(path), url, cwd=tmp_path)  # never into a ledger that has records
    assert again.returncode == 1 and "already holds 30 records" in again.stdout
    ledger = await PostgresLedger.open(url)  # the copy is a ledger a gateway writes on
    assert (await ledger.append(make_entry(30))).seq == 31
    await ledger.aclose()


async def test_migrate_refuses_a_damaged_source(url: str, tmp_path: Path) -> None:
    path = tmp_path / "karma.db"
    source = await SqliteLedger.open(path)
    await fill(source, 5)
    await source.aclose()
    attacker(path).execute("UPDATE records SET body = x'00' WHERE seq = 3")
    done = dharma("audit", "migrate", str(path), url, cwd=tmp_path)
    assert done.returncode == 1 and "does not verify at seq 3" in done.stdout and "nothing was copied" in done.stdout
    with raw(url) as conn:
        assert conn.execute("SELECT to_regclass('records')").fetchone() == (None,)


async def test_group_commit_batches_concurrent_appends(url: str, ledger_logs: list[dict[str, Any]]) -> None:
    ledger = await PostgresLedger.open(url, batch_max=64)
    await fill(ledger, 200)  # all 200 are queued before the writer task runs again
    batches = [e for e in ledger_logs if e["event"] == "ledger.batch_committed"]
    assert sum(e["count"] for e in batches) == 200
    assert max(e["count"] for e in batches) == 64 and len(batches) <= 8
    await ledger.aclose()
