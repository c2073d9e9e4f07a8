"""The rows a ledger stores beside its chain, against what they must be: stored checkpoints, `meta`, `head`.

`audit.verify` walks the records; these checks cover every other stored row, O(rows), each problem
naming the row and the column:

- a stored checkpoint row `(size, note, created_at)`: `note` is a checkpoint note of `size`, signed
  and stamped by a known checkpoint key (`audit.checkpoint`: the stamp signs the time it was stored,
  which `created_at` must repeat, and the size of the stored checkpoint before it and whether that
  one is stamped, which must be the row before it: a deleted row leaves a stamp naming a size no row
  holds, a removed stamp is named by the next row's); one origin; times that do not go back. Its
  root is compared with the records by the walk. Rows stored before stamps existed (the key's
  signature alone) are checked for their signature, form and order, and only before the first
  stamped row.
- `meta`: only the keys a ledger writes, each with the value it must have (`META_KEYS`).
- `head` (PostgreSQL): one row, at the ledger's size and last record hash.
- a checkpoint kept outside the database: the newest stored checkpoint must reach it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.checkpoint import (
    Checkpoint,
    Stamp,
    key_id,
    parse_checkpoint,
    read_stamp,
    stamp_key_id,
    verify_checkpoint_keys,
    verify_stamp,
)
from audit.errors import LedgerError
from audit.merkle import SUBTREE_STRIDE
from audit.records import FORMAT, GENESIS_PREV, SUBTREES_KEY

PublicKeys = Sequence[tuple[str, Ed25519PublicKey]]
"""The checkpoint keys a verifier knows: (key name, public key)."""

CLOCK_SKEW = timedelta(seconds=60)
"""How far a stored checkpoint's time may lie before the previous one's (writers' clocks differ a
little, and a wall clock may be stepped back), and a ledger's creation time after the verifier's clock."""

_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
_TIME_FORM = "an RFC 3339 UTC time with microseconds, as writers store it (2026-01-31T23:59:59.000000Z)"


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A stored checkpoint row that passed its checks."""

    size: int
    root: bytes
    origin: str
    note: str
    created_at: str
    stamp: Stamp | None
    when: datetime  # `created_at` read


@dataclass(frozen=True, slots=True)
class Reach:
    """How far the stored checkpoints reach: the newest one's size and time, how many there are,
    and how many were stored before stamps existed (their time and order are not signed)."""

    size: int
    created_at: str
    count: int
    unstamped: int


@dataclass(frozen=True, slots=True)
class CheckedCheckpoints:
    """What `check_checkpoints` found: the rows that passed, in size order (up to the first bad
    one), and the first problem ("" when none)."""

    good: list[StoredCheckpoint]
    problem: str

    def reach(self) -> Reach | None:
        if not self.good:
            return None
        newest = self.good[-1]
        return Reach(newest.size, newest.created_at, len(self.good), sum(1 for s in self.good if s.stamp is None))


class _Bad(Exception):
    """A stored row is not what it must be (the message names the row and the column)."""


@dataclass(frozen=True, slots=True)
class _Known:
    """The known keys, and by (name, stamp key id) each one's public key and note key id (computed once)."""

    keys: PublicKeys
    by_stamp: dict[tuple[str, bytes], tuple[Ed25519PublicKey, bytes]]

    @classmethod
    def of(cls, keys: PublicKeys) -> _Known:
        return cls(keys, {(name, stamp_key_id(name, pk)): (pk, key_id(name, pk)) for name, pk in keys})


def check_checkpoints(rows: Iterable[tuple[Any, Any, Any]], keys: PublicKeys | None) -> CheckedCheckpoints:
    """Check every stored checkpoint row, smallest size first; stop at the first bad one.

    `keys` None checks the form, the columns and the links but no signature (a library caller
    that has no keys); the CLI always passes the keys it trusts.
    """
    good: list[StoredCheckpoint] = []
    known = None if keys is None else _Known.of(keys)
    for row in rows:
        try:
            good.append(_check_row(row, known, good[-1] if good else None))
        except _Bad as exc:
            return CheckedCheckpoints(good, str(exc))
    return CheckedCheckpoints(good, "")


