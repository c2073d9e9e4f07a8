"""Full verification of a karma ledger: recompute every record hash, the chain and the tree.

Streams the records once, in seq order, and reports the first problem with the seq it
starts at: an edited record, a missing one, reordered or renumbered ones, and, against a
checkpoint held outside the database, truncation and rewritten history (a fork). Reads
through `LedgerReader`; never writes. A chain that is consistent in itself proves nothing
about truncation or a wholesale rewrite: only a checkpoint kept elsewhere does.

Queries filter on what the backend indexes (derived columns, the rule index), which no hash
covers. So, beside the chain walk and in a second thread, verification recomputes every
indexed column and rule row from the record bytes and names the first record whose index
differs, and any rule row that names no record. Every other stored row (stored checkpoints,
`meta`, `head`) is checked by `audit.verify_rows`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from audit.canon import NotCanonicalizable, canonical_bytes
from audit.checkpoint import Checkpoint
from audit.errors import LedgerError
from audit.merkle import EMPTY_ROOT, SUBTREE_STRIDE, CompactRange, CompletedSubtree
from audit.records import (
    ENTRY_PREFIX,
    GENESIS_PREV,
    KIND_DECISION,
    KIND_OUTCOME,
    PREV_MARK,
    SEQ_MARK,
    IndexFields,
    index_fields,
    parse_record,
    quick_index,
    rule_ids,
)
from audit.store import IndexedRaw, IndexedRecord, IndexedRecordReader, LedgerReader, RawRecord
from audit.verify_rows import (
    CheckedCheckpoints,
    PublicKeys,
    Reach,
    check_checkpoints,
    gap_problem,
    head_problem,
    meta_problem,
)

_INDEXED = tuple(field.name for field in dataclasses.fields(IndexFields))
log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of `verify_ledger`.

    `size` is the number of records whose bytes and chain were found intact before the first
    problem (all of them when ok, or when only an index is wrong); `root` is the Merkle root
    over those. `reach`: how far the stored checkpoints that passed their checks reach (None when
    none is stored, or they were not checked).
    """

    ok: bool
    size: int
    first_bad_seq: int | None
    problem: str
    root: bytes
    checkpoints_checked: int = 0
    reach: Reach | None = None


@dataclass(frozen=True, slots=True)
class _Anchor:
    size: int
    root: bytes
    label: str


def verify_ledger(
    reader: LedgerReader,
    checkpoint: Checkpoint | None = None,
    *,
    stored_checkpoints: bool = True,
    strict: bool = False,
    indexes: bool = True,
    keys: PublicKeys | None = None,
) -> VerifyReport:
    """Recompute the ledger and compare it with `checkpoint` and the checkpoints stored in it.

    Args:
        checkpoint: a checkpoint kept outside the database (already signature-checked by
            the caller, e.g. with `verify_checkpoint`). Catches truncation and forks, and stored
            checkpoints deleted after it (the newest stored one must reach it).
        stored_checkpoints: also check every stored checkpoint row (`audit.verify_rows`) and
            compare the records with each (these catch accidents; only `keys` make their
            signatures count, and even then the newest ones can be deleted unseen: only a
            checkpoint kept elsewhere tells).
        strict: also check that every entry is canonical JSON (about 20x slower).
        indexes: also recompute every indexed column and rule-index row from the record
            bytes (what queries filter on), in a second thread beside the chain walk or (for an
            `IndexedRecordReader`) in the same pass, every stored subtree hash (what proofs read)
            from the record hashes, and check the `meta` and `head` rows.
        keys: the checkpoint keys (name, public key) stored checkpoints must be signed and
            stamped by; None checks their form, columns and links but no signature.
    """
    try:
        checked = check_checkpoints(reader.checkpoint_rows(), keys) if stored_checkpoints else None
    except LedgerError as exc:
        return VerifyReport(False, 0, None, str(exc), EMPTY_ROOT)
    walk = _Walk(_anchors(checkpoint, checked), strict, collect_subtrees=indexes)
    if not indexes:
        report = walk.run(reader.iter_records())
        return _rows_checked(reader, report, walk, checkpoint, checked, keys, subtree_rows=None)
    report = _earliest(*_walked_with_indexes(reader, walk))
    try:
        subtree_problem, subtree_rows = _first_subtree_problem(reader, walk.subtrees, report.size, whole=report.ok)
    except LedgerError as exc:
        subtree_problem, subtree_rows = str(exc), False
    report = _earliest(report, (None, subtree_problem) if subtree_problem else None)
    return _rows_checked(reader, report, walk, checkpoint, checked, keys, subtree_rows=subtree_rows)


