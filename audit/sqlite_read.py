"""Reading a SQLite karma ledger: `SqliteLedgerReader`, read-only and safe next to a live writer.

It opens the file with `mode=ro`, refuses anything that is not a ledger (see `audit.sqlite_files`)
and never writes. Writing is `audit.sqlite`'s job.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from audit import merkle
from audit.errors import LedgerError
from audit.records import RecordFilter, StoredRecord
from audit.sqlite_files import check_format, connect_ro, inspect_file
from audit.store import RawRecord


class SqliteLedgerReader:
    """Read-only access to a SQLite karma ledger; safe next to a live writer."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        if inspect_file(self._path) == "new":
            raise LedgerError(f"{self._path}: no karma ledger here (the file is missing or empty)")
        self._conn = connect_ro(self._path)
        try:
            check_format(self._conn, self._path)
        except BaseException:
            self._conn.close()
            raise

    @property
    def path(self) -> Path:
        return self._path

    def __enter__(self) -> SqliteLedgerReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def size(self) -> int:
        """The highest seq stored (equals the record count in an intact ledger)."""
        return int(self._fetch_one("SELECT COALESCE(MAX(seq), 0) FROM records")[0])

    def iter_records(self, start: int = 1) -> Iterator[RawRecord]:
        """Yield (seq, hash bytes, record bytes) in seq order from one read snapshot."""
        return self._select("SELECT seq, hash, body FROM records WHERE seq >= ? ORDER BY seq", (start,))

    def get(self, seq: int) -> StoredRecord | None:
        row = self._fetch_one("SELECT seq, hash, body FROM records WHERE seq = ?", (seq,))
        return None if row is None else StoredRecord(row[0], bytes(row[1]).hex(), bytes(row[2]))

    def latest_checkpoint(self) -> str | None:
        row = self._fetch_one("SELECT note FROM checkpoints ORDER BY size DESC LIMIT 1")
        return None if row is None else str(row[0])

    def checkpoints(self) -> list[tuple[int, str]]:
        """Every stored checkpoint as (size, note), smallest first."""
        return list(self._select("SELECT size, note FROM checkpoints ORDER BY size"))

    def leaf_hashes(self, size: int | None = None) -> list[bytes]:
        """The stored record hashes of seq 1..size (all when None)."""
        stop = self.size() if size is None else size
        return [h for (h,) in self._select("SELECT hash FROM records WHERE seq <= ? ORDER BY seq", (stop,))]

    def inclusion_proof(self, seq: int, size: int | None = None) -> list[bytes]:
        """Audit path of record `seq` in the tree of the first `size` records."""
        leaves = self.leaf_hashes(size)
        return merkle.inclusion_proof(leaves, seq - 1)

    def consistency_proof(self, old_size: int, size: int | None = None) -> list[bytes]:
        """Proof that the first `old_size` records are a prefix of the first `size`."""
        return merkle.consistency_proof(self.leaf_hashes(size), old_size)

    def select_records(self, where: RecordFilter) -> Iterator[RawRecord]:
        """Yield (seq, hash, body) of the records matching `where`, oldest first, via the indexes."""
        sql, params = filter_sql(where)
        return self._select(sql, params)

    def _select(self, sql: str, params: Sequence[Any] = ()) -> Iterator[Any]:
        try:
            yield from self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise LedgerError(f"{self._path}: cannot read the ledger ({exc})") from exc

    def _fetch_one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self._conn.execute(sql, params).fetchone()
        except sqlite3.Error as exc:
            raise LedgerError(f"{self._path}: cannot read the ledger ({exc})") from exc


_FILTER_COLUMNS = ("principal", "tool", "decision", "status", "policy_version", "request_id")


def _glob_prefix(prefix: str) -> tuple[str, str]:
    return "r.tool GLOB ?", prefix + "*"


def filter_sql(
    where: RecordFilter, tool_prefix: Callable[[str], tuple[str, str]] = _glob_prefix
) -> tuple[str, list[Any]]:
    """The SELECT (with `?` placeholders) of the records matching `where`, oldest first.

    `tool_prefix` gives the clause and parameter that keep tools starting with a literal prefix
    (SQLite: GLOB, which uses the tool index); another backend passes its own.
    """
    sql = "SELECT r.seq, r.hash, r.body FROM records r"
    clauses: list[str] = []
    params: list[Any] = []
    if where.rule is not None:
        sql += " JOIN record_rules rr ON rr.seq = r.seq"
        clauses.append("rr.rule_id = ?")
        params.append(where.rule)
    for column in _FILTER_COLUMNS:
        value = getattr(where, column)
        if value is not None:
            clauses.append(f"r.{column} = ?")
            params.append(value)
    if where.tool_prefix:  # literal: query.py cuts it before the first of * ? [
        clause, value = tool_prefix(where.tool_prefix)
        clauses.append(clause)
        params.append(value)
    if where.since is not None:
        clauses.append("r.time >= ?")
        params.append(where.since)
    if where.until is not None:
        clauses.append("r.time < ?")
        params.append(where.until)
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY r.time, r.seq"
    if where.limit is not None:
        sql += " LIMIT ?"
        params.append(where.limit)
    return sql, params