def _check_row(row: tuple[Any, Any, Any], known: _Known | None, before: StoredCheckpoint | None) -> StoredCheckpoint:
    size, note, created_at = row
    where = f"stored checkpoint at size {size!r}"
    for column, value, kind in (("size", size, int), ("note", note, str), ("created_at", created_at, str)):
        if type(value) is not kind:
            raise _Bad(f"{where}: column {column} holds {value!r}, not {'a whole number' if kind is int else 'text'}")
    try:
        cp = parse_checkpoint(note)
    except LedgerError as exc:
        raise _Bad(f"{where}: column note is not a checkpoint note ({exc})") from None
    if cp.size != size:
        raise _Bad(f"{where}: column size holds {size} but its note (column note) is for size {cp.size}")
    if before is not None and cp.origin != before.origin:
        raise _Bad(f"{where}: column note is for origin {cp.origin!r}, the stored checkpoint at size "
                   f"{before.size} for {before.origin!r}: a ledger has one origin")
    stamp = read_stamp(note)
    if stamp is None:
        _check_unstamped(where, note, cp, created_at, known, before)
    else:
        _check_stamped(where, cp, stamp, created_at, known, before)
    when = _when(created_at)
    if when is None:  # a stamped row's is its stamp's time
        raise _Bad(f"{where}: column created_at holds {created_at!r}, not {_TIME_FORM}")
    if before is not None and when < before.when - CLOCK_SKEW:
        raise _Bad(f"{where}: column created_at holds {created_at!r}, before the stored checkpoint at size "
                   f"{before.size} ({before.created_at}): stored checkpoints go back in time")
    return StoredCheckpoint(size, cp.root, cp.origin, note, created_at, stamp, when)


def _check_unstamped(where: str, note: str, cp: Checkpoint, created_at: str, known: _Known | None,
                     before: StoredCheckpoint | None) -> None:
    """A row stored before stamps existed: only before every stamped row; signed by a known key."""
    if before is not None and before.stamp is not None:  # rows before an unstamped one are unstamped too
        raise _Bad(f"{where}: column note carries no stamp, yet the stored checkpoint at size {before.size} before "
                   "it does (a writer never stops stamping): its stamp was removed or the row replaced")
    if len(cp.signatures) != 1:
        raise _Bad(f"{where}: column note carries no stamp and {len(cp.signatures)} signature lines; a stored note "
                   "holds its key's signature and its stamp (or, stored before stamps existed, the signature alone)")
    if known is not None:
        try:
            verify_checkpoint_keys(note, known.keys)
        except LedgerError as exc:
            raise _Bad(f"{where}: column note: {exc}") from None


def _check_stamped(where: str, cp: Checkpoint, stamp: Stamp, created_at: str, known: _Known | None,
                   before: StoredCheckpoint | None) -> None:
    """A stamped row: the note's signature and its stamp by one known key, nothing else; `created_at`
    is the stamp's time; the stamp's `prev` is the row before it, stamped as it says."""
    signer = cp.signatures[0]
    if len(cp.signatures) != 2 or signer.key_name != stamp.key_name:
        raise _Bad(f"{where}: column note holds {len(cp.signatures)} signature lines by "
                   f"{', '.join(repr(s.key_name) for s in cp.signatures)}; a stored note holds two by one key, its "
                   "signature and then its stamp")
    if known is not None:
        found = known.by_stamp.get((stamp.key_name, stamp.key_id))
        if found is None:
            kids = ", ".join(f"{name}+{stamp_id.hex()}" for name, stamp_id in known.by_stamp) or "none"
            raise _Bad(f"{where}: column note is stamped by none of the known checkpoint keys (stamp key ids {kids})")
        public_key, note_key_id = found
        if signer.key_id != note_key_id:
            raise _Bad(f"{where}: column note is signed by another key than its stamp")
        try:
            verify_stamp(stamp, public_key, stamp.key_name, stamp.key_id)  # it signs the note above it, signature line too
        except LedgerError as exc:
            raise _Bad(f"{where}: column note: {exc}") from None
    if created_at != stamp.created_at:
        raise _Bad(f"{where}: column created_at holds {created_at!r} but its stamp says {stamp.created_at!r}")
    wanted = None if before is None else before.size
    if stamp.prev == wanted:
        if before is not None and stamp.prev_stamped != (before.stamp is not None):
            said = ("carries a stamp, and it carries none: its stamp was removed" if stamp.prev_stamped
                    else "carries no stamp, and it carries one: the row was replaced")
            raise _Bad(f"{where}: its stamp says the stored checkpoint before it (size {before.size}) {said}")
        return
    if stamp.prev is None:
        raise _Bad(f"{where}: its stamp says it is the first stored checkpoint, yet the one at size {wanted} is "
                   "stored before it (a row was added)")
    if wanted is None or stamp.prev > wanted:
        raise _Bad(f"{where}: its stamp says the stored checkpoint before it is at size {stamp.prev}, and no row holds "
                   f"it: the stored checkpoint at size {stamp.prev} was deleted")
    raise _Bad(f"{where}: its stamp says the stored checkpoint before it is at size {stamp.prev}, yet the one at "
               f"size {wanted} is stored in between (a row was added)")


