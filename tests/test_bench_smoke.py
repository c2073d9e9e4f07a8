"""Smoke test of the benchmarks: `python -m bench --quick` runs and prints every figure.

It checks that the figures are printed, never how fast anything is (design §8: performance is
measured by `bench/`, printed, and not asserted in tests). The bulk loader the ledger benchmarks
build their ledgers with is checked against the real writers: same bytes, same root, verifies.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import CheckpointSigner, verify_checkpoint
from audit.errors import LedgerError
from audit.postgres import PostgresLedger, PostgresLedgerReader
from audit.records import RecordFilter
from audit.sqlite import SqliteLedger, SqliteLedgerReader
from audit.verify import verify_ledger
from bench.ledgerbulk import CHUNK, PostgresSink, SqliteSink, chained, load
from bench.ledgerfill import check_encoding, entry
from tests.pg import PostgresServer, pg_bin, postgres_or_skip

REPO = Path(__file__).resolve().parent.parent


def test_bench_quick_prints_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,  # ~4 minutes on a quiet 2-core VM; a hang, not a busy machine, should end it
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{proc.stderr[-4000:]}"
    for title in ("== decision", "== governed", "== ledger_append", "== ledger_verify", "== ledger_proof",
                   "== ledger_query", "== mcp_stdio", "== mcp_http", "== replicas", "== detection, tuned corpus", "== targets"):
        assert title in out, f"{title!r} missing from:\n{out}"
    for figure in ("p50", "p99", "mean", "calls/s", "records/s", "rules eval/call", "added p50", "x direct",
                   "through dharma stdio", "through dharma serve /mcp", "clients", "SDK client", "2026-07-28"):
        assert figure in out, f"{figure!r} missing from:\n{out}"
    for figure in ("SQLite, synchronous FULL", "inclusion proof", "consistency proof"):
        assert figure in out, f"{figure!r} missing from:\n{out}"
    verdicts = [line for line in out.splitlines() if line.strip().startswith(("MET", "MISSED", "NOT MEASURED"))]
    assert len(verdicts) == 117, (f"expected one verdict per §8 target (verify and query once per backend, HTTP per era, detection per "
                                 f"family of the tuned and the ten held-out corpora, scanners):\n{out}")
    for backend in ("SQLite", "PostgreSQL"):
        assert sum(f"({backend})" in line for line in verdicts) == 2, f"verify and query verdicts for {backend}:\n{out}"
    if pg_bin() is not None:
        assert "NOT MEASURED" not in out, f"PostgreSQL is installed, so every ledger figure is measured:\n{out}"
        for figure in ("3 replicas, PostgreSQL + Redis", "Redis round trips add",
                       "PostgreSQL, fsync on", "PostgreSQL, verify_ledger", "PostgreSQL, inclusion proof",
                       "PostgreSQL, 1 principal, time window"):
            assert figure in out, f"{figure!r} missing from:\n{out}"
    for target in ("mcp stdio added p50", "mcp stdio gateway CPU per call", "dharma stdio start-up added",
                   "dharma --help", "governed p50", "governed throughput", "decision p99 @1,000 rules"):
        assert target in out, f"the issue-9 target {target!r} is missing:\n{out}"
    assert "== start-up" in out and "dharma stdio -- server" in out, f"the start-up rows are missing:\n{out}"
    for era in ("2025-11-25", "2026-07-28"):
        for target in (f"mcp http added p50 ({era}", f"mcp http gateway CPU per call ({era})", f"mcp http 8 clients vs direct ({era})"):
            assert target in out, f"the MCP HTTP target {target!r} is missing:\n{out}"
    assert "receipt returned: yes" in out, f"a governed MCP call came back without a receipt:\n{out}"
    for family in ("tool_poisoning", "injected_results", "obfuscated_shell", "encoded_secrets", "exfil_chains"):
        assert f"detection recall ({family})" in out, f"the corpus recall of {family} is missing:\n{out}"
    assert "detection benign look-alikes allowed" in out and "errors" in out, f"the corpus rows are missing:\n{out}"
    for corpus in ("held-out 10", "held-out 9", "held-out 8", "held-out 7", "held-out 6", "held-out 5", "held-out 4", "held-out 3", "held-out 2", "held-out 1, not independent"):
        for family in ("obfuscated_shell", "ssrf", "fetched_injection"):
            assert f"detection recall ({family}, {corpus})" in out, f"the {corpus} recall of {family} is missing:\n{out}"
        assert f"== detection, {corpus} corpus" in out, f"the {corpus} rows are missing:\n{out}"
    assert out.count("held-out, per class") == 10, f"the per-class rows of a held-out corpus are missing:\n{out}"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_or_skip() as server:
        yield server


def sqlite_schema(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path) as conn:
        return sorted(conn.execute("SELECT type, name, sql FROM sqlite_master"))


def rule_rows(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute("SELECT seq, rule_id FROM record_rules ORDER BY rowid"))


async def test_bulk_loaded_ledgers_hold_what_append_writes(tmp_path: Path, postgres: PostgresServer) -> None:
    """The bulk loader writes the records `append` would: same bytes and hashes, same Merkle root,
    rule index, query indexes and stored subtree hashes, across a chunk boundary, ending with a
    signed checkpoint, and `verify_ledger` passes on both backends; the writers then extend it."""
    total = CHUNK + 7
    appended = await SqliteLedger.open(tmp_path / "appended.db", synchronous="NORMAL")
    try:
        for i in range(total):
            await appended.append(entry(i, total))
    finally:
        await appended.aclose()
    url = postgres.new_database()
    signer = CheckpointSigner(Ed25519PrivateKey.generate(), "bench", "bench.example/karma")
    load(total, [await SqliteSink.create(tmp_path / "bulk.db"), await PostgresSink.create(url)], signer)
    by_rule = RecordFilter(rule="fs-no-traversal")
    with SqliteLedgerReader(tmp_path / "appended.db") as want:
        expected = list(want.iter_records())
        expected_hits = list(want.select_records(by_rule))
        expected_subtrees = list(want.subtrees())
        want_report = verify_ledger(want)
    assert want_report.ok and len(expected_hits) > CHUNK // 10 and len(expected_subtrees) == total // 256
    assert sqlite_schema(tmp_path / "bulk.db") == sqlite_schema(tmp_path / "appended.db")  # indexes and trigger rebuilt
    assert rule_rows(tmp_path / "bulk.db") == rule_rows(tmp_path / "appended.db")
    for reader in (SqliteLedgerReader(tmp_path / "bulk.db"), PostgresLedgerReader(url)):
        with reader:
            assert list(reader.iter_records()) == expected
            assert sorted(reader.select_records(by_rule)) == sorted(expected_hits)
            assert [tuple(row) for row in reader.subtrees()] == expected_subtrees and reader.keeps_subtrees()
            report = verify_ledger(reader)
            assert report.ok and report.checkpoints_checked == 1, report.problem
            assert (report.size, report.root) == (want_report.size, want_report.root)
            checkpoint = verify_checkpoint(reader.latest_checkpoint() or "", signer.private_key.public_key(), "bench")
            assert (checkpoint.size, checkpoint.root) == (total, want_report.root)
    with pytest.raises(LedgerError, match="only into an empty ledger"):
        await SqliteSink.create(tmp_path / "bulk.db")
    with pytest.raises(LedgerError, match="only into an empty ledger"):
        await PostgresSink.create(url)
    for reopened in (await PostgresLedger.open(url), await SqliteLedger.open(tmp_path / "bulk.db")):
        try:  # the writers accept the loaded ledgers and extend them, the rule index included
            assert (await reopened.append(entry(6, total + 1) | {"request_id": "extra"})).seq == total + 1
        finally:
            await reopened.aclose()
    for reader in (SqliteLedgerReader(tmp_path / "bulk.db"), PostgresLedgerReader(url)):
        with reader:
            assert reader.size() == total + 1 and verify_ledger(reader).ok
            assert [seq for seq, _, _ in reader.select_records(RecordFilter(request_id="extra", rule="fs-no-traversal"))] == [total + 1]


async def test_a_cut_short_bulk_load_is_completed_by_the_writer(tmp_path: Path) -> None:
    """A load that dies before it rebuilds the SQLite query indexes and rule trigger leaves a ledger
    whose next writer recreates them: queries and the rule index work again."""
    sink = await SqliteSink.create(tmp_path / "cut.db")
    for chunk in chained(300):
        sink.write(chunk)
    sink.close()  # no finish(): the indexes and the trigger are missing
    assert not any(name == "records_principal_time" for _, name, _ in sqlite_schema(tmp_path / "cut.db"))
    writer = await SqliteLedger.open(tmp_path / "cut.db")
    try:
        await writer.append(entry(6, 301))
    finally:
        await writer.aclose()
    await (await SqliteLedger.open(tmp_path / "new.db")).aclose()
    assert sqlite_schema(tmp_path / "cut.db") == sqlite_schema(tmp_path / "new.db")
    with SqliteLedgerReader(tmp_path / "cut.db") as reader:
        assert verify_ledger(reader).ok and reader.size() == 301
        assert 301 in [seq for seq, _, _ in reader.select_records(RecordFilter(rule="fs-no-traversal"))]


def test_template_encoding_is_the_real_encoding() -> None:
    """`encoded_entry` gives `encode_entry`'s bytes, `index_fields` and `rule_ids` for every entry shape."""
    check_encoding(1_000, range(1_000))
    check_encoding(123_457, range(0, 123_457, 101))


