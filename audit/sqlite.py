"""The karma ledger on SQLite: `SqliteLedger`, one writer thread doing group commit.

`SqliteLedger` is the single writer of a ledger file (an exclusive flock on `<path>.lock`
enforces that across processes). Callers canonicalise their entry in their own thread and
queue it; the writer thread takes whatever is queued (up to `batch_max`, optionally
waiting `batch_wait_ms` for more), assigns seq and prev, inserts the batch in one
`BEGIN IMMEDIATE … COMMIT`, advances its in-memory head, and only then answers the
callers. A failed commit fails the whole batch and leaves the head where it was.

A lone append on an idle ledger skips the hand-off: when nothing is queued, no other append is in
flight, the writer lock is free and recent commits were fast (`inline_max_ms`), the caller's thread
commits it itself, holding the lock the writer thread holds per batch (the same statements, sync,
head, stats and failure; two cross-thread wake-ups saved, ~120-170 µs of CPU a governed call on a
2-core VM). Appends that overlap go to the writer thread and are grouped as before; every
`INLINE_PROBE`-th idle append goes there too, which is how callers that became concurrent are seen.

The WAL is checkpointed (copied back into the database file) by the writer thread alone, never
inside a commit: the connection's automatic checkpoint is off, and the writer runs a PASSIVE one
once the commits since the last would have filled about `WAL_CHECKPOINT_FRAMES` pages (SQLite's own
default threshold), counting the pages a commit wrote in the last interval. So a caller's thread
committing inline never copies pages or syncs the database file, and no commit waits for a checkpoint.

Given a `CheckpointSigner`, the writer also signs and stores checkpoints on its own: after a
batch commits once `checkpoint_interval` seconds passed since the last one, when the queue
stays idle that long with records not yet covered, and on close; never when the tree did not
grow. So every committed record is under a stored signed checkpoint within about a second.

It never writes to a file that is not already a ledger, except a new or empty one (the checks
are in `audit.sqlite_files`). Reading is `audit.sqlite_read`'s `SqliteLedgerReader`, also
importable from here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anyio.to_thread
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import CheckpointSchedule, CheckpointSigner, checkpoint_to_store
from audit.errors import LedgerError
from audit.stats import AppendStats
from audit.merkle import SUBTREE_STRIDE, CompactRange, CompletedSubtree
from audit.records import (
    FORMAT,
    SUBTREES_KEY,
    Appended,
    encode_entry,
    index_row,
    record_bytes,
    rule_ids,
)
from audit.sqlite_files import (
    DROP_RETIRED,
    SCHEMA,
    SECONDARY_STATEMENTS,
    SUBTREES_STATEMENTS,
    WriterLock,
    check_format,
    inspect_file,
    rebuild_head,
)
from audit.sqlite_read import SqliteLedgerReader  # noqa: F401  (importable from here, as before)

log = structlog.get_logger()

Synchronous = Literal["FULL", "NORMAL"]

RECORD_COLUMNS = "seq, hash, body, time, principal, tool, decision, status, request_id, policy_version"
INSERT_CHUNK = 1000
WAIT_SLICE = 0.0002
SQLITE_MAX_PAGES = 4294967294
"""SQLite's own largest `max_page_count` (the default since 3.45)."""
INLINE_MAX_MS = 2.0
"""Default bound on the recent commit time (ms) under which an idle ledger commits a lone append in the
caller's thread: a slower disk would stall the caller's event loop, so it goes to the writer thread."""
INLINE_QUIET = 4
"""Threaded appends in a row that overlapped no other append before appends may run inline again."""
INLINE_PROBE = 32
"""Every this many inline-eligible appends, one goes to the writer thread anyway: inline appends never
overlap, so this is how callers that became concurrent are noticed (and grouped again)."""
COMMIT_EWMA = 0.25
"""Weight of the newest commit in the ledger's running commit time."""
WAL_CHECKPOINT_FRAMES = 1000
"""WAL pages after which the writer thread checkpoints (SQLite's default `wal_autocheckpoint`)."""
WAL_FRAMES_PER_COMMIT = 8.0
"""First estimate of the WAL pages one commit writes (a record, its indexes), until measured."""


@functools.cache
def _insert_sql(rows: int) -> str:
    """One INSERT of `rows` records."""
    row = "(" + ",".join("?" * (RECORD_COLUMNS.count(",") + 1)) + ")"
    return f"INSERT INTO records({RECORD_COLUMNS}) VALUES {','.join([row] * rows)}"


