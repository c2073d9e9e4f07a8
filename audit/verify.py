"""Full verification of a karma ledger: recompute every record hash, the chain and the tree.

Streams the records once, in seq order, and reports the first problem with the seq it
starts at: an edited record, a missing one, reordered or renumbered ones, and, against a
checkpoint held outside the database, truncation and rewritten history (a fork). Reads
through `LedgerReader`; never writes. A chain that is consistent in itself proves nothing
about truncation or a wholesale rewrite: only a checkpoint kept elsewhere does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from audit.canon import NotCanonicalizable, canonical_bytes
from audit.checkpoint import Checkpoint, parse_checkpoint
from audit.errors import LedgerError
from audit.merkle import EMPTY_ROOT, CompactRange
from audit.records import ENTRY_PREFIX, GENESIS_PREV, KIND_DECISION, KIND_OUTCOME, PREV_MARK, SEQ_MARK, parse_record
from audit.store import LedgerReader


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of `verify_ledger`.

    `size` is the number of records found intact before the first problem (all of them
    when ok); `root` is the Merkle root over those.
    """

    ok: bool
    size: int
    first_bad_seq: int | None
    problem: str
    root: bytes
    checkpoints_checked: int = 0


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
) -> VerifyReport:
    """Recompute the ledger and compare it with `checkpoint` and the checkpoints stored in it.

    Args:
        checkpoint: a checkpoint kept outside the database (already signature-checked by
            the caller, e.g. with `verify_checkpoint`). Catches truncation and forks.
        stored_checkpoints: also compare with the checkpoints stored in the ledger itself
            (these catch accidents; an attacker with file access can rewrite them too).
        strict: also check that every entry is canonical JSON (about 20x slower).
    """
    try:
        anchors = _anchors(reader, checkpoint, stored_checkpoints)
    except LedgerError as exc:
        return VerifyReport(False, 0, None, str(exc), EMPTY_ROOT)
    return _Walk(anchors, strict).run(reader)


def _anchors(reader: LedgerReader, checkpoint: Checkpoint | None, stored: bool) -> list[_Anchor]:
    anchors: list[_Anchor] = []
    if checkpoint is not None:
        anchors.append(_Anchor(checkpoint.size, checkpoint.root, "checkpoint"))
    if stored:
        for size, note in reader.checkpoints():
            try:
                parsed = parse_checkpoint(note)
            except LedgerError as exc:
                raise LedgerError(f"stored checkpoint at size {size} is malformed: {exc}") from exc
            anchors.append(_Anchor(parsed.size, parsed.root, "stored checkpoint"))
    return sorted(anchors, key=lambda a: (a.size, a.label != "checkpoint"))


class _Walk:
    """One pass over the records; holds the running chain head and Merkle frontier."""

    def __init__(self, anchors: list[_Anchor], strict: bool) -> None:
        self.anchors = anchors
        self.strict = strict
        self.frontier = CompactRange()
        self.checked = 0
        self.good_size = 0
        self.pending = 0

    def run(self, reader: LedgerReader) -> VerifyReport:
        if (bad := self._reach(0)) is not None:
            return bad
        next_stop = self._next_stop()
        append = self.frontier.append
        sha256 = hashlib.sha256
        prefix, strict = ENTRY_PREFIX, self.strict
        tail_head = PREV_MARK + GENESIS_PREV.encode("ascii") + SEQ_MARK
        expected = 1
        for seq, stored, body in reader.iter_records():
            if seq != expected:
                return self._bad(expected, f"record {expected} is missing (the next stored record is {seq})")
            try:
                digest = sha256(b"\x00" + body).digest()
            except TypeError:
                return self._bad(seq, f"record {seq} is not stored as bytes")
            if digest != stored:
                return self._bad(seq, f"record {seq} was modified: its bytes do not hash to its stored hash")
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