def test_bench_refuses_a_bad_size_naming_the_option() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--query-records", "0"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "--query-records: '0' must be above zero" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_revisions_runs_both_checkouts_side_by_side(tmp_path: Path) -> None:
    """`bench.revisions` runs governed calls in each checkout's own code: a checkout whose gateway
    cannot start is named, and two good ones get a row each with a ratio."""
    broken = tmp_path / "broken"
    broken.mkdir()
    proc = subprocess.run([sys.executable, "-m", "bench.revisions", str(REPO), str(broken), "--pairs", "1", "--blocks", "1",
                           "--calls", "20"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"{broken}: the governed call did not start" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "bench.revisions", str(REPO), str(REPO), "--pairs", "2", "--blocks", "1",
                           "--calls", "20"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith(("old ", "new "))]
    assert [row[0] for row in rows] == ["old", "new"] and rows[1][-1].endswith("x")
    assert "2 process pairs" in proc.stdout


def test_mcp_http_revisions_runs_both_checkouts_side_by_side(tmp_path: Path) -> None:
    """`bench.mcp_http_revisions` names a directory that is no checkout, and runs a `dharma serve` of
    each checkout against one upstream, here with 2 concurrent SDK clients each: a row each with its
    CPU, ratio, calls/s and p50."""
    proc = subprocess.run([sys.executable, "-m", "bench.mcp_http_revisions", str(REPO), str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"{tmp_path}: not a checkout of the gateway" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "bench.mcp_http_revisions", str(REPO), str(REPO), "--pairs", "1",
                           "--blocks", "2", "--calls", "20", "--clients", "2", "--client", "sdk"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith(("old ", "new "))]
    assert [row[0] for row in rows] == ["old", "new"] and rows[1][-4].endswith("x") and rows[1][-1] == "ms"
    assert float(rows[1][-3].replace(",", "")) > 0  # calls/s
    assert "1 gateway pairs x 2 alternating blocks of 20 calls from 2 SDK client(s)" in proc.stdout
    assert "pair 1/1" in proc.stdout and "new/old calls/s per pair" in proc.stdout
