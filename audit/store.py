"""The roles a karma ledger backend plays: a writer (`LedgerStore`) and a reader (`LedgerReader`).

Verification and queries are written against `LedgerReader`, so every backend (SQLite today,
PostgreSQL later) gets them for free. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.records import Appended, IndexFields, RecordFilter, StoredRecord

RawRecord = tuple[int, bytes, bytes]
"""(seq, record hash as 32 raw bytes, record bytes), as fast as the backend yields them."""

IndexedRaw = tuple[Any, ...]
"""A `RawRecord` followed by its index row, flat: (seq, hash, body, *the `IndexFields` columns in
order, the record's rule-index rows as a list sorted by code point, duplicates kept, or None when it
has none)."""


@dataclass(frozen=True, slots=True)
class IndexedRecord:
    """A record's bytes beside what the backend's query indexes hold for it (not hashed).

    `rules` is every rule-index row of the record, sorted, duplicates kept.
    """

    seq: int
    body: bytes
    fields: IndexFields
    rules: tuple[str, ...]


class LedgerStore(Protocol):
    """The one writer of a ledger. `append` answers only once the record is committed."""

    @property
    def size(self) -> int: ...

    @property
    def head_hash(self) -> str: ...

    def root(self) -> bytes: ...

    async def append(self, entry: Mapping[str, Any]) -> Appended: ...

    async def checkpoint(self, private_key: Ed25519PrivateKey, key_name: str, origin: str) -> str: ...

    async def aclose(self) -> None: ...


class LedgerReader(Protocol):
    """Read-only access to a ledger, safe while a writer is live."""

    def size(self) -> int: ...

    def iter_records(self, start: int = 1) -> Iterator[RawRecord]: ...

    def get(self, seq: int) -> StoredRecord | None: ...

    def latest_checkpoint(self) -> str | None: ...

    def checkpoints(self) -> list[tuple[int, str]]: ...

    def checkpoint_rows(self) -> list[tuple[Any, Any, Any]]:
        """Every stored checkpoint row as stored, (size, note, created_at), smallest size first."""
        ...

    def meta_rows(self) -> list[tuple[Any, Any]]:
        """Every row of the `meta` table as stored, (key, value)."""
        ...

    def head_rows(self) -> list[tuple[Any, Any, Any]] | None:
        """The rows of a `head` table as stored, (one, size, hash); None for a backend that keeps none."""
        ...

    def select_records(self, where: RecordFilter) -> Iterator[RawRecord]: ...

    def index_suspects(self) -> Iterator[IndexedRecord]:
        """Records whose indexed columns or index rows may disagree with their bytes, oldest first.

        A cheap superset computed by the backend (verify re-checks each one on the decoded
        bytes); usable from another thread while the chain is walked.
        """
        ...

    def index_orphans(self) -> Iterator[tuple[Any, str]]:
        """(seq as stored, rule id) of every rule-index row that names no record."""
        ...

    def leaf_range(self, lo: int, hi: int) -> list[bytes]:
        """The stored record hashes of leaves lo..hi-1 (records lo+1..hi), in order."""
        ...

    def subtree_hashes(self, height: int, lo: int, hi: int) -> list[bytes]:
        """Stored hashes of the complete subtrees lo..hi-1 of `height` (fewer when some are missing)."""
        ...

    def subtrees(self) -> Iterator[tuple[Any, Any, Any]]:
        """Every stored subtree row as (height, index, hash), by height then index."""
        ...

    def keeps_subtrees(self) -> bool:
        """Whether the ledger says it stores every complete subtree hash."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class IndexedRecordReader(LedgerReader, Protocol):
    """A reader that hands each record's index row out beside its bytes (PostgreSQL).

    `verify_ledger` then checks the chain and the indexes in one pass: fetching each body twice
    and hashing and parsing in two threads costs more in Python than the one pass.
    """

    def iter_indexed(self, start: int = 1) -> Iterator[IndexedRaw]: ...