INSERT_RULE = "INSERT INTO record_rules(seq, rule_id) VALUES (?, ?)"
INSERT_SUBTREE = "INSERT INTO subtrees(height, idx, hash) VALUES (?, ?, ?)"
INSERT_CHECKPOINT = (
    "INSERT INTO checkpoints(size, note, created_at) VALUES (?, ?, ?) ON CONFLICT(size) DO NOTHING"
)


class _Head:
    """The committed head: size, last record hash and the frontier behind it (never mutated).

    The Merkle root is computed on first read and kept: only a checkpoint or a head read needs it,
    not each commit. Safe to read from any thread (a race computes the same bytes twice).
    """

    __slots__ = ("size", "hash", "frontier", "_root")

    def __init__(self, size: int, hash: str, frontier: CompactRange) -> None:
        self.size, self.hash, self.frontier = size, hash, frontier
        self._root: bytes | None = None

    @property
    def root(self) -> bytes:
        root = self._root
        if root is None:
            root = self._root = self.frontier.root()
        return root


class _Wakeup:
    """How the writer thread hands its answers to one event loop: it queues `(future, outcome)` pairs
    here and bumps an eventfd the loop watches; the loop, woken, reads the eventfd once and resolves
    every pair queued so far (one wake-up per batch, as before).

    On asyncio's selector loops this is cheaper than `loop.call_soon_threadsafe`, which allocates a
    handle, takes a lock and wakes the loop through its self-pipe socket (a send, then two receives):
    about 10 µs less process CPU per wake, two wakes a governed call. Other loops keep
    `call_soon_threadsafe`: uvloop's already wakes through an eventfd of its own (measured: no gain),
    and a loop that cannot watch one (no `os.eventfd`, no `add_reader`) has no other way.
    """

    __slots__ = ("loop", "fd", "pairs", "lock")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()  # the writer's write and a discard from a loop's thread never cross
        self.pairs: collections.deque[tuple[asyncio.Future[Any], Any]] = collections.deque()
        self.fd: int | None = None
        if hasattr(os, "eventfd") and isinstance(loop, asyncio.SelectorEventLoop):
            fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            try:
                loop.add_reader(fd, self.drain)
            except NotImplementedError:
                os.close(fd)
            else:
                self.fd = fd

    def post(self, pairs: list[tuple[asyncio.Future[Any], Any]]) -> None:
        """Hand `pairs` to the loop (any thread).

        Raises:
            RuntimeError: the loop is closed: nobody is left to wait for them.
        """
        with self.lock:
            if self.fd is not None:
                if self.loop.is_closed():
                    raise RuntimeError("Event loop is closed")
                self.pairs.extend(pairs)
                os.eventfd_write(self.fd, 1)  # after the pairs are queued: a drain that reads it finds them
                return
        self.loop.call_soon_threadsafe(deliver, pairs)

    def drain(self) -> None:
        """Resolve every queued pair (the loop's thread). The eventfd is read before the queue is
        emptied, so pairs queued meanwhile are either taken now or wake the loop again."""
        if self.fd is not None:  # None: closed while this callback was already queued
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self.fd)
        pairs, ready = self.pairs, []
        while pairs:
            ready.append(pairs.popleft())
        deliver(ready)

    def discard(self) -> None:
        """Close the eventfd of a loop that is closed (its selector watches nothing any more)."""
        with self.lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None

    def close(self) -> None:
        """Resolve what is queued, stop watching the eventfd and close it (the loop's thread)."""
        if self.fd is None:
            return
        self.drain()
        self.loop.remove_reader(self.fd)
        self.discard()


@dataclass(frozen=True, slots=True)
class _Pending:
    entry: bytes
    fields: tuple[str | None, ...]  # the index columns, `index_row(entry)`
    rules: tuple[str, ...]  # the rule index's rows, `rule_ids(entry)`
    future: asyncio.Future[Appended]
    wakeup: _Wakeup
    queued: float = 0.0  # perf_counter when appended: the append lag /metrics reports


@dataclass(frozen=True, slots=True)
class _CheckpointRequest:
    private_key: Ed25519PrivateKey
    key_name: str
    origin: str
    future: asyncio.Future[str]
    wakeup: _Wakeup