def _walked_with_indexes(reader: LedgerReader, walk: _Walk) -> tuple[VerifyReport, tuple[int | None, str] | None]:
    """The chain walk's report and the first index problem, checked beside it."""
    if isinstance(reader, IndexedRecordReader):
        found: list[tuple[int, str]] = []
        report = walk.run(_index_checked(reader.iter_indexed(), found))
        try:
            return report, (found or [None])[0] or _first_orphan(reader.index_orphans())
        except LedgerError as exc:
            return report, (None, str(exc))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-index") as pool:
        index_check = pool.submit(_first_index_problem, reader)
        report = walk.run(reader.iter_records())
        try:
            return report, index_check.result() or _first_orphan(reader.index_orphans())
        except LedgerError as exc:
            return report, (None, str(exc))


def _rows_checked(reader: LedgerReader, report: VerifyReport, walk: _Walk, checkpoint: Checkpoint | None,
                  checked: CheckedCheckpoints | None, keys: PublicKeys | None, *, subtree_rows: bool | None) -> VerifyReport:
    """`report` with the reach of the stored checkpoints and, when the records and their indexes are
    intact, the first problem of the rows beside them: a stored checkpoint row, `meta`, `head` (when
    `subtree_rows` is not None: indexes were checked), then a gap against `checkpoint`."""
    if checked is not None:
        report = dataclasses.replace(report, reach=checked.reach())
    if not report.ok:
        return report
    problems = [checked.problem if checked is not None else ""]
    if subtree_rows is not None:
        try:
            problems.append(meta_problem(reader.meta_rows(), subtree_rows=subtree_rows))
            problems.append(head_problem(reader.head_rows(), report.size, walk.last_hash))
        except LedgerError as exc:
            problems.append(str(exc))
    if checkpoint is not None and checked is not None:
        problems.append(gap_problem(checkpoint, checked, keys))
    first = next((problem for problem in problems if problem), "")
    return dataclasses.replace(report, ok=False, problem=first) if first else report


def _first_subtree_problem(reader: LedgerReader, computed: list[CompletedSubtree], size: int, *,
                           whole: bool) -> tuple[str, bool]:
    """What is wrong with the stored subtree hashes ("" when nothing): one that differs from the
    hash of its records, one that names no complete subtree (checked when the walk covered the whole
    ledger), or one missing from a ledger that says it stores them all; and whether any row is stored."""
    wanted = {(height, index): digest for height, index, digest in computed}
    rows = reader.subtrees()
    seen = False
    try:
        for height, index, digest in rows:
            seen = True
            where = f"the stored subtree hash at height {height!r}, index {index!r}"
            if type(height) is not int or type(index) is not int or height <= 0 or height % SUBTREE_STRIDE or index < 0:
                return f"{where} names no subtree a ledger stores (table subtrees: its column height or idx was changed)", seen
            records = f"records {(index << height) + 1}..{(index + 1) << height}"
            if (index + 1) << height > size:
                if whole:
                    return (f"{where} ({records}) names records the ledger does not hold ({size} records; table "
                            "subtrees: its column height or idx was changed, or the row added)"), seen
                continue
            if wanted.pop((height, index), None) != digest:
                return f"{where} ({records}) does not match those records (table subtrees: its column hash was edited)", seen
    finally:
        getattr(rows, "close", lambda: None)()
    if wanted and reader.keeps_subtrees():
        height, index = min(wanted, key=lambda key: (key[1] + 1) << key[0])
        return (f"the stored subtree hash at height {height}, index {index} (records {(index << height) + 1}.."
                f"{(index + 1) << height}) is missing (table subtrees: a row was deleted, or its column height or "
                "idx changed)"), seen
    return "", seen


