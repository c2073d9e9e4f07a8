"""Build a large ledger in seconds: valid, chained records inserted in batches, straight into the tables.

Appending 1,000,000 records through `SqliteLedger.append` takes ~80 s; the query and verify
benchmarks only need the result. The records here are the ones `append` would write: the entries
of `bench.ledgerfill.entry`, encoded from a template by `bench.ledgerfill.encoded_entry` (checked
byte for byte against `audit.records.encode_entry`, `index_fields` and `rule_ids` on a sample of
every load), chained with `record_bytes` and the RFC 9162 leaf hash, with the derived columns, the
rule index and the stored subtree hashes the writers store. Entries are encoded in worker
processes (in order, a few chunks ahead); the chain and the subtrees are computed in this process.
Each chunk is committed with the head moved to its last record, so the ledger is valid after every
commit; the empty ledger itself is created by the real ledger classes. Given a `CheckpointSigner`,
the load ends with a signed, stamped checkpoint at the last record, as a writer's close would store.

SQLite: the query indexes are dropped for the load (the loader writes the rule rows, one per record
as the writer would: the entries hold at most one rule) and built once at the end with the schema's
own statements, which `SqliteLedger.open` also runs, so a load cut short leaves a ledger its writer
completes. Plain `executemany` under the ledger's writer lock.
PostgreSQL: the same with its query indexes (which `PostgresLedger.open` recreates); binary `COPY`
of prebuilt rows into `records`, `record_rules` and `subtrees`, then the `head` row, under the
head's row lock.
"""

from __future__ import annotations

import hashlib
import os
import queue
import random
import sqlite3
import struct
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from audit.checkpoint import CheckpointSigner
from audit.errors import LedgerError
from audit.merkle import CompactRange, CompletedSubtree
from audit.postgres import INSERT_CHECKPOINT as PG_INSERT_CHECKPOINT
from audit.postgres import SECONDARY_INDEXES, SECONDARY_SCHEMA, PostgresLedger, display_url
from audit.records import GENESIS_PREV, record_bytes
from audit.sqlite import INSERT_CHECKPOINT, INSERT_SUBTREE, RECORD_COLUMNS, SqliteLedger
from audit.sqlite_files import SECONDARY_OBJECTS, SECONDARY_STATEMENTS, WriterLock
from bench.ledgerfill import check_encoding, encoded_entry

CHUNK = 10_000
AHEAD = 4  # chunks encoded ahead of the one being chained and written (bounds memory)
SAMPLE = 200  # entries per load checked against the real encoder

Encoded = tuple[bytes, tuple[str | None, ...], tuple[str, ...], bytes]


@dataclass(slots=True)
class Record:
    """One record as the ledger stores it: seq, leaf hash, bytes, derived column values, rule ids,
    and those column values in PostgreSQL's binary COPY format (made in the encoding workers)."""

    seq: int
    hash: bytes
    body: bytes
    fields: tuple[str | None, ...]
    rules: tuple[str, ...]
    copy_fields: bytes

    def row(self) -> tuple[Any, ...]:
        return (self.seq, self.hash, self.body, *self.fields)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive records, the subtree hashes they complete, and the tree's root after them."""

    records: list[Record]
    subtrees: list[CompletedSubtree]
    root: bytes


def _encode(start: int, stop: int, total: int) -> list[Encoded]:
    """Entry bytes, derived columns, rule ids and the columns as binary COPY fields of entries
    start..stop-1 (in a worker)."""
    out = []
    for i in range(start, stop):
        body, fields, rules = encoded_entry(i, total)
        out.append((body, fields, rules, b"".join(map(_text, fields))))
    return out


