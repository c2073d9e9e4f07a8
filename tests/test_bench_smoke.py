"""Smoke test of the benchmarks: `python -m bench --quick` runs and prints every figure.

It checks that the figures are printed, never how fast anything is (design §8: performance is
measured by `bench/`, printed, and not asserted in tests). The bulk loader the ledger benchmarks
build their ledgers with is checked against the real writers: same bytes, same root, verifies.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from audit.errors import LedgerError
from audit.postgres import PostgresLedger, PostgresLedgerReader
from audit.records import RecordFilter
from audit.sqlite import SqliteLedger, SqliteLedgerReader
from audit.verify import verify_ledger
from bench.ledgerbulk import CHUNK, PostgresSink, SqliteSink, load
from bench.ledgerfill import entry
from tests.pg import PostgresServer, pg_bin, postgres_or_skip

REPO = Path(__file__).resolve().parent.parent


def test_bench_quick_prints_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{proc.stderr[-4000:]}"
    for title in ("== decision", "== governed", "== ledger_append", "== ledger_verify", "== ledger_proof",
                   "== ledger_query", "== mcp_stdio", "== mcp_http", "== targets"):
        assert title in out, f"{title!r} missing from:\n{out}"
    for figure in ("p50", "p99", "mean", "calls/s", "records/s", "rules eval/call", "added p50", "x direct",
                   "through dharma stdio", "through dharma serve /mcp", "clients", "SDK client", "2026-07-28"):
        assert figure in out, f"{figure!r} missing from:\n{out}"
    for figure in ("SQLite, synchronous FULL", "inclusion proof", "consistency proof"):
        assert figure in out, f"{figure!r} missing from:\n{out}"
    verdicts = [line for line in out.splitlines() if line.strip().startswith(("MET", "MISSED", "NOT MEASURED"))]
    assert len(verdicts) == 14, f"expected one verdict per §8 target (verify and query once per backend, HTTP per era):\n{out}"
    for backend in ("SQLite", "PostgreSQL"):
        assert sum(f"({backend})" in line for line in verdicts) == 2, f"verify and query verdicts for {backend}:\n{out}"
    if pg_bin() is not None:
        assert "NOT MEASURED" not in out, f"PostgreSQL is installed, so every ledger figure is measured:\n{out}"
        for figure in ("PostgreSQL, fsync on", "PostgreSQL, verify_ledger", "PostgreSQL, inclusion proof",
                       "PostgreSQL, 1 principal, time window"):
            assert figure in out, f"{figure!r} missing from:\n{out}"
    assert "mcp stdio added p50" in out, f"the MCP stdio target is missing:\n{out}"
    for era in ("2025-11-25", "2026-07-28"):
        for target in (f"mcp http added p50 ({era}", f"mcp http gateway CPU per call ({era})", f"mcp http 8 clients vs direct ({era})"):
            assert target in out, f"the MCP HTTP target {target!r} is missing:\n{out}"
    assert "receipt returned: yes" in out, f"a governed MCP call came back without a receipt:\n{out}"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_or_skip() as server:
        yield server


async def test_bulk_loaded_ledgers_hold_what_append_writes(tmp_path: Path, postgres: PostgresServer) -> None:
    """The bulk loader writes the records `append` would: same bytes and hashes, same Merkle root,
    rule index included, across a chunk boundary, and `verify_ledger` passes on both backends."""
    total = CHUNK + 7
    appended = await SqliteLedger.open(tmp_path / "appended.db", synchronous="NORMAL")
    try:
        for i in range(total):
            await appended.append(entry(i, total))
    finally:
        await appended.aclose()
    url = postgres.new_database()
    load(total, [await SqliteSink.create(tmp_path / "bulk.db"), await PostgresSink.create(url)])
    by_rule = RecordFilter(rule="fs-no-traversal")
    with SqliteLedgerReader(tmp_path / "appended.db") as want:
        expected = list(want.iter_records())
        expected_hits = list(want.select_records(by_rule))
        want_report = verify_ledger(want)
    assert want_report.ok and len(expected_hits) > CHUNK // 10
    for reader in (SqliteLedgerReader(tmp_path / "bulk.db"), PostgresLedgerReader(url)):
        with reader:
            assert list(reader.iter_records()) == expected
            assert sorted(reader.select_records(by_rule)) == sorted(expected_hits)
            report = verify_ledger(reader)
            assert report.ok, report.problem
            assert (report.size, report.root) == (want_report.size, want_report.root)
    with pytest.raises(LedgerError, match="only into an empty ledger"):
        await SqliteSink.create(tmp_path / "bulk.db")
    with pytest.raises(LedgerError, match="only into an empty ledger"):
        await PostgresSink.create(url)
    reopened = await PostgresLedger.open(url)  # the writer accepts the loaded ledger and extends it
    try:
        assert (await reopened.append(entry(total, total + 1))).seq == total + 1
    finally:
        await reopened.aclose()


def test_bench_refuses_a_bad_size_naming_the_option() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--query-records", "0"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "--query-records: '0' must be above zero" in proc.stderr
    assert "Traceback" not in proc.stderr