def _earliest(report: VerifyReport, index_problem: tuple[int | None, str] | None) -> VerifyReport:
    """The chain's report, unless an index problem comes first (or the chain is fine)."""
    if index_problem is None:
        return report
    seq, problem = index_problem
    if report.ok or (seq is not None and report.first_bad_seq is not None and seq < report.first_bad_seq):
        return dataclasses.replace(report, ok=False, first_bad_seq=seq, problem=problem)
    return report


def _first_index_problem(reader: LedgerReader) -> tuple[int, str] | None:
    suspects = reader.index_suspects()
    try:
        for record in suspects:
            if problem := index_problem(record):
                return record.seq, problem
    finally:
        getattr(suspects, "close", lambda: None)()
    return None


def _index_checked(rows: Iterable[IndexedRaw], found: list[tuple[int, str]]) -> Iterator[RawRecord]:
    """Pass the records on to the chain walk, checking each one's index row against its bytes on
    the way; the first (seq, problem) lands in `found` and ends the checking."""
    for row in rows:
        if not found and quick_index(row[2]) != row[3:]:
            record = IndexedRecord(seq=row[0], body=row[2], fields=IndexFields(*row[3:-1]), rules=tuple(row[-1] or ()))
            if problem := index_problem(record):
                found.append((row[0], problem))
        yield row[:3]


def _first_orphan(rows: Iterable[tuple[Any, str]]) -> tuple[int | None, str] | None:
    iterator = iter(rows)
    try:
        for seq, rule in iterator:
            return (seq if isinstance(seq, int) else None), (
                f"the rule index has a row ({rule!r}) for record {seq!r}, which is not in the ledger (table "
                "record_rules, column seq or rule_id)"
            )
    finally:
        getattr(iterator, "close", lambda: None)()
    return None


def index_problem(record: IndexedRecord) -> str:
    """What the backend's index holds for `record` that its bytes do not say ("" when none)."""
    try:
        entry = json.loads(record.body)["entry"]
    except (ValueError, TypeError, KeyError):
        entry = None
    if not isinstance(entry, dict):
        return f"record {record.seq} holds no JSON entry object, so its indexed columns cannot be checked"
    derived = index_fields(entry)
    for name in _INDEXED:
        stored, wanted = getattr(record.fields, name), getattr(derived, name)
        if stored != wanted or type(stored) is not type(wanted):
            return f"record {record.seq}: indexed column {name} holds {stored!r} but the record says {wanted!r}"
    wanted_rules = tuple(sorted(rule_ids(entry)))
    if record.rules == wanted_rules:
        return ""
    missing = [rule for rule in wanted_rules if rule not in record.rules]
    extra = sorted({rule for rule in record.rules if rule not in wanted_rules})
    doubled = sorted({rule for rule in record.rules if record.rules.count(rule) > 1})
    parts = [f"{what} {rules}" for what, rules in (("missing", missing), ("extra", extra), ("duplicated", doubled)) if rules]
    return f"record {record.seq}: rule index rows differ from its matched_rules (table record_rules: {'; '.join(parts)})"


def _anchors(checkpoint: Checkpoint | None, checked: CheckedCheckpoints | None) -> list[_Anchor]:
    """The roots the walk compares the records with: `checkpoint` and every stored one that passed its row checks."""
    anchors = [_Anchor(s.size, s.root, "stored checkpoint") for s in (checked.good if checked is not None else ())]
    if checkpoint is not None:
        anchors.append(_Anchor(checkpoint.size, checkpoint.root, "checkpoint"))
    return sorted(anchors, key=lambda a: (a.size, a.label != "checkpoint"))


