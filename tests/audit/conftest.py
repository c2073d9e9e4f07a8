"""Shared fixtures for the karma ledger tests: entries, ledgers on real SQLite files and on a real
PostgreSQL server started from Debian's binaries (one per session, one database per ledger).

`ledger_backend` runs a contract test on both backends: it is the ledger's location, a file path
or a `postgresql://` URL; `open_ledger`, `open_reader` and `attacker` take either.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.postgres import LEDGER_TABLES, PostgresLedger, PostgresLedgerReader
from audit.sqlite import SqliteLedger, SqliteLedgerReader
from gateway.config import is_ledger_url
from tests.helpers import all_logs
from tests.pg import PostgresServer

BACKENDS = ("sqlite", "postgres")
Location = Path | str

PRINCIPALS = ("alice", "bob", "carol")
TOOLS = ("fs.read", "fs.write", "http.get", "shell.exec")
DECISIONS = ("allow", "deny", "require_approval")


def make_entry(i: int) -> dict[str, Any]:
    """A realistic entry; fields cycle so every filter has several matches."""
    return {
        "time": f"2026-11-22T01:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000000:06d}Z",
        "request_id": f"req-{i}",
        "principal": PRINCIPALS[i % 3],
        "backend": "demo",
        "tool": TOOLS[i % 4],
        "args_digest": f"{i:064x}",
        "args": {"path": f"/tmp/file-{i}", "note": "héllo ✓"},
        "decision": DECISIONS[i % 3],
        "enforced": i % 5 != 0,
        "matched_rules": [f"rule-{i % 2}", "rule-all"] if i % 2 else [],
        "block_class": None,
        "policy_version": f"pv-{i // 50}",
        "approval_id": f"apr-{i % 3}" if i % 11 == 5 else None,
        "response_digest": None,
        "status": "ok" if i % 7 else "error",
        "error_code": None if i % 7 else "backend_error",
        "latency_ms": i % 13 + 0.5,
        "tool_digest": "ab" * 32,
    }


@pytest.fixture
def entry() -> Callable[[int], dict[str, Any]]:
    return make_entry


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "karma.db"


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
async def ledger(ledger_path: Path) -> AsyncIterator[SqliteLedger]:
    opened = await SqliteLedger.open(ledger_path)
    yield opened
    await opened.aclose()


async def fill(ledger: Any, count: int, start: int = 0) -> None:
    """Append `count` generated entries, concurrently."""
    import asyncio

    await asyncio.gather(*(ledger.append(make_entry(i)) for i in range(start, start + count)))


def attacker(location: Location) -> Any:
    """A raw connection by someone with database access who drops the append-only triggers.

    On PostgreSQL it takes SQLite's `?` placeholders, so one tampering script serves both backends.
    """
    if is_ledger_url(str(location)):
        return _PgAttacker(str(location))
    conn = sqlite3.connect(location, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    return conn


def move_head(conn: Any) -> None:
    """What a careful forger of a PostgreSQL ledger does after rewriting or dropping records: move the
    `head` row to the last record (verify checks it; SQLite keeps no head row)."""
    if isinstance(conn, _PgAttacker):
        conn.execute("UPDATE head SET size = COALESCE(t.seq, 0), hash = COALESCE(t.hash, decode(repeat('00', 32), 'hex'))"
                     " FROM (SELECT max(seq) AS seq, (SELECT hash FROM records ORDER BY seq DESC LIMIT 1) AS hash"
                     " FROM records) AS t")


class _PgAttacker:
    """An owner of the PostgreSQL ledger who disables its triggers; `execute` takes `?` placeholders."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        for table in (*LEDGER_TABLES, "head"):
            self._conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor[Any]:
        return self._conn.execute(sql.replace("?", "%s"), params)

    def executemany(self, sql: str, params: Any) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), params)

    def close(self) -> None:
        self._conn.close()


async def open_ledger(location: Location, **options: Any) -> Any:
    """The writer of the ledger at `location` (a file path or a PostgreSQL URL)."""
    if is_ledger_url(str(location)):
        return await PostgresLedger.open(str(location), **options)
    return await SqliteLedger.open(location, **options)


def open_reader(location: Location) -> Any:
    """A reader of the ledger at `location` (a file path or a PostgreSQL URL)."""
    if is_ledger_url(str(location)):
        return PostgresLedgerReader(str(location))
    return SqliteLedgerReader(location)


def new_location(kind: str, request: pytest.FixtureRequest, directory: Path) -> Location:
    """A fresh ledger location of backend `kind`: a file under `directory`, or a new database."""
    if kind == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        url = server.new_database()
        request.addfinalizer(lambda: server.drop_database(url))
        return url
    return directory / "karma.db"


@pytest.fixture(params=BACKENDS)
def ledger_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """Where a contract test's ledger lives, once per backend: a SQLite file or a PostgreSQL URL."""
    return new_location(request.param, request, tmp_path)


@pytest.fixture
async def backend_ledger(ledger_backend: Location) -> AsyncIterator[Any]:
    """An open writer of the `ledger_backend` ledger, closed after the test."""
    opened = await open_ledger(ledger_backend)
    yield opened
    await opened.aclose()


@pytest.fixture
def ledger_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The ledgers' log events at every level, whatever logging an earlier test configured (a
    level filter or a logger cached on first use would hide them from capture_logs)."""
    import audit.postgres
    import audit.sqlite

    with all_logs(monkeypatch, audit.sqlite, audit.postgres) as logs:
        yield logs
