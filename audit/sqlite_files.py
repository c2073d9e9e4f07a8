"""The ledger file: its schema, telling a ledger from anything else, refusing a damaged one.

`SCHEMA` is what a new ledger file is created with (append-only by trigger). `inspect_file` refuses
a path that is a directory, lacks a parent, or holds a file that is not a Dharma karma ledger,
without ever writing to it; `rebuild_head` refuses a ledger whose stored tail or checkpoint does
not match its records; `WriterLock` is the exclusive flock on `<path>.lock` that makes
`SqliteLedger` the only writer across processes. Used by `audit.sqlite` (the writer) and
`audit.sqlite_read` (the reader); nothing here writes to the ledger itself.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from audit import merkle
from audit.checkpoint import parse_checkpoint
from audit.errors import LedgerError, LedgerLocked, NotALedger
from audit.merkle import CompactRange
from audit.records import FORMAT, GENESIS_PREV, parse_record

SQLITE_HEADER = b"SQLite format 3\x00"
LEDGER_TABLES = ("meta", "records", "record_rules", "checkpoints", "subtrees")


def _append_only(table: str) -> tuple[str, ...]:
    return tuple(
        f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table} "
        "BEGIN SELECT RAISE(ABORT, 'karma ledger is append-only'); END"
        for op in ("UPDATE", "DELETE")
    )


# Hashes of complete subtrees, derived from the records (outside the chain; `audit verify` checks
# them): proofs read O(log n) of them instead of every leaf. Ledgers written before it existed get
# the table and its rows when a writer opens them (`SqliteLedger.open`). One statement each.
SUBTREES_STATEMENTS = (
    "CREATE TABLE IF NOT EXISTS subtrees(height INTEGER NOT NULL, idx INTEGER NOT NULL, hash BLOB NOT NULL,"
    " PRIMARY KEY(height, idx))",
    *_append_only("subtrees"),
)
_TRIGGERS = "".join(f"{statement};" for table in LEDGER_TABLES if table != "subtrees" for statement in _append_only(table))
# The query indexes: derived from the records, so a writer recreates any that is missing when it
# opens the ledger (the bulk loader drops them for the load and builds them once at the end). One
# statement each. The rule index's rows are inserted by the writer, in the record's transaction.
SECONDARY_STATEMENTS = (
    "CREATE INDEX IF NOT EXISTS records_principal_time ON records(principal, time)",
    "CREATE INDEX IF NOT EXISTS records_tool_time ON records(tool, time)",
    "CREATE INDEX IF NOT EXISTS records_time ON records(time)",
    "CREATE INDEX IF NOT EXISTS record_rules_rule ON record_rules(rule_id, seq)",
)
SECONDARY_OBJECTS = (("INDEX", "records_principal_time"), ("INDEX", "records_tool_time"), ("INDEX", "records_time"),
                     ("INDEX", "record_rules_rule"))
RULE_TRIGGER = "records_index_rules"
"""The trigger that filled the rule index before the writer did (json_each over every record's
bytes on every insert). A gateway of that time recreates it when it opens a ledger; a writer now
drops it on open (`DROP_RETIRED`) before its first insert, so no record gets its rule rows twice."""
DROP_RETIRED = f"DROP TRIGGER IF EXISTS {RULE_TRIGGER}"
SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE records(
    seq INTEGER PRIMARY KEY,
    hash BLOB NOT NULL,
    body BLOB NOT NULL,
    time TEXT, principal TEXT, tool TEXT, decision TEXT, status TEXT,
    request_id TEXT, policy_version TEXT
);
CREATE TABLE record_rules(seq INTEGER NOT NULL, rule_id TEXT NOT NULL);
CREATE TABLE checkpoints(size INTEGER PRIMARY KEY, note TEXT NOT NULL, created_at TEXT NOT NULL);
""" + "".join(f"{statement};" for statement in (*SECONDARY_STATEMENTS, *SUBTREES_STATEMENTS)) + _TRIGGERS