class _Walk:
    """One pass over the records; holds the running chain head and Merkle frontier."""

    def __init__(self, anchors: list[_Anchor], strict: bool, *, collect_subtrees: bool = False) -> None:
        self.anchors = anchors
        self.strict = strict
        self.frontier = CompactRange()
        self.subtrees: list[CompletedSubtree] = []
        if collect_subtrees:
            self.frontier.completed = self.subtrees
        self.checked = 0
        self.good_size = 0
        self.pending = 0
        self.last_hash: bytes | None = None  # the last record's hash once the walk is done

    def run(self, records: Iterable[RawRecord]) -> VerifyReport:
        if (bad := self._reach(0)) is not None:
            return bad
        next_stop = self._next_stop()
        append = self.frontier.append
        sha256 = hashlib.sha256
        prefix, strict = ENTRY_PREFIX, self.strict
        tail_head = PREV_MARK + GENESIS_PREV.encode("ascii") + SEQ_MARK
        expected = 1
        for seq, stored, body in records:
            if seq != expected:
                return self._bad(expected, f"record {expected} is missing (the next stored record is {seq}): a row was "
                                           "deleted or its column seq changed")
            try:
                digest = sha256(b"\x00" + body).digest()
            except TypeError:
                return self._bad(seq, f"record {seq} is not stored as bytes (column body)")
            if digest != stored:
                return self._bad(seq, f"record {seq} was modified: its bytes (column body) do not hash to its stored "
                                      "hash (column hash)")
            if not (body.endswith(b"%b%d}" % (tail_head, seq)) and body.startswith(prefix)):
                return self._bad(*_diagnose(seq, body, tail_head[len(PREV_MARK) : -len(SEQ_MARK)].decode()))
            if strict and (problem := _entry_problem(body)):
                return self._bad(seq, f"record {seq} {problem}")
            append(digest)
            tail_head = b"%b%b%b" % (PREV_MARK, digest.hex().encode("ascii"), SEQ_MARK)
            expected += 1
            if seq == next_stop:
                if (bad := self._reach(seq)) is not None:
                    return bad
                next_stop = self._next_stop()
        if expected > 1:
            self.last_hash = digest
        return self._finish(expected - 1)

    def _reach(self, size: int) -> VerifyReport | None:
        """Compare the tree with every anchor at `size` (the walk has just reached it)."""
        while self.pending < len(self.anchors) and self.anchors[self.pending].size == size:
            if (bad := self._compare(self.anchors[self.pending])) is not None:
                return bad
            self.pending += 1
        return None

    def _next_stop(self) -> int:
        return self.anchors[self.pending].size if self.pending < len(self.anchors) else -1

    def _finish(self, size: int) -> VerifyReport:
        left = self.anchors[self.pending :]
        if left:
            anchor = max(left, key=lambda a: (a.label == "checkpoint", a.size))
            return self._bad(
                size + 1, f"ledger has {size} records but {anchor.label} at size {anchor.size} — truncated"
            )
        return VerifyReport(True, size, None, "", self.frontier.root(), self.checked)

    def _compare(self, anchor: _Anchor) -> VerifyReport | None:
        if self.frontier.root() == anchor.root:
            self.checked += 1
            self.good_size = anchor.size
            return None
        return VerifyReport(
            False,
            self.frontier.size,
            None,
            f"records 1..{anchor.size} do not match the {anchor.label} at size {anchor.size}: history was "
            f"rewritten (a fork), somewhere in records {self.good_size + 1}..{anchor.size}",
            self.frontier.root(),
            self.checked,
        )

    def _bad(self, seq: int, problem: str) -> VerifyReport:
        return VerifyReport(False, self.frontier.size, seq, problem, self.frontier.root(), self.checked)


def _diagnose(seq: int, body: bytes, prev: str) -> tuple[int, str]:
    """Explain why a record whose hash matches does not fit the chain at `seq`."""
    try:
        parsed = parse_record(body)
    except ValueError as exc:
        return seq, f"record {seq} is malformed: it {exc}"
    if parsed.seq == seq - 1:
        return seq - 1, (
            f"record {seq} holds the record written as seq {seq - 1}: a record was inserted at seq {seq - 1} "
            "(or records were renumbered)"
        )
    if parsed.seq != seq:
        return seq, (
            f"record {seq} holds the record written as seq {parsed.seq}: records were reordered, "
            "renumbered or removed"
        )
    if seq == 1:
        return 1, "record 1 does not start the chain (its prev is not 64 zeros)"
    return seq - 1, (
        f"record {seq} does not link to record {seq - 1}: record {seq - 1} was changed after "
        f"record {seq} was written (its stored hash was rewritten to match)"
    )


