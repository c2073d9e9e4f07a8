"""Reading a SQLite karma ledger: `SqliteLedgerReader`, read-only and safe next to a live writer.

It opens the file with `mode=ro`, refuses anything that is not a ledger (see `audit.sqlite_files`)
and never writes. Writing is `audit.sqlite`'s job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog

from audit import merkle
from audit.errors import LedgerError
from audit.records import SUBTREES_KEY, IndexFields, RecordFilter, StoredRecord
from audit.sqlite_files import check_format, connect_ro, inspect_file
from audit.store import IndexedRecord, RawRecord

log = structlog.get_logger()


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

    def checkpoint_rows(self) -> list[tuple[Any, Any, Any]]:
        """Every stored checkpoint row as stored, (size, note, created_at), smallest size first."""
        return list(self._select("SELECT size, note, created_at FROM checkpoints ORDER BY size"))

    def meta_rows(self) -> list[tuple[Any, Any]]:
        """Every row of the `meta` table as stored, (key, value)."""
        return list(self._select("SELECT key, value FROM meta ORDER BY key"))

    def head_rows(self) -> None:
        """A SQLite ledger keeps no head row (its writer finds the head from the records)."""
        return None

    def leaf_hashes(self, size: int | None = None) -> list[bytes]:
        """The stored record hashes of seq 1..size (all when None)."""
        stop = self.size() if size is None else size
        return [h for (h,) in self._select("SELECT hash FROM records WHERE seq <= ? ORDER BY seq", (stop,))]

    def leaf_range(self, lo: int, hi: int) -> list[bytes]:
        """The stored hashes of leaves lo..hi-1 (records lo+1..hi), in order."""
        return [h for (h,) in self._select("SELECT hash FROM records WHERE seq > ? AND seq <= ? ORDER BY seq", (lo, hi))]

    def subtree_hashes(self, height: int, lo: int, hi: int) -> list[bytes]:
        """The stored hashes of the subtrees lo..hi-1 of `height`, in order (fewer when some are
        not stored; none from a ledger that stores none)."""
        if not self._has_subtrees():
            return []
        return [h for (h,) in self._select("SELECT hash FROM subtrees WHERE height = ? AND idx >= ? AND idx < ?"
                                           " ORDER BY idx", (height, lo, hi))]

    def subtrees(self) -> Iterator[tuple[Any, Any, Any]]:
        """Every stored subtree row as (height, index, hash), by height then index."""
        if not self._has_subtrees():
            return iter(())
        return self._select("SELECT height, idx, hash FROM subtrees ORDER BY height, idx")

    def keeps_subtrees(self) -> bool:
        """Whether the ledger says it stores every complete subtree hash (so a missing one is tampering)."""
        return self._fetch_one("SELECT 1 FROM meta WHERE key = ?", (SUBTREES_KEY,)) is not None

    def _has_subtrees(self) -> bool:
        return self._fetch_one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'subtrees'") is not None

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

    def index_suspects(self) -> Iterator[IndexedRecord]:
        """Records whose indexed columns or rule rows may disagree with their bytes, oldest first.

        One SQL pass on a connection of its own (so it can run in another thread): SQLite's
        JSON functions read the indexed fields and `matched_rules` out of the body and compare
        them with the columns and the rule rows, so only the records that differ reach Python.
        A body SQLite cannot read as JSON, or a BLOB smuggled into a column, makes that pass
        fail; then every remaining record is handed over for the exact check.
        """
        conn = connect_ro(self._path)
        after = 0
        try:
            for sql in (_SUSPECTS_SQL, _EVERY_RECORD_SQL):
                try:
                    for row in conn.execute(sql, (after,)):
                        after = row[0]
                        yield _indexed(row)
                    return
                except sqlite3.OperationalError as exc:
                    log.warning("ledger.index_check_thorough", path=str(self._path), after_seq=after, reason=str(exc))
        except sqlite3.Error as exc:
            raise LedgerError(f"{self._path}: cannot read the ledger's indexes ({exc})") from exc
        finally:
            conn.close()

    def index_orphans(self) -> Iterator[tuple[Any, str]]:
        """(seq, rule id) of every rule-index row whose seq names no record, lowest seq first."""
        return self._select(
            "SELECT seq, rule_id FROM record_rules WHERE seq NOT IN (SELECT seq FROM records) ORDER BY seq, rule_id"
        )

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
_INDEXED = tuple(field.name for field in dataclasses.fields(IndexFields))
_CANONICAL_TIME_GLOB = "[0-9]" * 4 + "-" + "[0-9]" * 2 + "-" + "[0-9]" * 2 + "T" + ":".join(["[0-9]" * 2] * 3) + "." + "[0-9]" * 6 + "Z"


def _index_sql(rule_value: str, where: str) -> str:
    """Each record with its indexed columns and its rule rows (a JSON array, in row order)."""
    columns = ", ".join(f"r.{name}" for name in _INDEXED)
    return (
        f"WITH idx AS (SELECT seq, json_group_array({rule_value}) AS rules"
        " FROM (SELECT seq, rule_id FROM record_rules ORDER BY seq, rowid) GROUP BY seq)"
        f" SELECT r.seq, r.body, {columns}, idx.rules FROM records r LEFT JOIN idx ON idx.seq = r.seq"
        f" WHERE r.seq > ?{where} ORDER BY r.seq"
    )


def _suspect_clause() -> str:
    """True unless every indexed field, read from the body by SQLite, equals its column as JSON
    text, the rule rows are exactly `matched_rules` in order, and `time` is in canonical form."""
    columns = ", ".join(f"r.{name}" for name in _INDEXED)
    paths = ", ".join(f"'$.entry.{name}'" for name in _INDEXED)
    read = f"json_extract(CAST(r.body AS TEXT), {paths}, '$.entry.matched_rules')"
    same = (
        f"{read} IN (json_array({columns}, json(COALESCE(idx.rules, '[]'))),"
        f" CASE WHEN idx.rules IS NULL THEN json_array({columns}, NULL) END)"
    )
    return f" AND NOT coalesce({same} AND (r.time IS NULL OR r.time GLOB '{_CANONICAL_TIME_GLOB}'), 0)"


_SUSPECTS_SQL = _index_sql("rule_id", _suspect_clause())
_EVERY_RECORD_SQL = _index_sql("CASE typeof(rule_id) WHEN 'text' THEN rule_id ELSE quote(rule_id) END", "")


def _indexed(row: Sequence[Any]) -> IndexedRecord:
    rules = json.loads(row[-1]) if row[-1] is not None else []
    return IndexedRecord(
        seq=row[0],
        body=row[1].encode("utf-8") if isinstance(row[1], str) else bytes(row[1]),  # TEXT: the chain walk names it
        fields=IndexFields(*row[2:-1]),
        rules=tuple(sorted(rule if isinstance(rule, str) else json.dumps(rule) for rule in rules)),
    )


def _glob_prefix(prefix: str) -> tuple[str, str]:
    return "r.tool GLOB ?", prefix + "*"


def filter_sql(
    where: RecordFilter, tool_prefix: Callable[[str], tuple[str, str]] = _glob_prefix
) -> tuple[str, list[Any]]:
    """The SELECT (with `?` placeholders) of the records matching `where`, oldest first (newest first if it says so).

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
    sql += " ORDER BY r.time DESC, r.seq DESC" if where.newest_first else " ORDER BY r.time, r.seq"
    if where.limit is not None:
        sql += " LIMIT ?"
        params.append(where.limit)
    return sql, params