class _Stop:
    pass


class _Tick:
    """Wakes an idle writer after inline commits: it recomputes when the next periodic checkpoint
    falls due (it slept with no deadline), and checkpoints the WAL if that is due."""


_Item = _Pending | _CheckpointRequest | _Stop | _Tick


@dataclass(slots=True)
class _Inline:
    """A lone append committed in its caller's thread (`_commit` reads only these fields; not frozen:
    it lives for one commit, and a frozen dataclass's init costs a `object.__setattr__` per field)."""

    entry: bytes
    fields: tuple[str | None, ...]
    rules: tuple[str, ...]
    queued: float


class SqliteLedger:
    """The one writer of a SQLite karma ledger. Build it with `await SqliteLedger.open(...)`."""

    def __init__(
        self,
        path: Path,
        conn: sqlite3.Connection,
        lock: WriterLock,
        frontier: CompactRange,
        head_hash: str,
        *,
        batch_max: int,
        batch_wait_ms: float,
        checkpointed_size: int = 0,
        signer: CheckpointSigner | None = None,
        checkpoint_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        inline_max_ms: float = INLINE_MAX_MS,
    ) -> None:
        self._path = path
        self._conn = conn
        self._lock = lock
        self._head = _Head(frontier.size, head_hash, frontier)
        self._batch_max = batch_max
        self.stats = AppendStats()  # append lag and batch sizes, for /metrics
        self._batch_wait = batch_wait_ms / 1000.0
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._gate = threading.Lock()
        self._closed = False
        self._wakeups: dict[asyncio.AbstractEventLoop, _Wakeup] = {}
        self._schedule = CheckpointSchedule(signer, checkpoint_interval, clock, checkpointed_size)
        self._thread = threading.Thread(target=self._run, name=f"karma-ledger:{path.name}", daemon=True)
        self._writing = threading.Lock()  # held by whoever commits: the writer thread per batch, or an inline append
        self._inline_max = inline_max_ms / 1000.0
        self._commit_time = 0.0  # running (EWMA) seconds of a commit's write + sync, any thread
        self._threaded = 0  # threaded appends in flight (all loops)
        self._started = 0  # threaded appends started so far
        self._quiet = 0  # threaded appends in a row that overlapped no other
        self._eligible = 0  # appends that found the ledger idle (counts the probes)
        self.inline_appends = 0  # appends committed (or tried) in their caller's thread
        self._wal_commits = 0  # commits since the last WAL checkpoint (under `_writing`)
        self._wal_frames = WAL_FRAMES_PER_COMMIT  # WAL pages a commit writes, as last measured
        self._wal_restarted = False  # the last WAL checkpoint was complete: the WAL starts again
        self._wal_nudged = False  # a `_Tick` is queued for a due WAL checkpoint (under `_writing`)
        self.wal_checkpoints = 0

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        batch_max: int = 256,
        batch_wait_ms: float = 0.0,
        checkpoint_signer: CheckpointSigner | None = None,
        checkpoint_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        inline_max_ms: float = INLINE_MAX_MS,
    ) -> SqliteLedger:
        """Open (or create) the ledger at `path`, take its writer lock and start the writer.

        `synchronous="NORMAL"` is faster but may lose the last commits on power loss (never
        corrupts). `batch_wait_ms` > 0 waits that long for more entries once one is queued:
        larger batches, more latency. With 0, batches form from whatever queued meanwhile.
        `checkpoint_signer` turns on periodic checkpoints (every `checkpoint_interval`
        seconds of `clock` while the tree grows, and on close). A lone append on an idle ledger is
        committed in the caller's thread (no hand-off to the writer thread) while the recent commit
        time stays under `inline_max_ms` (0: never).

        Raises:
            LedgerLocked: another writer holds the ledger.
            NotALedger: the file is something else (it is left untouched).
            LedgerError: the path cannot be used (directory, permissions, damaged ledger).
        """
        if synchronous not in ("FULL", "NORMAL"):
            raise LedgerError(f"{path}: synchronous must be FULL or NORMAL, not {synchronous!r}")
        if batch_max < 1 or batch_wait_ms < 0 or checkpoint_interval <= 0 or inline_max_ms < 0:
            raise LedgerError(f"{path}: batch_max must be >= 1, batch_wait_ms >= 0, checkpoint_interval > 0"
                              " and inline_max_ms >= 0")
        opener = functools.partial(
            cls._open_sync, Path(path), synchronous, batch_max=batch_max, batch_wait_ms=batch_wait_ms,
            signer=checkpoint_signer, checkpoint_interval=checkpoint_interval, clock=clock,
            inline_max_ms=inline_max_ms,
        )
        ledger = await anyio.to_thread.run_sync(opener)
        ledger._thread.start()
        return ledger

    @classmethod
    def _open_sync(
        cls, path: Path, synchronous: Synchronous, *, batch_max: int, batch_wait_ms: float,
        signer: CheckpointSigner | None, checkpoint_interval: float, clock: Callable[[], float],
        inline_max_ms: float,
    ) -> SqliteLedger:
        inspect_file(path)  # refuse a foreign file before leaving a lock file next to it
        lock = WriterLock(path)
        lock.acquire()
        try:
            conn = _open_writer(path, synchronous)
            try:
                frontier, head_hash = rebuild_head(conn, path)
                _store_missing_subtrees(conn, path)
                checkpointed = int(conn.execute("SELECT COALESCE(MAX(size), 0) FROM checkpoints").fetchone()[0])
            except BaseException:
                conn.close()
                raise
        except BaseException:
            lock.release()
            raise
        log.info("ledger.opened", path=str(path), size=frontier.size, synchronous=synchronous)
        return cls(path, conn, lock, frontier, head_hash, batch_max=batch_max, batch_wait_ms=batch_wait_ms,
                   checkpointed_size=checkpointed, signer=signer, checkpoint_interval=checkpoint_interval,
                   clock=clock, inline_max_ms=inline_max_ms)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def size(self) -> int:
        """Number of committed records (the seq of the last one)."""
        return self._head.size

    @property
    def head_hash(self) -> str:
        """Record hash (hex) of the last committed record; 64 zeros when empty."""
        return self._head.hash

    def root(self) -> bytes:
        """Merkle root over all committed records."""
        return self._head.root

    def limit_pages(self, pages: int | None) -> int:
        """Cap the ledger file at `pages` database pages (SQLite's `max_page_count` on the writer's
        connection; None lifts the cap); return the cap in force, never below the file's size.

        An append that needs more fails with SQLITE_FULL exactly as on a full disk: its batch is
        not committed and its callers fail closed. Tests use it to run out of space for real.
        """
        cap = SQLITE_MAX_PAGES if pages is None else max(1, int(pages))
        return int(self._conn.execute(f"PRAGMA max_page_count = {cap}").fetchone()[0])

    async def append(self, entry: Mapping[str, Any]) -> Appended:
        """Record one entry; return its seq and hash once it is committed.

        The entry is canonicalised here, in the caller's thread, so a bad entry fails only
        its caller. If the caller is cancelled after queueing, the record is still written.

        Raises:
            LedgerError: the entry is not canonical JSON, the ledger is closed, or the batch
                holding it could not be committed (then nothing of that batch was written).
        """
        encoded, fields, rules = encode_entry(entry, ledger=str(self._path)), index_row(entry), rule_ids(entry)
        if self._threaded == 0 and self._quiet >= INLINE_QUIET and self._commit_time < self._inline_max:
            self._eligible += 1
            if self._eligible % INLINE_PROBE and self._queue.empty() and self._writing.acquire(blocking=False):
                try:
                    return self._append_inline(_Inline(encoded, fields, rules, time.perf_counter()))
                finally:
                    self._writing.release()
        loop = asyncio.get_running_loop()
        item = _Pending(
            encoded, fields, rules, loop.create_future(), self._wakeups.get(loop) or self._wakeup(loop),
            time.perf_counter(),
        )
        overlapped, started = self._threaded > 0, self._started
        self._threaded += 1
        self._started = started + 1
        try:
            self._submit(item)
            return await item.future
        finally:
            self._threaded -= 1
            if overlapped or self._started != started + 1 or self._threaded:
                self._quiet = 0
            else:
                self._quiet += 1

    def _append_inline(self, item: _Inline) -> Appended:
        """Commit one record in the caller's thread, holding the writer lock (the writer thread is idle).

        The same commit as a batch of one: same statements, one transaction, the same sync, head, stats
        and failure (nothing written, `LedgerError`). The periodic checkpoint stays the writer thread's:
        it is woken when this record is the first one not yet covered.
        """
        if self._closed:
            raise LedgerError(f"{self._path}: the ledger is closed")
        self.inline_appends += 1
        try:
            outcome = self._commit([item])[0]
        except Exception as exc:  # a bug here must fail this call closed, as the writer thread does
            log.exception("ledger.writer_failed", path=str(self._path))
            raise LedgerError(f"{self._path}: ledger writer failed ({exc})") from exc
        if isinstance(outcome, BaseException):
            raise outcome
        schedule = self._schedule
        wal_due = not self._wal_nudged and self._wal_due()
        if wal_due or (schedule.signer is not None and outcome.seq == schedule.checkpointed_size + 1):
            self._wal_nudged = self._wal_nudged or wal_due
            self._queue.put(_Tick())
        return outcome

    async def checkpoint(self, private_key: Ed25519PrivateKey, key_name: str, origin: str) -> str:
        """Sign the current head as a C2SP checkpoint, store it and return the note."""
        loop = asyncio.get_running_loop()
        request = _CheckpointRequest(
            private_key, key_name, origin, loop.create_future(), self._wakeups.get(loop) or self._wakeup(loop)
        )
        self._submit(request)
        return await request.future

    def _wakeup(self, loop: asyncio.AbstractEventLoop) -> _Wakeup:
        """The running loop's `_Wakeup`, made on its first append; those of loops closed since are
        dropped, so a ledger that outlives many loops keeps no descriptor for the dead ones."""
        with self._gate:
            if self._closed:
                raise LedgerError(f"{self._path}: the ledger is closed")
            for gone in [other for other in self._wakeups if other.is_closed()]:
                self._wakeups.pop(gone).discard()
            wakeup = self._wakeups[loop] = _Wakeup(loop)
        return wakeup

    async def aclose(self) -> None:
        """Commit everything queued, stop the writer thread and release the writer lock."""
        with self._gate:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_Stop())
        await anyio.to_thread.run_sync(self._thread.join)
        self._close_wakeups()
        self._lock.release()
        log.info("ledger.closed", path=str(self._path), size=self._head.size, inline=self.inline_appends)

    def _close_wakeups(self) -> None:
        """Close every loop's eventfd once the writer has stopped, each in its own loop's thread
        after it resolved the answers still queued (a closed loop's callers are gone)."""
        running = asyncio.get_running_loop()
        for loop, wakeup in self._wakeups.items():
            if loop is running:
                wakeup.close()
                continue
            try:
                loop.call_soon_threadsafe(wakeup.close)
            except RuntimeError:  # the loop is closed, and its selector with it
                wakeup.discard()
        self._wakeups.clear()

    def _submit(self, item: _Item) -> None:
        with self._gate:
            if self._closed:
                raise LedgerError(f"{self._path}: the ledger is closed")
            self._queue.put(item)

    def _run(self) -> None:
        try:
            while True:
                batch, command = self._next_batch()
                with self._writing:
                    try:
                        if batch:
                            _settle(batch, self._commit(batch))
                        if isinstance(command, _CheckpointRequest):
                            self._sign(command)
                        self._auto_checkpoint(final=isinstance(command, _Stop))
                        if self._wal_due():
                            self._checkpoint_wal()
                    except Exception as exc:  # a bug in this thread must not leave callers waiting
                        log.exception("ledger.writer_failed", path=str(self._path))
                        waiting: list[_Pending | _CheckpointRequest] = list(batch)
                        if isinstance(command, _CheckpointRequest):
                            waiting.append(command)
                        _settle(waiting, [LedgerError(f"{self._path}: ledger writer failed ({exc})") for _ in waiting])
                if isinstance(command, _Stop):
                    break
        finally:
            with self._writing:
                self._conn.close()

    def _next_batch(self) -> tuple[list[_Pending], _CheckpointRequest | _Stop | _Tick | None]:
        """Block for one item, let more arrive for up to batch_wait, then drain the queue.

        The wait polls the queue size while sleeping rather than taking items one by one,
        so producers are not interrupted by a writer waking up for every entry.
        """
        first = self._first_item()
        if first is None:
            return [], None
        if not isinstance(first, _Pending):
            return [], first
        if self._batch_wait > 0:
            deadline = time.monotonic() + self._batch_wait
            while self._queue.qsize() < self._batch_max - 1 and (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, WAIT_SLICE))
        batch = [first]
        while len(batch) < self._batch_max:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, _Pending):
                return batch, item
            batch.append(item)
        return batch, None

    def _first_item(self) -> _Item | None:
        """Block for the next item; None once a periodic checkpoint falls due while idle."""
        due = self._schedule.wait_for(self._head.size)
        if due is None:
            return self._queue.get()
        try:
            return self._queue.get(timeout=due)
        except queue.Empty:
            return None

    def _auto_checkpoint(self, *, final: bool) -> None:
        """Sign and store a checkpoint if the tree grew and one is due (always when `final`)."""
        schedule, head = self._schedule, self._head
        if schedule.signer is None or not schedule.due(head.size, final=final):
            return
        signer = schedule.signer
        try:
            self._store_checkpoint(head, signer)
        except (LedgerError, sqlite3.Error) as exc:  # the records are committed; the next try may work
            log.error("ledger.checkpoint_failed", path=str(self._path), size=head.size, error=str(exc))
            schedule.failed()
            return
        log.debug("ledger.checkpoint_signed", size=head.size, origin=signer.origin, periodic=not final)

    def _wal_due(self) -> bool:
        return self._wal_commits * self._wal_frames >= WAL_CHECKPOINT_FRAMES

    def _checkpoint_wal(self) -> None:
        """Copy the WAL back into the database file (PASSIVE: never waits for readers), in the
        writer thread holding `_writing`, and re-measure the pages a commit writes from the WAL's
        size when it had started again after the previous complete checkpoint."""
        commits, self._wal_commits, self._wal_nudged = self._wal_commits, 0, False
        try:
            _, frames, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:  # committed records are safe in the WAL; the next one may work
            log.warning("ledger.wal_checkpoint_failed", path=str(self._path), error=str(exc))
            return
        self.wal_checkpoints += 1
        if self._wal_restarted and frames > 0:
            self._wal_frames = max(1.0, frames / commits)
        self._wal_restarted = frames == copied
        log.debug("ledger.wal_checkpointed", frames=frames, copied=copied, per_commit=round(self._wal_frames, 1))

    def _store_checkpoint(self, head: _Head, signer: CheckpointSigner) -> str:
        """Sign the head and store the note, stamped with the size of the newest stored one before it
        (`checkpoint_to_store`: the stored note when this signer already stored one of this size)."""
        latest = self._conn.execute("SELECT size, note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
        note, created_at = checkpoint_to_store(signer, head.size, head.root, latest)
        if created_at is not None:
            self._conn.execute(INSERT_CHECKPOINT, (head.size, note, created_at))
        self._schedule.signed(head.size)
        return note

    def _commit(self, batch: Sequence[_Pending | _Inline]) -> list[Appended | BaseException]:
        """Commit `batch` (the caller holds `_writing`); return each record's outcome, the same
        `LedgerError` for all when nothing was written."""
        started = time.perf_counter()
        head = self._head
        seq, prev = head.size, head.hash
        rows: list[tuple[Any, ...]] = []
        rules: list[tuple[int, str]] = []
        hashes: list[bytes] = []
        results: list[Appended | BaseException] = []
        sha256 = hashlib.sha256
        for item in batch:
            seq += 1
            body = record_bytes(item.entry, prev, seq)
            digest = sha256(b"\x00" + body).digest()
            prev = digest.hex()
            rows.append((seq, digest, body, *item.fields))
            if item.rules:
                rules.extend((seq, rule) for rule in item.rules)
            hashes.append(digest)
            results.append(Appended(seq, prev))
        grown = head.frontier.copy()
        subtrees = grown.extend_collecting(hashes)
        writing = time.perf_counter()
        try:
            self._write(rows, rules, subtrees)
        except sqlite3.Error as exc:
            message = f"{self._path}: records {head.size + 1}..{seq} were not committed ({exc})"
            log.error("ledger.batch_failed", path=str(self._path), first_seq=head.size + 1, count=len(batch),
                      error=str(exc))
            self.stats.failed()
            return [LedgerError(message) for _ in batch]
        now = time.perf_counter()
        self._commit_time += (now - writing - self._commit_time) * COMMIT_EWMA
        self._wal_commits += 1
        self.stats.committed(now, [item.queued for item in batch])
        self._head = _Head(seq, prev, grown)
        log.debug("ledger.batch_committed", first_seq=head.size + 1, count=len(batch),
                  ms=round((time.perf_counter() - started) * 1000, 3))
        return results

    def _write(
        self, rows: Sequence[tuple[Any, ...]], rules: list[tuple[int, str]], subtrees: list[CompletedSubtree]
    ) -> None:
        """Insert a batch, its rule index rows (seq order, each record's in `rule_ids` order: the
        rowid order readers group by) and the subtree hashes it completes in one transaction (one
        commit, one WAL sync)."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            for start in range(0, len(rows), INSERT_CHUNK):
                chunk = rows[start : start + INSERT_CHUNK]
                conn.execute(_insert_sql(len(chunk)), [value for row in chunk for value in row])
            if rules:
                conn.executemany(INSERT_RULE, rules)
            if subtrees:
                conn.executemany(INSERT_SUBTREE, subtrees)
            conn.execute("COMMIT")
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _sign(self, request: _CheckpointRequest) -> None:
        head = self._head
        outcome: str | BaseException
        try:
            signer = CheckpointSigner(request.private_key, request.key_name, request.origin)
            outcome = self._store_checkpoint(head, signer)
            log.info("ledger.checkpoint_signed", size=head.size, origin=request.origin, key_name=request.key_name)
        except LedgerError as exc:
            outcome = LedgerError(f"{self._path}: {exc}")
        except sqlite3.Error as exc:
            outcome = LedgerError(f"{self._path}: checkpoint at size {head.size} was not stored ({exc})")
        _settle([request], [outcome])


def _open_writer(path: Path, synchronous: Synchronous) -> sqlite3.Connection:
    kind = inspect_file(path)
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, cached_statements=INSERT_CHUNK + 8)
    except sqlite3.Error as exc:
        raise LedgerError(f"{path} cannot be opened for writing ({exc})") from exc
    try:
        if kind == "new":
            conn.executescript(
                f"BEGIN IMMEDIATE;{SCHEMA}"
                f"INSERT INTO meta(key, value) VALUES ('format', '{FORMAT}'), ('created_at', '{_utc_now()}'),"
                f" ('{SUBTREES_KEY}', '{SUBTREE_STRIDE}');"
                "COMMIT;"
            )
            log.info("ledger.created", path=str(path))
        else:
            conn.execute(DROP_RETIRED)
            for statement in SECONDARY_STATEMENTS:
                conn.execute(statement)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(f"{path}: SQLite refused WAL mode (journal_mode is {mode})")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # the writer thread checkpoints (`_checkpoint_wal`)
        check_format(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        raise LedgerError(f"{path} cannot be prepared as a karma ledger ({exc})") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _store_missing_subtrees(conn: sqlite3.Connection, path: Path) -> None:
    """Give a ledger written before subtree hashes were stored its `subtrees` table and rows (once)."""
    if conn.execute("SELECT 1 FROM meta WHERE key = ?", (SUBTREES_KEY,)).fetchone() is not None:
        return
    frontier = CompactRange()
    subtrees = frontier.extend_collecting([h for (h,) in conn.execute("SELECT hash FROM records ORDER BY seq")])
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statement in SUBTREES_STATEMENTS:
            conn.execute(statement)
        conn.executemany(INSERT_SUBTREE, subtrees)
        conn.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (SUBTREES_KEY, str(SUBTREE_STRIDE)))
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise LedgerError(f"{path}: the subtree hashes could not be stored ({exc})") from exc
    log.info("ledger.subtrees_stored", path=str(path), count=len(subtrees), size=frontier.size)


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _settle(waiting: Sequence[_Pending | _CheckpointRequest], outcomes: Sequence[Any]) -> None:
    """Hand each outcome to its caller's future on the future's own loop: one wake-up per loop."""
    by_loop: dict[_Wakeup, list[tuple[asyncio.Future[Any], Any]]] = {}
    for item, outcome in zip(waiting, outcomes, strict=True):
        by_loop.setdefault(item.wakeup, []).append((item.future, outcome))
    for wakeup, pairs in by_loop.items():
        try:
            wakeup.post(pairs)
        except RuntimeError:
            log.warning("ledger.answer_dropped", reason="event loop closed", count=len(pairs))


def deliver(pairs: Sequence[tuple[asyncio.Future[Any], Any]]) -> None:
    """Resolve each future with its outcome (an exception or a result), skipping those already done."""
    for future, outcome in pairs:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
