"""The karma ledger on PostgreSQL: `PostgresLedger` (writer) and `PostgresLedgerReader`.

Same record bytes, record hash, derived columns and rule index as the SQLite ledger
(`audit.sqlite`). The tables refuse UPDATE, DELETE and TRUNCATE by trigger. Positions are
assigned inside each batch transaction under a row lock on the one-row `head` table (never a
sequence: a rolled-back sequence value leaves a gap), so several gateway replicas may write the
same ledger: their batches serialize on that lock, and a writer that finds the head moved reads
the hashes the others appended to keep its Merkle frontier right.

One asyncio writer task per `PostgresLedger` does group commit: it takes whatever appends are
queued, commits them in one transaction and only then answers each caller. A failed commit
fails its whole batch (fail closed) and the writer drops its connection, so the next batch starts
on a fresh session: after PostgreSQL was down, made read-only or out of space, appends resume on
their own once it can take them again.
`append_linked` commits one record together with one row of the caller's (the approval store
marks an approval event recorded that way), in a transaction of its own: both or neither.
Given a `CheckpointSigner`, the writer signs and stores checkpoints on its own, on the same
schedule as the SQLite writer (`audit.checkpoint.CheckpointSchedule`: at least every
`checkpoint_interval` seconds while the tree grows, and on close).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg.sql
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import merkle
from audit.checkpoint import CheckpointSchedule, CheckpointSigner, checkpoint_to_store, parse_checkpoint
from audit.errors import LedgerError, NotALedger
from audit.merkle import CompactRange
from audit.stats import AppendStats
from audit.records import (
    FORMAT,
    GENESIS_PREV,
    SUBTREES_KEY,
    Appended,
    IndexFields,
    RecordFilter,
    StoredRecord,
    encode_entry,
    index_fields,
    parse_record,
    quick_index,
    record_bytes,
    rule_ids,
)
from audit.sqlite import deliver
from audit.sqlite_read import filter_sql
from audit.store import IndexedRaw, IndexedRecord, LedgerReader, RawRecord
from audit.verify import VerifyReport, verify_ledger

log = structlog.get_logger()

CONNECT_TIMEOUT_S = 5
READ_CHUNK = 10_000
STREAM_CHUNK = 100
"""Rows a query's server-side cursor fetches per round trip."""
LEDGER_TABLES = ("meta", "records", "record_rules", "checkpoints", "subtrees")
CREATE_LOCK = 0x6448_6172_6D61  # advisory lock id: two replicas creating one ledger take turns

# The query indexes: derived from the records, so a writer recreates any that is missing when it opens
# the ledger (the bulk loader drops them for the load and builds them once at the end).
SECONDARY_INDEXES = (
    ("records_principal_time", "records(principal, time)"),
    ("records_tool_time", "records(tool, time)"),
    ("records_time", "records(time)"),
    ("record_rules_rule", "record_rules(rule_id, seq)"),
    ("record_rules_seq", "record_rules(seq)"),  # verify reads each record's rule rows by seq
)
SECONDARY_SCHEMA = "".join(f"CREATE INDEX IF NOT EXISTS {name} ON {columns};\n" for name, columns in SECONDARY_INDEXES)
SCHEMA = """
CREATE TABLE meta(key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE head(one boolean PRIMARY KEY DEFAULT true CHECK (one), size bigint NOT NULL, hash bytea NOT NULL);
CREATE TABLE records(
    seq bigint PRIMARY KEY,
    hash bytea NOT NULL,
    body bytea NOT NULL,
    time text COLLATE "C", principal text, tool text COLLATE "C", decision text, status text,
    request_id text, policy_version text
);
CREATE TABLE record_rules(seq bigint NOT NULL, rule_id text NOT NULL);
CREATE TABLE checkpoints(size bigint PRIMARY KEY, note text NOT NULL, created_at text NOT NULL);
CREATE FUNCTION dharma_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'karma ledger is append-only (% on %)', TG_OP, TG_TABLE_NAME; END $$;
CREATE FUNCTION dharma_ledger_head_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.size < OLD.size THEN RAISE EXCEPTION 'karma ledger head cannot move back'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER head_forward BEFORE UPDATE ON head FOR EACH ROW EXECUTE FUNCTION dharma_ledger_head_forward();
CREATE TRIGGER head_no_delete BEFORE DELETE OR TRUNCATE ON head FOR EACH STATEMENT
    EXECUTE FUNCTION dharma_ledger_append_only();
""" + "".join(
    f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {table} "
    "FOR EACH STATEMENT EXECUTE FUNCTION dharma_ledger_append_only();\n"
    for table in LEDGER_TABLES if table != "subtrees"
)
# Hashes of complete subtrees, derived from the records (outside the chain; `audit verify` checks
# them): proofs read O(log n) of them instead of every leaf. A ledger created before it existed gets
# the table and its rows when a writer opens it.
SUBTREES_SCHEMA = """
CREATE TABLE IF NOT EXISTS subtrees(height integer NOT NULL, idx bigint NOT NULL, hash bytea NOT NULL, PRIMARY KEY(height, idx));
CREATE OR REPLACE TRIGGER subtrees_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON subtrees
    FOR EACH STATEMENT EXECUTE FUNCTION dharma_ledger_append_only();
"""