def _when(text: str) -> datetime | None:
    """A writer's UTC time (`_TIME_FORM`) as a datetime; None for anything else."""
    if not _TIME.fullmatch(text):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def gap_problem(external: Checkpoint, checked: CheckedCheckpoints, keys: PublicKeys | None) -> str:
    """What the stored checkpoints lack that a checkpoint kept elsewhere (its root already matched
    the records) says must be there ("" when nothing): a stamped one is a note this ledger stored,
    so it must still be stored, unchanged; any must be reached by the newest stored checkpoint."""
    reach = checked.reach()
    reached = (f"the ledger's newest stored checkpoint reaches size {reach.size} (stored {reach.created_at})"
               if reach is not None else "the ledger stores no checkpoint")
    stamp = _own_stamp(external, keys)
    if stamp is not None:
        stored = next((s for s in checked.good if s.size == external.size), None)
        if stored is None:
            return (f"{reached}; your checkpoint at size {external.size} was stored in this ledger at "
                    f"{stamp.created_at} (it carries the ledger's stamp) and is missing: stored checkpoints were deleted")
        if stored.note != external.text():
            return (f"the stored checkpoint at size {external.size} (stored {stored.created_at}) is not the one you hold "
                    f"(stored {stamp.created_at}): yours was deleted and the size signed again")
    if external.size > (reach.size if reach is not None else 0):
        after = f"after size {reach.size}" if reach is not None else f"up to size {external.size}"
        return (f"{reached}; your checkpoint reaches size {external.size}: the stored checkpoints {after} are missing "
                "(deleted, unless no gateway has stored one since yours was signed)")
    return ""


def _own_stamp(external: Checkpoint, keys: PublicKeys | None) -> Stamp | None:
    """The stamp of a checkpoint kept elsewhere when a known key made it (any stamp, without keys)."""
    stamp = read_stamp(external.text())
    if stamp is None or keys is None:
        return stamp
    for name, public_key in keys:
        try:
            verify_stamp(stamp, public_key, name)
        except LedgerError:
            continue
        return stamp
    return None


def _format_problem(value: str) -> str:
    return "" if value == FORMAT else f"but this ledger format is {FORMAT!r}"


def _created_problem(value: str) -> str:
    when = _when(value)
    if when is None:
        return f"not {_TIME_FORM}"
    return "a time in the future" if when > datetime.now(UTC) + CLOCK_SKEW else ""


def _subtrees_problem(value: str) -> str:
    wanted = str(SUBTREE_STRIDE)
    return "" if value == wanted else f"but a ledger stores a subtree hash every {wanted} levels ({wanted!r})"


META_KEYS: dict[str, Callable[[str], str]] = {
    "format": _format_problem,
    "created_at": _created_problem,
    SUBTREES_KEY: _subtrees_problem,
}
"""Every key a ledger's `meta` holds and what its value must be: `format` the ledger format (a
reader refuses any other before verifying); `created_at` when the storage was created (a migrated
ledger's is the migration's), a writer's UTC time, not in the future; `subtrees` the subtree stride,
present exactly when the ledger stores subtree hashes. No signature covers `created_at`, so an edit
to another well-formed past time is not detectable: nothing reads it."""


def meta_problem(rows: Iterable[tuple[Any, Any]], *, subtree_rows: bool) -> str:
    """What is wrong with the `meta` rows ("" when nothing): an unknown key, a value that is not
    what it must be, a row that must be there and is not."""
    seen: set[str] = set()
    for key, value in rows:
        if key not in META_KEYS:
            return f"meta row {key!r}: column key holds a key no ledger writes (it holds {', '.join(sorted(META_KEYS))})"
        if type(value) is not str:
            return f"meta {key}: column value holds {value!r}, not text"
        if problem := META_KEYS[key](value):
            return f"meta {key}: column value holds {value!r}, {problem}"
        seen.add(key)
    for key in ("format", "created_at"):
        if key not in seen:
            return f"meta has no {key} row (a meta row was deleted, or its column key changed)"
    if subtree_rows and SUBTREES_KEY not in seen:
        return f"meta has no {SUBTREES_KEY} row, yet the ledger stores subtree hashes (a meta row was deleted)"
    return ""


def head_problem(rows: Sequence[tuple[Any, Any, Any]] | None, size: int, last_hash: bytes | None) -> str:
    """What is wrong with the `head` table of a ledger of `size` records whose last record hashes to
    `last_hash` ("" when nothing, or when the backend keeps no head)."""
    if rows is None:
        return ""
    if len(rows) != 1:
        return f"the head table holds {len(rows)} rows, not one (its row was deleted or one added)"
    one, head_size, head_hash = rows[0]
    wanted = last_hash if last_hash is not None else bytes.fromhex(GENESIS_PREV)
    if one is not True:
        return f"the head row: column one holds {one!r}, not true"
    if type(head_size) is not int or head_size != size:
        return f"the head row: column size holds {head_size!r} but the ledger holds {size} records"
    if not isinstance(head_hash, bytes) or head_hash != wanted:
        shown = head_hash.hex() if isinstance(head_hash, bytes) else repr(head_hash)
        return f"the head row: column hash holds {shown} but record {size}'s hash is {wanted.hex()}"
    return ""