def chained(total: int, *, workers: int | None = None) -> Iterator[Chunk]:
    """The records of a `total`-entry ledger, chained from genesis, in chunks of `CHUNK`, seq order.

    Raises:
        AssertionError: the template encoding differs from `encode_entry` on the sample.
    """
    pick = random.Random(total)
    check_encoding(total, sorted({*range(min(total, SAMPLE // 2)), *(pick.randrange(total) for _ in range(SAMPLE // 2))})
                   if total else [])
    seq, prev = 0, GENESIS_PREV
    sha256 = hashlib.sha256
    frontier = CompactRange()
    bounds = iter([(s, min(s + CHUNK, total), total) for s in range(0, total, CHUNK)])
    with ProcessPoolExecutor(max_workers=workers or min(2, os.cpu_count() or 1)) as pool:
        pending: deque[Future[list[Encoded]]] = deque()
        for b in bounds:
            pending.append(pool.submit(_encode, *b))
            if len(pending) >= AHEAD:
                break
        while pending:
            encoded = pending.popleft().result()
            if (b := next(bounds, None)) is not None:
                pending.append(pool.submit(_encode, *b))
            records = []
            for entry_bytes, fields, rules, copy_fields in encoded:
                seq += 1
                body = record_bytes(entry_bytes, prev, seq)
                digest = sha256(b"\x00" + body).digest()
                prev = digest.hex()
                records.append(Record(seq, digest, body, fields, rules, copy_fields))
            subtrees = frontier.extend_collecting([r.hash for r in records])
            yield Chunk(records, subtrees, frontier.root())


class SqliteSink:
    """Writes chunks into a new SQLite ledger file, holding its writer lock until `close`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock: WriterLock) -> None:
        self.name = str(path)
        self._conn = conn
        self._lock = lock
        self.seconds = 0.0

    @classmethod
    async def create(cls, path: Path) -> SqliteSink:
        """Create the empty ledger with `SqliteLedger`, take its writer lock, and drop the query
        indexes until `finish` (or the writer's next open) builds them."""
        await (await SqliteLedger.open(path, synchronous="NORMAL")).aclose()
        lock = WriterLock(path)
        lock.acquire()
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # written by a load thread
        if conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]:
            conn.close()
            lock.release()
            raise LedgerError(f"{path}: the bulk loader writes only into an empty ledger")
        conn.execute("PRAGMA journal_mode=OFF")  # write each page once, not to the WAL and then again; back to WAL at the end
        conn.execute("PRAGMA synchronous=OFF")  # the load is redone from scratch if the machine dies
        conn.execute("PRAGMA cache_size=-262144")  # 256 MiB for building the indexes
        for kind, name in SECONDARY_OBJECTS:
            conn.execute(f"DROP {kind} {name}")
        return cls(path, conn, lock)

    def write(self, chunk: Chunk) -> None:
        t0 = time.perf_counter()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            _insert(conn, f"records({RECORD_COLUMNS})", [r.row() for r in chunk.records])
            _insert(conn, "record_rules(seq, rule_id)", [(r.seq, rule) for r in chunk.records for rule in r.rules])
            conn.executemany(INSERT_SUBTREE, chunk.subtrees)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.seconds += time.perf_counter() - t0

    def finish(self, size: int, stored: tuple[str, str] | None) -> None:
        """Build the query indexes, store the checkpoint (note, created_at), return to WAL mode."""
        t0 = time.perf_counter()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        for statement in SECONDARY_STATEMENTS:
            conn.execute(statement)
        if stored is not None:
            conn.execute(INSERT_CHECKPOINT, (size, *stored))
        conn.execute("COMMIT")
        if str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower() != "wal":
            raise LedgerError(f"{self.name}: SQLite refused to return the loaded ledger to WAL mode")
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._conn.close()
        self._lock.release()


def _insert(conn: sqlite3.Connection, into: str, rows: list[tuple[Any, ...]], per_statement: int = 500) -> None:
    """Insert rows with multi-row INSERTs: one statement step per `per_statement` rows, so the GIL,
    which sqlite3 gives up around each step, changes hands rarely while the chain is computed."""
    for start in range(0, len(rows), per_statement):
        part = rows[start : start + per_statement]
        row = "(" + ",".join("?" * len(part[0])) + ")"
        conn.execute(f"INSERT INTO {into} VALUES {','.join([row] * len(part))}", [v for r in part for v in r])


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
_COPY_TRAILER = struct.pack("!h", -1)


def _text(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    data = value.encode("utf-8")
    return struct.pack("!i", len(data)) + data


def _copy_binary(cur: psycopg.Cursor[Any], sql: str, rows: Iterator[bytes]) -> None:
    """COPY ... FROM STDIN (FORMAT BINARY) of rows already in PostgreSQL's binary tuple format."""
    with cur.copy(f"{sql} FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(b"".join((_COPY_HEADER, *rows, _COPY_TRAILER)))


class PostgresSink:
    """Writes chunks into a new PostgreSQL ledger with binary COPY; each chunk moves the head row."""

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
        conn.execute("SET synchronous_commit = off")  # the load is redone from scratch if the server dies
        conn.execute("SET maintenance_work_mem = '256MB'")  # for building the indexes
        for name, _ in SECONDARY_INDEXES:
            conn.execute(f"DROP INDEX {name}")
        return cls(url, conn)

    def write(self, chunk: Chunk) -> None:
        t0 = time.perf_counter()
        conn = self._conn
        records = chunk.records
        pack, int8, text = struct.pack, struct.Struct("!hiq").pack, _text
        hash_len = pack("!i", 32)
        with conn.transaction():
            size = conn.execute("SELECT size FROM head FOR UPDATE").fetchone()[0]  # type: ignore[index]
            if size != records[0].seq - 1:
                raise LedgerError(f"{self.name}: the head moved to {size} during the bulk load")
            with conn.cursor() as cur:
                _copy_binary(cur, f"COPY records ({RECORD_COLUMNS})", (
                    b"".join((int8(10, 8, r.seq), hash_len, r.hash, pack("!i", len(r.body)), r.body, r.copy_fields))
                    for r in records))
                _copy_binary(cur, "COPY record_rules (seq, rule_id)",
                             (int8(2, 8, r.seq) + text(rule) for r in records for rule in r.rules))
                _copy_binary(cur, "COPY subtrees (height, idx, hash)",
                             (pack("!hiiiqi", 3, 4, height, 8, index, 32) + digest for height, index, digest in chunk.subtrees))
                cur.execute("UPDATE head SET size = %s, hash = %s", (records[-1].seq, records[-1].hash))
        self.seconds += time.perf_counter() - t0

    def finish(self, size: int, stored: tuple[str, str] | None) -> None:
        """Build the query indexes and store the checkpoint (note, created_at)."""
        t0 = time.perf_counter()
        with self._conn.transaction():
            self._conn.execute(SECONDARY_SCHEMA)
            if stored is not None:
                self._conn.execute(PG_INSERT_CHECKPOINT, (size, *stored))
        self._conn.execute("ANALYZE")
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._conn.close()


Sink = SqliteSink | PostgresSink


def load(total: int, sinks: list[Sink], signer: CheckpointSigner | None = None) -> float:
    """Write the `total`-record ledger into every sink (one encoding pass, one writer thread per
    sink so the backends load side by side); return the wall seconds.

    With `signer`, every ledger ends with a stored checkpoint at `total` signed by it."""
    t0 = time.perf_counter()
    queues: list[queue.Queue[Chunk | None]] = [queue.Queue(maxsize=2) for _ in sinks]
    try:
        with ThreadPoolExecutor(max_workers=len(sinks), thread_name_prefix="bulk-load") as pool:
            writers = [pool.submit(_drain, sink, q) for sink, q in zip(sinks, queues, strict=True)]
            root, size = None, 0
            try:
                for chunk in chained(total):
                    for q, writer in zip(queues, writers, strict=True):
                        _put(q, chunk, writer)
                    root, size = chunk.root, chunk.records[-1].seq
            finally:
                for q, writer in zip(queues, writers, strict=True):
                    _put(q, None, writer)
            for writer in writers:
                writer.result()
        note = signer.sign_stored(size, root, None) if signer is not None and root is not None else None  # the first stored
        for sink in sinks:
            sink.finish(size, note)
    finally:
        for sink in sinks:
            sink.close()
    return time.perf_counter() - t0


def _drain(sink: Sink, chunks: queue.Queue[Chunk | None]) -> None:
    """Write every chunk handed over until the None that ends the load."""
    while (chunk := chunks.get()) is not None:
        sink.write(chunk)


def _put(chunks: queue.Queue[Chunk | None], chunk: Chunk | None, writer: Future[None]) -> None:
    """Hand a chunk to a sink's writer thread; stop waiting (its error surfaces) once that writer has failed."""
    while not writer.done():
        try:
            chunks.put(chunk, timeout=0.5)
            return
        except queue.Full:
            continue