INSERT_RECORD = (
    "INSERT INTO records(seq, hash, body, time, principal, tool, decision, status, request_id, policy_version) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
INSERT_RULE = "INSERT INTO record_rules(seq, rule_id) VALUES (%s, %s)"
INSERT_SUBTREE = "INSERT INTO subtrees(height, idx, hash) VALUES (%s, %s, %s)"
INSERT_CHECKPOINT = "INSERT INTO checkpoints(size, note, created_at) VALUES (%s, %s, %s) ON CONFLICT (size) DO NOTHING"


def display_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _prepare(conn: psycopg.Connection[Any], name: str, *, create: bool) -> None:
    """Check that the database is a ledger (or, with `create`, make an empty one into a ledger).

    Raises:
        NotALedger: the database holds other tables, or a `meta` table of another format.
    """
    with conn.transaction():
        if create:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (CREATE_LOCK,))
        if conn.execute("SELECT to_regclass('meta')").fetchone()[0] is None:  # type: ignore[index]
            tables = [t for (t,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                "ORDER BY table_name LIMIT 5")]
            if tables:
                raise NotALedger(f"{name} is not a Dharma karma ledger (it holds other tables: {', '.join(tables)})")
            if not create:
                raise LedgerError(f"{name}: no karma ledger there (the database is empty)")
            conn.execute(SCHEMA)
            conn.execute(SECONDARY_SCHEMA)
            conn.execute(SUBTREES_SCHEMA)
            conn.execute("INSERT INTO meta(key, value) VALUES ('format', %s), ('created_at', %s), (%s, %s)",
                         (FORMAT, _utc_now(), SUBTREES_KEY, str(merkle.SUBTREE_STRIDE)))
            conn.execute("INSERT INTO head(size, hash) VALUES (0, %s)", (bytes.fromhex(GENESIS_PREV),))
            log.info("ledger.created", url=name)
        row = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
    if row is None or row[0] != FORMAT:
        found = "no format" if row is None else f"format {row[0]!r}"
        raise NotALedger(f"{name} is not a Dharma karma ledger ({found}, expected {FORMAT!r})")