def _entry_problem(body: bytes) -> str:
    entry = parse_record(body).entry
    try:
        value = json.loads(entry)
    except ValueError:
        return "holds an entry that is not JSON"
    if not isinstance(value, dict):
        return "holds an entry that is not a JSON object"
    try:
        canonical = canonical_bytes(value)
    except NotCanonicalizable:
        return "holds an entry that is not I-JSON"
    return "" if canonical == entry else "holds an entry that is not in canonical (RFC 8785) form"


class VerifyStamp(BaseModel):
    """What the last passing `dharma audit verify` of a ledger file covered (`<ledger>.verified`).

    A reminder for the auditor's queries, not evidence: whoever can edit the ledger can edit it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int
    root: str
    verified_at: str


def stamp_path(ledger: Path) -> Path:
    return ledger.with_name(ledger.name + ".verified")


def write_stamp(ledger: Path, report: VerifyReport) -> None:
    """Record a passing verification beside the ledger file; a ledger directory we cannot write is only logged."""
    if not report.ok:
        return
    stamp = VerifyStamp(size=report.size, root=report.root.hex(), verified_at=datetime.now(UTC).isoformat(timespec="seconds"))
    target = stamp_path(ledger)
    scratch = target.with_name(target.name + ".tmp")
    try:
        scratch.write_text(stamp.model_dump_json() + "\n", encoding="utf-8")
        os.replace(scratch, target)
    except OSError as exc:
        log.warning("ledger.verify_stamp_not_written", path=str(target), error=str(exc))


def unverified_note(ledger: Path, size: int) -> str:
    """"" when a passing verify covered all `size` records, else a sentence saying what was not verified."""
    try:
        stamp = VerifyStamp.model_validate_json(stamp_path(ledger).read_bytes())
    except FileNotFoundError:
        since = "ever (no passing `dharma audit verify` on record)"
    except (OSError, ValidationError) as exc:
        since = f"reliably ({stamp_path(ledger)} is unreadable: {str(exc).splitlines()[0]})"
    else:
        if stamp.size >= size:
            return ""
        since = f"since {stamp.verified_at} (records {stamp.size + 1}..{size} are new)"
    return (
        f"{ledger} has not been verified {since}: a record whose index was edited can be missing from "
        "these results; only `dharma audit verify` proves none is"
    )


@dataclass(frozen=True, slots=True)
class OutcomeReport:
    """Two-phase records checked: what `check_outcomes` found.

    `unknown`: seqs of decision records no outcome record answers (the gateway stopped mid-call,
    or, on a live ledger, the call is still running): not tampering. `dangling`: seqs of outcome
    records whose `decision_seq` names no earlier, unanswered decision record of the same request:
    the ledger contradicts itself.
    """

    decisions: int
    unknown: tuple[int, ...]
    dangling: tuple[int, ...]


_KIND_MARKS = (b'"kind":"' + KIND_DECISION.encode() + b'"', b'"kind":"' + KIND_OUTCOME.encode() + b'"')


def check_outcomes(reader: LedgerReader) -> OutcomeReport:
    """Pair every decision record with its outcome record, in one pass over the records.

    Only records whose bytes hold a `"kind":` mark are parsed (the mark can also sit inside the
    arguments, so the parsed top-level `kind` decides). Run it after `verify_ledger` passed.
    """
    waiting: dict[int, object] = {}
    decisions = 0
    dangling: list[int] = []
    for seq, _, body in reader.iter_records():
        if not any(mark in body for mark in _KIND_MARKS):
            continue
        try:
            entry = json.loads(parse_record(body).entry)
        except ValueError:
            continue
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if kind == KIND_DECISION:
            decisions += 1
            waiting[seq] = entry.get("request_id")
        elif kind == KIND_OUTCOME:
            linked = entry.get("decision_seq")
            if type(linked) is int and linked in waiting and waiting[linked] == entry.get("request_id"):
                del waiting[linked]
            else:
                dangling.append(seq)
    return OutcomeReport(decisions, tuple(waiting), tuple(dangling))
