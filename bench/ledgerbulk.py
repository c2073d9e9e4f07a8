"""Build a large ledger in seconds: valid, chained records inserted in batches, straight into the tables.

Appending 1,000,000 records through `SqliteLedger.append` takes ~80 s; the query and verify
benchmarks only need the result. The records here are the ones `append` would write: the
entries of `bench.ledgerfill.entry`, canonicalised by `audit.records.encode_entry`, chained
with `record_bytes` and the RFC 9162 leaf hash, with the derived columns of `index_fields`.
Entries are encoded in worker processes (in order, a few chunks ahead); the chain is computed
in this process. Each chunk is committed with the head moved to its last record, so the ledger
is valid after every commit; the empty ledger itself is created by the real ledger classes.

SQLite: `executemany` under the ledger's writer lock (its trigger fills the rule index).
PostgreSQL: `COPY` into `records` and `record_rules`, then the `head` row, under the head's row lock.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from audit.errors import LedgerError
from audit.postgres import PostgresLedger, display_url
from audit.records import GENESIS_PREV, IndexFields, encode_entry, index_fields, record_bytes, rule_ids
from audit.sqlite import RECORD_COLUMNS, SqliteLedger
from audit.sqlite_files import WriterLock
from bench.ledgerfill import entry

CHUNK = 10_000
AHEAD = 4  # chunks encoded ahead of the one being chained and written (bounds memory)
_COLUMNS = RECORD_COLUMNS.split(", ")


@dataclass(frozen=True, slots=True)
class Record:
    """One record as the ledger stores it: seq, leaf hash, bytes, derived columns, rule ids."""

    seq: int
    hash: bytes
    body: bytes
    fields: IndexFields
    rules: tuple[str, ...]

    def row(self) -> tuple[Any, ...]:
        f = self.fields
        return (self.seq, self.hash, self.body, f.time, f.principal, f.tool, f.decision, f.status,
                f.request_id, f.policy_version)


def _encode(start: int, stop: int, total: int) -> list[tuple[bytes, IndexFields, tuple[str, ...]]]:
    """Canonical entry bytes, derived columns and rule ids of entries start..stop-1 (in a worker)."""
    out = []
    for i in range(start, stop):
        e = entry(i, total)
        out.append((encode_entry(e, ledger="bulk load"), index_fields(e), rule_ids(e)))
    return out


def chained(total: int, *, workers: int | None = None) -> Iterator[list[Record]]:
    """The records of a `total`-entry ledger, chained from genesis, in chunks of `CHUNK`, seq order."""
    seq, prev = 0, GENESIS_PREV
    sha256 = hashlib.sha256
    bounds = iter([(s, min(s + CHUNK, total), total) for s in range(0, total, CHUNK)])
    with ProcessPoolExecutor(max_workers=workers or min(2, os.cpu_count() or 1)) as pool:
        pending: deque[Future[list[tuple[bytes, IndexFields, tuple[str, ...]]]]] = deque()
        for b in bounds:
            pending.append(pool.submit(_encode, *b))
            if len(pending) >= AHEAD:
                break
        while pending:
            encoded = pending.popleft().result()
            if (b := next(bounds, None)) is not None:
                pending.append(pool.submit(_encode, *b))
            chunk = []
            for body_entry, fields, rules in encoded:
                seq += 1
                body = record_bytes(body_entry, prev, seq)
                digest = sha256(b"\x00" + body).digest()
                prev = digest.hex()
                chunk.append(Record(seq, digest, body, fields, rules))
            yield chunk


class SqliteSink:
    """Writes chunks into a new SQLite ledger file, holding its writer lock until `close`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock: WriterLock) -> None:
        self.name = str(path)
        self._conn = conn
        self._lock = lock
        self._sql = f"INSERT INTO records({RECORD_COLUMNS}) VALUES ({','.join('?' * len(_COLUMNS))})"
        self.seconds = 0.0

    @classmethod
    async def create(cls, path: Path) -> SqliteSink:
        """Create the empty ledger with `SqliteLedger`, then take its writer lock for the load."""
        await (await SqliteLedger.open(path, synchronous="NORMAL")).aclose()
        lock = WriterLock(path)
        lock.acquire()
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous=NORMAL")
        if conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]:
            conn.close()
            lock.release()
            raise LedgerError(f"{path}: the bulk loader writes only into an empty ledger")
        return cls(path, conn, lock)

    def write(self, chunk: list[Record]) -> None:
        t0 = time.perf_counter()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(self._sql, [r.row() for r in chunk])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._conn.close()
        self._lock.release()


class PostgresSink:
    """Writes chunks into a new PostgreSQL ledger with COPY; each chunk moves the head row."""

    def __init__(self, url: str, conn: psycopg.Connection[Any]) -> None:
        self.name = display_url(url)
        self._conn = conn
        self.seconds = 0.0

    @classmethod
    async def create(cls, url: str) -> PostgresSink:
        """Create the empty ledger with `PostgresLedger`, then connect for the load."""
        await (await PostgresLedger.open(url)).aclose()
        conn = psycopg.connect(url, autocommit=True)
        if conn.execute("SELECT size FROM head").fetchone()[0]:  # type: ignore[index]
            conn.close()
            raise LedgerError(f"{display_url(url)}: the bulk loader writes only into an empty ledger")
        return cls(url, conn)

    def write(self, chunk: list[Record]) -> None:
        t0 = time.perf_counter()
        conn = self._conn
        with conn.transaction():
            size = conn.execute("SELECT size FROM head FOR UPDATE").fetchone()[0]  # type: ignore[index]
            if size != chunk[0].seq - 1:
                raise LedgerError(f"{self.name}: the head moved to {size} during the bulk load")
            with conn.cursor() as cur:
                with cur.copy(f"COPY records ({RECORD_COLUMNS}) FROM STDIN") as copy:
                    for r in chunk:
                        copy.write_row(r.row())
                with cur.copy("COPY record_rules (seq, rule_id) FROM STDIN") as copy:
                    for r in chunk:
                        for rule in r.rules:
                            copy.write_row((r.seq, rule))
                cur.execute("UPDATE head SET size = %s, hash = %s", (chunk[-1].seq, chunk[-1].hash))
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._conn.close()


Sink = SqliteSink | PostgresSink


def load(total: int, sinks: list[Sink]) -> float:
    """Write the `total`-record ledger into every sink (one encoding pass); return the wall seconds."""
    t0 = time.perf_counter()
    try:
        for chunk in chained(total):
            for sink in sinks:
                sink.write(chunk)
    finally:
        for sink in sinks:
            sink.close()
    return time.perf_counter() - t0