def _connect(url: str, name: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise LedgerError(f"{name}: cannot connect to PostgreSQL ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _rebuild(conn: psycopg.Connection[Any], name: str) -> tuple[CompactRange, str]:
    """Rebuild the Merkle frontier from the stored hashes; refuse a ledger whose tail or checkpoint is off."""
    frontier = CompactRange()
    with conn.transaction():
        size, head = conn.execute("SELECT size, hash FROM head").fetchone()  # type: ignore[misc]
        latest = conn.execute("SELECT size, note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
        cp_root: bytes | None = merkle.EMPTY_ROOT if latest is not None and latest[0] == 0 else None
        for seq, digest in conn.execute("SELECT seq, hash FROM records WHERE seq <= %s ORDER BY seq", (size,)):
            if seq != frontier.size + 1 or len(digest) != merkle.HASH_SIZE:
                raise LedgerError(f"{name}: record {frontier.size + 1} is missing or damaged; run `dharma audit verify`")
            frontier.append(bytes(digest))
            if latest is not None and frontier.size == latest[0]:
                cp_root = frontier.root()
        tail = conn.execute("SELECT body FROM records WHERE seq = %s", (size,)).fetchone() if size else None
    if frontier.size != size:
        raise LedgerError(f"{name}: the head says {size} records but {frontier.size} are stored")
    if tail is not None:
        body = bytes(tail[0])
        try:
            ok = merkle.leaf_hash(body) == bytes(head) and parse_record(body).seq == size
        except ValueError:
            ok = False
        if not ok:
            raise LedgerError(f"{name}: the last record ({size}) does not match the head hash")
    if latest is not None:
        if cp_root is None:
            raise LedgerError(f"{name}: ledger has {size} records but its checkpoint is at size {latest[0]}")
        if parse_checkpoint(str(latest[1])).root != cp_root:
            raise LedgerError(f"{name}: the first {latest[0]} records do not match the stored checkpoint")
    return frontier, bytes(head).hex() if size else GENESIS_PREV


def _complete_derived(conn: psycopg.Connection[Any], name: str) -> bool:
    """Recreate a missing query index and give an older ledger its subtree hashes; True when the
    ledger stores subtree hashes. A role that may not (the writer role after `dharma audit grant`)
    leaves that to the owner: it is logged, queries and proofs still work, proofs read every leaf."""
    try:
        present = conn.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema()"
                               " AND indexname = ANY(%s)", ([n for n, _ in SECONDARY_INDEXES],)).fetchone()[0]  # type: ignore[index]
        if present < len(SECONDARY_INDEXES):
            conn.execute(SECONDARY_SCHEMA)
        _store_missing_subtrees(conn, name)
        return True
    except psycopg.errors.InsufficientPrivilege as exc:
        log.warning("ledger.derived_data_not_completed", url=name, reason=_first_line(exc),
                    fix="run `dharma audit grant` (or open the ledger once) as its owner")
        return conn.execute("SELECT 1 FROM meta WHERE key = %s", (SUBTREES_KEY,)).fetchone() is not None


def _store_missing_subtrees(conn: psycopg.Connection[Any], name: str) -> None:
    """Give a ledger created before subtree hashes were stored its `subtrees` table and rows (once,
    under the head's row lock, so no other writer appends meanwhile)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (CREATE_LOCK,))
        if conn.execute("SELECT 1 FROM meta WHERE key = %s", (SUBTREES_KEY,)).fetchone() is not None:
            return
        conn.execute("SELECT size FROM head FOR UPDATE")
        conn.execute(SUBTREES_SCHEMA)
        frontier = CompactRange()
        subtrees = frontier.extend_collecting([bytes(h) for (h,) in conn.execute("SELECT hash FROM records ORDER BY seq")])
        with conn.cursor() as cur:
            cur.executemany(INSERT_SUBTREE, subtrees)
        conn.execute("INSERT INTO meta(key, value) VALUES (%s, %s)", (SUBTREES_KEY, str(merkle.SUBTREE_STRIDE)))
    log.info("ledger.subtrees_stored", url=name, count=len(subtrees), size=frontier.size)


@dataclass(frozen=True, slots=True)
class LinkedRow:
    """A row written in the same transaction as one record: `sql` runs with `(*params, seq, hash)`
    (the record's position and hex hash), so the row exists exactly when the record does."""

    sql: str
    params: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class _Pending:
    entry: bytes
    fields: IndexFields
    rules: tuple[str, ...]
    future: asyncio.Future[Appended]
    linked: LinkedRow | None = None
    queued: float = field(default_factory=time.perf_counter)  # the append lag /metrics reports


@dataclass(frozen=True, slots=True)
class _Command:
    """Work the writer task runs between batches (signing a checkpoint), answered through `future`."""

    run: Callable[[], Awaitable[list[Any]]]
    future: asyncio.Future[Any]


_NEXT: Any = object()  # the writer loop's "nothing taken yet, wait for the next item"
_DUE: Any = object()  # the writer loop's "idle long enough: a periodic checkpoint may be due"


class PostgresLedger:
    """A writer of a PostgreSQL karma ledger (one of possibly several). Build it with `await PostgresLedger.open(url)`."""

    def __init__(self, url: str, conn: psycopg.AsyncConnection[Any], frontier: CompactRange, head_hash: str,
                 *, batch_max: int, schedule: CheckpointSchedule, subtrees: bool = True) -> None:
        self._url = url
        self._name = display_url(url)
        self._conn: psycopg.AsyncConnection[Any] | None = conn
        self._frontier = frontier
        self._size = frontier.size
        self._hash = head_hash
        self._root: tuple[int, bytes] | None = None  # (size, Merkle root), computed when read
        self._batch_max = batch_max
        self.stats = AppendStats()  # append lag and batch sizes, for /metrics
        self._schedule = schedule
        self._queue: asyncio.Queue[_Pending | _Command | None] = asyncio.Queue()
        self._closed = False
        self._subtrees = subtrees  # whether this ledger stores subtree hashes (see `_complete_derived`)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"karma-ledger:{self._name}")

    @classmethod
    async def open(cls, url: str, *, batch_max: int = 256, checkpoint_signer: CheckpointSigner | None = None,
                   checkpoint_interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> PostgresLedger:
        """Connect, create the ledger if the database is empty, check it, and start the writer task.

        `checkpoint_signer` turns on periodic checkpoints (every `checkpoint_interval` seconds of
        `clock` while the tree grows, and on close), as on SQLite.

        Raises:
            NotALedger: the database holds something else (it is left untouched).
            LedgerError: PostgreSQL cannot be reached, or the ledger is damaged.
        """
        name = display_url(url)
        if batch_max < 1 or checkpoint_interval <= 0:
            raise LedgerError(f"{name}: batch_max must be >= 1 and checkpoint_interval > 0")
        frontier, head_hash, checkpointed, subtrees = await asyncio.to_thread(cls._open_sync, url, name)
        conn = await cls._connect_async(url, name)
        log.info("ledger.opened", url=name, size=frontier.size)
        schedule = CheckpointSchedule(checkpoint_signer, checkpoint_interval, clock, checkpointed)
        return cls(url, conn, frontier, head_hash, batch_max=batch_max, schedule=schedule, subtrees=subtrees)

    @staticmethod
    def _open_sync(url: str, name: str) -> tuple[CompactRange, str, int, bool]:
        with _connect(url, name) as conn:
            try:
                _prepare(conn, name, create=True)
                subtrees = _complete_derived(conn, name)
                frontier, head_hash = _rebuild(conn, name)
                checkpointed = conn.execute("SELECT COALESCE(MAX(size), 0) FROM checkpoints").fetchone()[0]  # type: ignore[index]
                return frontier, head_hash, int(checkpointed), subtrees
            except psycopg.Error as exc:
                raise LedgerError(f"{name} cannot be prepared as a karma ledger ({_first_line(exc)})") from None

    @staticmethod
    async def _connect_async(url: str, name: str) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(url, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise LedgerError(f"{name}: cannot connect to PostgreSQL ({_first_line(exc)})") from None

    @property
    def url(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        """Records committed as of this writer's last batch (others may have added since)."""
        return self._size

    @property
    def head_hash(self) -> str:
        return self._hash

    def root(self) -> bytes:
        """Merkle root over the committed records, computed on first read after they grew (not per commit)."""
        frontier, cached = self._frontier, self._root
        if cached is None or cached[0] != frontier.size:
            cached = self._root = (frontier.size, frontier.root())
        return cached[1]

    async def append(self, entry: Mapping[str, Any]) -> Appended:
        """Record one entry; return its seq and hash once it is committed.

        Raises:
            LedgerError: the entry is not canonical JSON, the ledger is closed, or its batch
                was not committed (PostgreSQL down: nothing of that batch is acknowledged).
        """
        item = _Pending(encode_entry(entry, ledger=self._name), index_fields(entry), rule_ids(entry),
                        asyncio.get_running_loop().create_future())
        self._submit(item)
        return await asyncio.shield(item.future)

    async def append_linked(self, entry: Mapping[str, Any], linked: LinkedRow) -> Appended:
        """Record one entry and write `linked` in the same transaction, a batch of its own (so a
        linked row that fails, e.g. on a unique key, fails only this record, never other calls').

        Raises:
            LedgerError: as `append`; then neither the record nor the row was written.
        """
        item = _Pending(encode_entry(entry, ledger=self._name), index_fields(entry), rule_ids(entry),
                        asyncio.get_running_loop().create_future(), linked)
        self._submit(item)
        return await asyncio.shield(item.future)

    async def checkpoint(self, private_key: Ed25519PrivateKey, key_name: str, origin: str) -> str:
        """Sign the ledger's current head (all writers' records) as a checkpoint, store it and return it."""
        command = _Command(functools.partial(self._sign, CheckpointSigner(private_key, key_name, origin)),
                           asyncio.get_running_loop().create_future())
        self._submit(command)
        return await asyncio.shield(command.future)

    async def aclose(self) -> None:
        """Commit everything queued, stop the writer task and close the connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(None)
        await self._task
        log.info("ledger.closed", url=self._name, size=self._size)

    def _submit(self, item: _Pending | _Command) -> None:
        if self._closed:
            raise LedgerError(f"{self._name}: the ledger is closed")
        self._queue.put_nowait(item)

    async def _run(self) -> None:
        """Take one item, drain the queue behind it into one batch, commit, answer; until the stop.
        Between items, sign a periodic checkpoint when one is due; on the stop, a last one."""
        try:
            item = await self._next_item()
            while item is not None:
                if item is _DUE:
                    await self._auto_checkpoint(final=False)
                    item = await self._next_item()
                    continue
                if isinstance(item, _Command):
                    await self._answer([item.future], item.run())
                    item = await self._next_item()
                    continue
                batch = [item]
                while item.linked is None and len(batch) < self._batch_max and not self._queue.empty():
                    item = self._queue.get_nowait()
                    if not isinstance(item, _Pending) or item.linked is not None:
                        break
                    batch.append(item)
                else:
                    item = _NEXT
                await self._answer([p.future for p in batch], self._commit(batch))
                await self._auto_checkpoint(final=False)
                if item is _NEXT:
                    item = await self._next_item()
            await self._auto_checkpoint(final=True)
        finally:
            if self._conn is not None:
                await self._conn.close()

    async def _next_item(self) -> _Pending | _Command | None:
        """The next queued item, or `_DUE` once a periodic checkpoint may be due while idle."""
        due = self._schedule.wait_for(self._size)
        if due is None:
            return await self._queue.get()
        try:
            async with asyncio.timeout(due):
                return await self._queue.get()
        except TimeoutError:
            return _DUE

    async def _auto_checkpoint(self, *, final: bool) -> None:
        """Sign and store a checkpoint if the tree grew and one is due; a failure is logged, never raised
        (the records are committed; the next try may work)."""
        signer = self._schedule.signer
        if signer is None or not self._schedule.due(self._size, final=final):
            return
        try:
            await self._sign(signer)
        except LedgerError as exc:
            log.error("ledger.checkpoint_failed", url=self._name, size=self._size, error=str(exc))
            self._schedule.failed()

    async def _answer(self, futures: Sequence[asyncio.Future[Any]], work: Any) -> None:
        """Run one unit of work and hand its outcome (a list, one per future, or one error) to the callers."""
        try:
            outcomes = await work
        except LedgerError as exc:
            outcomes = [exc] * len(futures)
        except Exception as exc:  # a bug here must not leave callers waiting
            log.exception("ledger.writer_failed", url=self._name)
            outcomes = [LedgerError(f"{self._name}: ledger writer failed ({exc})")] * len(futures)
        deliver(list(zip(futures, outcomes, strict=True)))

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect_async(self._url, self._name)
            log.info("ledger.reconnected", url=self._name)
        return self._conn

    async def _locked_head(self, conn: psycopg.AsyncConnection[Any]) -> tuple[int, str]:
        """Lock the head row and bring the frontier up to it (records other writers appended)."""
        cur = await conn.execute("SELECT size, hash FROM head FOR UPDATE")
        size, digest = await cur.fetchone()  # type: ignore[misc]
        if size != self._frontier.size:
            cur = await conn.execute("SELECT hash FROM records WHERE seq > %s AND seq <= %s ORDER BY seq",
                                     (self._frontier.size, size))
            hashes = [bytes(h) for (h,) in await cur.fetchall()]
            if len(hashes) != size - self._frontier.size:
                raise LedgerError(f"{self._name}: records {self._frontier.size + 1}..{size} are missing")
            self._frontier.extend(hashes)
            self._size, self._hash = size, bytes(digest).hex()
        return size, bytes(digest).hex() if size else GENESIS_PREV

    async def _commit(self, batch: list[_Pending]) -> list[Appended]:
        rows: list[tuple[Any, ...]] = []
        rules: list[tuple[int, str]] = []
        hashes: list[bytes] = []
        results: list[Appended] = []
        first = 0
        try:
            conn = await self._connection()
            async with conn.transaction():
                seq, prev = await self._locked_head(conn)
                first = seq + 1
                for item in batch:
                    seq += 1
                    body = record_bytes(item.entry, prev, seq)
                    digest = hashlib.sha256(b"\x00" + body).digest()
                    prev = digest.hex()
                    f = item.fields
                    rows.append((seq, digest, body, f.time, f.principal, f.tool, f.decision, f.status,
                                 f.request_id, f.policy_version))
                    rules.extend((seq, rule) for rule in item.rules)
                    hashes.append(digest)
                    results.append(Appended(seq, prev))
                grown = self._frontier.copy()
                subtrees = grown.extend_collecting(hashes)
                if not self._subtrees:  # an older ledger the owner has not completed yet
                    subtrees = []
                async with conn.cursor() as cur:
                    await cur.executemany(INSERT_RECORD, rows)
                    if rules:
                        await cur.executemany(INSERT_RULE, rules)
                    for item, done in zip(batch, results, strict=True):
                        if item.linked is not None:
                            await cur.execute(item.linked.sql, (*item.linked.params, done.seq, done.hash))
                    if subtrees:
                        await cur.executemany(INSERT_SUBTREE, subtrees)
                    await cur.execute("UPDATE head SET size = %s, hash = %s", (seq, hashes[-1]))
        except psycopg.Error as exc:
            await self._drop_connection()
            log.error("ledger.batch_failed", url=self._name, first_seq=first, count=len(batch), error=_first_line(exc))
            self.stats.failed()
            raise LedgerError(f"{self._name}: {len(batch)} record(s) were not committed ({_first_line(exc)})") from None
        self.stats.committed(time.perf_counter(), [item.queued for item in batch])
        self._frontier = grown
        self._size, self._hash = seq, prev
        log.debug("ledger.batch_committed", url=self._name, first_seq=first, count=len(batch))
        return results

    async def _sign(self, signer: CheckpointSigner) -> list[str]:
        """Sign the ledger's head (locked, so all writers' records) and store the note, stamped with the size of
        the newest stored one (`checkpoint_to_store`); one-item list for `_answer`."""
        try:
            conn = await self._connection()
            async with conn.transaction():
                size, _ = await self._locked_head(conn)  # every writer stores its checkpoints under this lock
                cur = await conn.execute("SELECT size, note FROM checkpoints ORDER BY size DESC LIMIT 1")
                latest = await cur.fetchone()
                note, created_at = checkpoint_to_store(signer, size, self._frontier.root(), latest)
                if created_at is not None:
                    await conn.execute(INSERT_CHECKPOINT, (size, note, created_at))
        except psycopg.Error as exc:
            await self._drop_connection()
            raise LedgerError(f"{self._name}: the checkpoint was not stored ({_first_line(exc)})") from None
        self._schedule.signed(size)
        log.info("ledger.checkpoint_signed", size=size, origin=signer.origin, key_name=signer.key_name)
        return [note]

    async def _drop_connection(self) -> None:
        """Forget the connection after a failure so the next batch reconnects: it may be dead, or
        carry session settings the administrator has changed since (`default_transaction_read_only`)."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None


class PostgresLedgerReader(contextlib.AbstractContextManager["PostgresLedgerReader"]):
    """Read-only access to a PostgreSQL karma ledger; safe next to live writers. Closes on leaving `with`."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._name = display_url(url)
        self._conn = _connect(url, self._name)
        self._streams: psycopg.Connection[Any] | None = None
        self._cursor_ids = itertools.count(1)
        try:
            _prepare(self._conn, self._name, create=False)
        except psycopg.Error as exc:
            self._conn.close()
            raise LedgerError(f"{self._name}: cannot read the ledger ({_first_line(exc)})") from None
        except BaseException:
            self._conn.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._streams is not None:
            self._streams.close()
        self._conn.close()

    def size(self) -> int:
        """The highest seq stored; the record count when the ledger is intact."""
        return int(self._fetch("SELECT COALESCE(MAX(seq), 0) FROM records")[0][0])

    def iter_records(self, start: int = 1) -> Iterator[RawRecord]:
        """Yield (seq, hash bytes, record bytes) in seq order, READ_CHUNK rows at a time."""
        return self._read_ahead(_RECORDS_SQL, start)

    def iter_indexed(self, start: int = 1) -> Iterator[IndexedRaw]:
        """Yield (seq, hash, body, *indexed columns, rule rows) in seq order: `verify_ledger` checks
        the chain and the indexes in one pass over these (see `audit.store.IndexedRecordReader`)."""
        return self._read_ahead(_INDEXED_SQL, start)

    def index_suspects(self) -> Iterator[IndexedRecord]:
        """Records whose indexed columns or rule rows may disagree with their bytes, oldest first:
        those whose index row differs from what `quick_index` reads out of their bytes, or whose
        bytes it cannot read (the exact check decides)."""
        for row in self.iter_indexed():
            if quick_index(row[2]) != row[3:]:
                yield IndexedRecord(seq=row[0], body=row[2], fields=IndexFields(*row[3:-1]), rules=tuple(row[-1] or ()))

    def _read_ahead(self, sql: str, start: int) -> Iterator[Any]:
        """The rows of `sql` (paged by `after` and `limit`), in binary format (bytea as raw bytes,
        not hex); the next page is fetched on a second connection while the caller works through
        this one, so PostgreSQL and the network work beside Python."""
        with _connect(self._url, self._name) as ahead, ThreadPoolExecutor(1, "ledger-read-ahead") as pool:
            fetch = functools.partial(_fetch_binary, ahead, self._name, sql)
            pending = pool.submit(fetch, {"after": start - 1, "limit": READ_CHUNK})
            while True:
                rows = pending.result()
                if len(rows) == READ_CHUNK:
                    pending = pool.submit(fetch, {"after": rows[-1][0], "limit": READ_CHUNK})
                yield from rows
                if len(rows) < READ_CHUNK:
                    return

    def index_orphans(self) -> Iterator[tuple[Any, str]]:
        """(seq, rule id) of every rule-index row whose seq names no record, lowest seq first."""
        yield from self._fetch("SELECT x.seq, x.rule_id FROM record_rules x WHERE NOT EXISTS"
                               " (SELECT 1 FROM records r WHERE r.seq = x.seq) ORDER BY x.seq, x.rule_id")

    def get(self, seq: int) -> StoredRecord | None:
        rows = self._fetch("SELECT seq, hash, body FROM records WHERE seq = %s", (seq,))
        return StoredRecord(rows[0][0], bytes(rows[0][1]).hex(), bytes(rows[0][2])) if rows else None

    def latest_checkpoint(self) -> str | None:
        rows = self._fetch("SELECT note FROM checkpoints ORDER BY size DESC LIMIT 1")
        return str(rows[0][0]) if rows else None

    def checkpoints(self) -> list[tuple[int, str]]:
        """Every stored checkpoint as (size, note), smallest first."""
        return [(int(s), str(n)) for s, n in self._fetch("SELECT size, note FROM checkpoints ORDER BY size")]

    def checkpoint_rows(self) -> list[tuple[Any, Any, Any]]:
        """Every stored checkpoint row as stored, (size, note, created_at), smallest size first."""
        return self._fetch("SELECT size, note, created_at FROM checkpoints ORDER BY size")

    def meta_rows(self) -> list[tuple[Any, Any]]:
        """Every row of the `meta` table as stored, (key, value)."""
        return self._fetch("SELECT key, value FROM meta ORDER BY key")

    def head_rows(self) -> list[tuple[Any, Any, Any]]:
        """The rows of the `head` table as stored, (one, size, hash as bytes): exactly one in a ledger."""
        return _fetch_binary(self._conn, self._name, "SELECT one, size, hash FROM head", ())

    def leaf_hashes(self, size: int | None = None) -> list[bytes]:
        """The stored record hashes of seq 1..size (all when None)."""
        stop = self.size() if size is None else size
        return [bytes(h) for (h,) in self._fetch("SELECT hash FROM records WHERE seq <= %s ORDER BY seq", (stop,))]

    def leaf_range(self, lo: int, hi: int) -> list[bytes]:
        """The stored hashes of leaves lo..hi-1 (records lo+1..hi), in order."""
        return [h for (h,) in _fetch_binary(self._conn, self._name, "SELECT hash FROM records WHERE seq > %s AND seq <= %s"
                                            " ORDER BY seq", (lo, hi))]

    def subtree_hashes(self, height: int, lo: int, hi: int) -> list[bytes]:
        """The stored hashes of the subtrees lo..hi-1 of `height`, in order (fewer when some are
        not stored; none from a ledger that stores none)."""
        if not self._has_subtrees():
            return []
        return [h for (h,) in _fetch_binary(self._conn, self._name, "SELECT hash FROM subtrees WHERE height = %s"
                                            " AND idx >= %s AND idx < %s ORDER BY idx", (height, lo, hi))]

    def subtrees(self) -> Iterator[tuple[Any, Any, Any]]:
        """Every stored subtree row as (height, index, hash), by height then index."""
        if not self._has_subtrees():
            return iter(())
        return iter(_fetch_binary(self._conn, self._name, "SELECT height, idx, hash FROM subtrees ORDER BY height, idx", ()))

    def keeps_subtrees(self) -> bool:
        """Whether the ledger says it stores every complete subtree hash (so a missing one is tampering)."""
        return bool(self._fetch("SELECT 1 FROM meta WHERE key = %s", (SUBTREES_KEY,)))

    def _has_subtrees(self) -> bool:
        return self._fetch("SELECT to_regclass('subtrees')")[0][0] is not None

    def inclusion_proof(self, seq: int, size: int | None = None) -> list[bytes]:
        """Audit path of record `seq` in the tree of the first `size` records."""
        return merkle.inclusion_proof(self.leaf_hashes(size), seq - 1)

    def consistency_proof(self, old_size: int, size: int | None = None) -> list[bytes]:
        """Proof that the first `old_size` records are a prefix of the first `size`."""
        return merkle.consistency_proof(self.leaf_hashes(size), old_size)

    def select_records(self, where: RecordFilter) -> Iterator[RawRecord]:
        """Yield (seq, hash, body) of the records matching `where`, oldest first, via the indexes.

        Streamed through a server-side cursor, STREAM_CHUNK rows per round trip, so a page of a
        large ledger holds a bounded number of rows in memory. The cursors live in a transaction on
        a second connection: other reads (an outcome looked up per row) may run while one is open.
        """
        sql, params = _filter_sql(where)
        try:
            conn = self._stream_connection()
            with conn.cursor(name=f"dharma_select_{next(self._cursor_ids)}") as cur:
                cur.itersize = STREAM_CHUNK
                cur.execute(sql, params)
                for seq, digest, body in cur:
                    yield seq, bytes(digest), bytes(body)
        except psycopg.Error as exc:
            if self._streams is not None:
                self._streams.close()
                self._streams = None
            raise LedgerError(f"{self._name}: cannot read the ledger ({_first_line(exc)})") from None

    def _stream_connection(self) -> psycopg.Connection[Any]:
        if self._streams is None:
            self._streams = psycopg.connect(self._url, connect_timeout=CONNECT_TIMEOUT_S)
        return self._streams

    def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            raise LedgerError(f"{self._name}: cannot read the ledger ({_first_line(exc)})") from None


_INDEXED = tuple(field.name for field in dataclasses.fields(IndexFields))
_RECORDS_SQL = "SELECT seq, hash, body FROM records WHERE seq > %(after)s ORDER BY seq LIMIT %(limit)s"
# Each record with its indexed columns and its rule rows (sorted by code point, as Python sorts;
# duplicates kept; NULL when none: an empty array costs Python ~1 µs a row to build). The page is a seq range (its end found on the primary key first), so both
# tables are read in seq order and merged without a sort.
_PAGE_END = (
    "COALESCE((SELECT seq FROM records WHERE seq > %(after)s ORDER BY seq OFFSET %(limit)s - 1 LIMIT 1),"
    " (SELECT max(seq) FROM records))"
)
_INDEXED_SQL = (
    f"WITH page AS MATERIALIZED (SELECT {_PAGE_END} AS last),"
    " rr AS (SELECT seq, array_agg(rule_id ORDER BY rule_id COLLATE \"C\") AS rules FROM record_rules"
    " WHERE seq > %(after)s AND seq <= (SELECT last FROM page) GROUP BY seq)"
    f" SELECT r.seq, r.hash, r.body, {', '.join(f'r.{name}' for name in _INDEXED)}, rr.rules"
    " FROM records r LEFT JOIN rr ON rr.seq = r.seq"
    " WHERE r.seq > %(after)s AND r.seq <= (SELECT last FROM page) ORDER BY r.seq"
)


def _fetch_binary(conn: psycopg.Connection[Any], name: str, sql: str, params: Any) -> list[Any]:
    """All rows of one query in binary format (bytea arrives as bytes)."""
    try:
        return conn.execute(sql, params, binary=True).fetchall()
    except psycopg.Error as exc:
        raise LedgerError(f"{name}: cannot read the ledger ({_first_line(exc)})") from None


def _starts_with(prefix: str) -> tuple[str, str]:
    return "starts_with(r.tool, ?)", prefix


def _filter_sql(where: RecordFilter) -> tuple[str, list[Any]]:
    """SQLite's query with PostgreSQL's placeholders (the generated SQL holds no literal `?`)."""
    sql, params = filter_sql(where, _starts_with)
    return sql.replace("?", "%s"), params


WRITER_PRIVILEGES = {"meta": "SELECT", "head": "SELECT, UPDATE", "records": "SELECT, INSERT",
                     "record_rules": "SELECT, INSERT", "checkpoints": "SELECT, INSERT", "subtrees": "SELECT, INSERT"}
"""What the gateway's role may do: read, append, and move the one head row forward (its trigger
refuses a move back). `SELECT … FOR UPDATE` on the head needs UPDATE there."""
TRIGGER_FUNCTIONS = ("dharma_ledger_append_only()", "dharma_ledger_head_forward()")


def grant_roles(url: str, *, writer: str | None, readers: Sequence[str]) -> list[str]:
    """Make the ledger at `url` insert-only by privileges too, for a writer role and auditor roles.

    Run as the ledger's owner (or a superuser). Creates the ledger if the database is empty and
    each missing role (LOGIN, no password). Revokes everything on the ledger's tables, its schema's
    CREATE and the database's CONNECT and TEMP from PUBLIC and the roles, then grants `writer`
    WRITER_PRIVILEGES and each reader SELECT on every table (and both CONNECT and USAGE). Neither may
    own a table or be a superuser: an owner can disable the triggers, a superuser skips every check.
    Idempotent. Returns one line per action, for the operator.

    Raises:
        LedgerError: a role is the owner, a superuser, named twice, or the statements fail.
    """
    name = display_url(url)
    roles = [r for r in (writer, *readers) if r is not None]
    if not roles:
        raise LedgerError("name a --writer role, a --reader role or both")
    if len(set(roles)) != len(roles):
        raise LedgerError(f"a role is named twice ({', '.join(roles)}): the writer and each reader must be different roles")
    done: list[str] = []
    with _connect(url, name) as conn:
        try:
            _prepare(conn, name, create=True)
            _complete_derived(conn, name)  # as the owner: the writer role may not create them later
            with conn.transaction():
                _refuse_powerful_roles(conn, roles)
                done += _create_missing_roles(conn, roles)
                done += _apply_grants(conn, writer, list(readers))
        except psycopg.Error as exc:
            raise LedgerError(f"{name}: the grants were not applied ({_first_line(exc)})") from None
    log.info("ledger.grants_applied", url=name, writer=writer, readers=list(readers))
    return done


def _refuse_powerful_roles(conn: psycopg.Connection[Any], roles: list[str]) -> None:
    """Refuse a role that owns a ledger table, or is a member of its owner (it could disable the
    triggers), or is a superuser."""
    for (role,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper AND rolname = ANY(%s)", (roles,)):
        raise LedgerError(f"role {role} is a superuser, which no privilege or trigger binds: give the gateway and "
                          "the auditors ordinary roles")
    owners = conn.execute(
        "SELECT r.rolname, c.relname, pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_roles r ON r.rolname = ANY(%s)"
        " WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(%s)"
        " AND pg_has_role(r.oid, c.relowner, 'MEMBER') ORDER BY r.rolname, c.relname",
        (roles, [*LEDGER_TABLES, "head"]))
    for role, table, owner in owners:
        raise LedgerError(f"role {role} owns the ledger table {table} (or is a member of its owner {owner}), so it could "
                          "disable the append-only triggers: run `dharma audit grant` as the owner and give the gateway "
                          "and the auditors other roles")


def _create_missing_roles(conn: psycopg.Connection[Any], roles: list[str]) -> list[str]:
    existing = {r for (r,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (roles,))}
    created = []
    for role in roles:
        if role not in existing:
            conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(role)))
            created.append(f"created role {role} (LOGIN, no password: set one with ALTER ROLE … PASSWORD, or use the server's auth)")
    return created


def _apply_grants(conn: psycopg.Connection[Any], writer: str | None, readers: list[str]) -> list[str]:
    """REVOKE everything from PUBLIC and the roles, then GRANT each role exactly its part."""
    ident, sql_ = psycopg.sql.Identifier, psycopg.sql.SQL
    roles = [r for r in (writer, *readers) if r is not None]
    who = sql_(", ").join([sql_("PUBLIC"), *(ident(r) for r in roles)])
    listed = sql_(", ").join(ident(r) for r in roles)
    schema = ident(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
    database = ident(conn.execute("SELECT current_database()").fetchone()[0])  # type: ignore[index]
    tables = sql_(", ").join(ident(t) for t in (*LEDGER_TABLES, "head"))
    statements = [
        sql_("REVOKE ALL ON TABLE {} FROM {}").format(tables, who),
        *(sql_("REVOKE ALL ON FUNCTION {} FROM {}").format(sql_(f), who) for f in TRIGGER_FUNCTIONS),
        sql_("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema, who),
        sql_("REVOKE ALL ON DATABASE {} FROM {}").format(database, who),
        sql_("GRANT CONNECT ON DATABASE {} TO {}").format(database, listed),
        sql_("GRANT USAGE ON SCHEMA {} TO {}").format(schema, listed),
    ]
    done = [f"revoked every privilege on the ledger's tables, CREATE on its schema and CONNECT, TEMP on "
            f"{conn.info.dbname} from PUBLIC and {', '.join(roles)}"]
    if writer is not None:
        for table, privileges in WRITER_PRIVILEGES.items():
            statements.append(sql_("GRANT {} ON TABLE {} TO {}").format(sql_(privileges), ident(table), ident(writer)))
        done.append(f"writer {writer}: " + "; ".join(f"{p} on {t}" for t, p in WRITER_PRIVILEGES.items()))
    for reader in readers:
        statements.append(sql_("GRANT SELECT ON TABLE {} TO {}").format(tables, ident(reader)))
        done.append(f"auditor {reader}: SELECT on {', '.join((*LEDGER_TABLES, 'head'))}")
    for statement in statements:
        conn.execute(statement)
    return done


def migrate_ledger(source: LedgerReader, source_name: str, url: str) -> VerifyReport:
    """Copy a verified ledger record by record (bytes unchanged) into an empty PostgreSQL ledger.

    The source is verified first (a damaged ledger is not copied), the copy is one transaction,
    and the copy is verified afterwards: it must have the source's size and root.

    Raises:
        LedgerError: the source does not verify, the destination is not empty or not reachable,
            or the copy does not match.
    """
    name = display_url(url)
    before = verify_ledger(source)
    if not before.ok:
        where = f" at seq {before.first_bad_seq}" if before.first_bad_seq is not None else ""
        raise LedgerError(f"{source_name} does not verify{where} ({before.problem}); nothing was copied")
    with _connect(url, name) as conn:
        try:
            _prepare(conn, name, create=True)
            with conn.transaction():
                size = conn.execute("SELECT size FROM head FOR UPDATE").fetchone()[0]  # type: ignore[index]
                if size:
                    raise LedgerError(f"{name} already holds {size} records; migrate only into an empty ledger")
                last = _copy_records(conn, source.iter_records())
                for cp_size, note, created_at in source.checkpoint_rows():
                    conn.execute(INSERT_CHECKPOINT, (cp_size, note, created_at))
                if last is not None:
                    conn.execute("UPDATE head SET size = %s, hash = %s", last)
        except psycopg.Error as exc:
            raise LedgerError(f"{name}: the copy was not committed ({_first_line(exc)})") from None
    with PostgresLedgerReader(url) as copied:
        after = verify_ledger(copied)
    if not after.ok or (after.size, after.root) != (before.size, before.root):
        raise LedgerError(f"{name}: the copy does not match {source_name} ({after.problem or 'size or root differ'})")
    log.info("ledger.migrated", source=source_name, url=name, size=after.size)
    return after


def _copy_records(conn: psycopg.Connection[Any], records: Iterator[RawRecord]) -> tuple[int, bytes] | None:
    """Insert records as they are, with the columns and rule rows derived from their bytes and the
    subtree hashes they complete."""
    last: tuple[int, bytes] | None = None
    rows: list[tuple[Any, ...]] = []
    rules: list[tuple[int, str]] = []
    frontier = CompactRange()

    def flush() -> None:
        subtrees = frontier.extend_collecting([row[1] for row in rows])
        with conn.cursor() as cur:
            cur.executemany(INSERT_RECORD, rows)
            if rules:
                cur.executemany(INSERT_RULE, rules)
            if subtrees:
                cur.executemany(INSERT_SUBTREE, subtrees)
        rows.clear()
        rules.clear()

    for seq, digest, body in records:
        entry = json.loads(parse_record(body).entry)
        f = index_fields(entry)
        rows.append((seq, digest, body, f.time, f.principal, f.tool, f.decision, f.status, f.request_id,
                     f.policy_version))
        rules.extend((seq, rule) for rule in rule_ids(entry))
        last = (seq, digest)
        if len(rows) >= READ_CHUNK:
            flush()
    if rows:
        flush()
    return last