class WriterLock:
    """An exclusive, non-blocking flock on `<ledger>.lock`, holding the owner's pid."""

    def __init__(self, ledger: Path) -> None:
        self._ledger = ledger
        self.path = ledger.with_name(ledger.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise LedgerError(f"{self._ledger}: cannot open lock file {self.path} ({exc.strerror})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise LedgerLocked(
                f"{self._ledger} is held by another gateway{who}: a karma ledger has exactly one "
                f"writer (lock file {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _check_location(path: Path) -> None:
    if path.is_dir():
        raise LedgerError(f"{path} is a directory; the karma ledger must be a file path")
    if not path.parent.is_dir():
        raise LedgerError(f"{path}: directory {path.parent} does not exist")


def inspect_file(path: Path) -> Literal["new", "ledger"]:
    """Tell a new/empty file from an existing ledger, refusing anything else untouched."""
    _check_location(path)
    try:
        with path.open("rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return "new"
    except OSError as exc:
        raise LedgerError(f"{path} cannot be read ({exc.strerror})") from exc
    if not header:
        return "new"
    if header != SQLITE_HEADER:
        raise NotALedger(f"{path} is not a Dharma karma ledger (not an SQLite database)")
    conn = connect_ro(path)
    try:
        if _fetch_schema_count(conn, path) == 0:
            return "new"
        check_format(conn, path)
    finally:
        conn.close()
    return "ledger"


def connect_ro(path: Path) -> sqlite3.Connection:
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise LedgerError(f"{path} cannot be opened read-only ({exc})") from exc


def _fetch_schema_count(conn: sqlite3.Connection, path: Path) -> int:
    try:
        return int(conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0])
    except sqlite3.OperationalError as exc:
        raise LedgerError(f"{path} cannot be read ({exc})") from exc
    except sqlite3.DatabaseError as exc:
        raise NotALedger(f"{path} is not a Dharma karma ledger ({exc})") from exc


def check_format(conn: sqlite3.Connection, path: Path) -> None:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such" not in str(exc):
            raise LedgerError(f"{path} cannot be read ({exc})") from exc
        raise NotALedger(f"{path} is not a Dharma karma ledger (an SQLite database without our meta table)") from exc
    except sqlite3.DatabaseError as exc:
        raise NotALedger(f"{path} is not a Dharma karma ledger ({exc})") from exc
    if row is None or row[0] != FORMAT:
        found = "no format" if row is None else f"format {row[0]!r}"
        raise NotALedger(f"{path} is not a Dharma karma ledger ({found}, expected {FORMAT!r})")


def rebuild_head(conn: sqlite3.Connection, path: Path) -> tuple[CompactRange, str]:
    """Rebuild the Merkle frontier from the stored hashes; refuse a ledger that is damaged.

    Checks that seqs are contiguous, that the last record's bytes hash to its stored hash
    and link to the one before, and that the latest stored checkpoint matches the records.
    """
    latest = conn.execute("SELECT size, note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
    cp_size = -1 if latest is None else int(latest[0])
    frontier = CompactRange()
    cp_root = merkle.EMPTY_ROOT if cp_size == 0 else None
    prev = last = b""
    for seq, digest in conn.execute("SELECT seq, hash FROM records ORDER BY seq"):
        if seq != frontier.size + 1 or not isinstance(digest, bytes) or len(digest) != merkle.HASH_SIZE:
            raise LedgerError(
                f"{path}: record {frontier.size + 1} is missing or damaged; the ledger will not be "
                "written until `dharma audit verify` has been run on it"
            )
        frontier.append(digest)
        prev, last = last, digest
        if frontier.size == cp_size:
            cp_root = frontier.root()
    if frontier.size:
        _check_tail(conn, path, frontier.size, last, prev.hex() if frontier.size > 1 else GENESIS_PREV)
    if latest is not None:
        _check_checkpoint(path, str(latest[1]), cp_size, frontier.size, cp_root)
    return frontier, last.hex() if frontier.size else GENESIS_PREV


def _check_tail(conn: sqlite3.Connection, path: Path, size: int, digest: bytes, prev: str) -> None:
    body = conn.execute("SELECT body FROM records WHERE seq = ?", (size,)).fetchone()[0]
    ok = isinstance(body, bytes) and merkle.leaf_hash(body) == digest
    try:
        parsed = parse_record(body) if ok else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.seq != size or parsed.prev != prev:
        raise LedgerError(f"{path}: the last record ({size}) does not match its hash or its predecessor")


def _check_checkpoint(path: Path, note: str, cp_size: int, size: int, root: bytes | None) -> None:
    if cp_size > size:
        raise LedgerError(f"{path}: ledger has {size} records but its checkpoint is at size {cp_size} — truncated")
    try:
        stored_root = parse_checkpoint(note).root
    except LedgerError as exc:
        raise LedgerError(f"{path}: stored checkpoint at size {cp_size} is malformed ({exc})") from exc
    if root != stored_root:
        raise LedgerError(f"{path}: the first {cp_size} records do not match the stored checkpoint")
