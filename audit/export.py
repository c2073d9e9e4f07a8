"""Export bundles of the karma ledger: one self-contained file an outsider verifies offline.

Format `dharma-ledger-export/1`, JSON lines (UTF-8, one JSON object a line):

    line 1      the header:
                {"format": "dharma-ledger-export/1", "origin": <checkpoint origin>, "size": N,
                 "checkpoint": <C2SP signed note of the tree of records 1..N>,
                 "since": null | {"checkpoint": <an older signed note, size M <= N>,
                                  "consistency_proof": [<hex hash>, ...]},
                 "jwks": <the gateway's public JWKS: receipt keys and the checkpoint key>,
                 "exported_at": <RFC 3339 UTC>}
    line 1 + n  record n, for n = 1..N, in order:
                {"seq": n, "hash": <hex leaf hash>, "record": <base64 of the canonical record bytes>}

`verify_bundle` checks, against a JWKS the auditor obtained elsewhere (the published keys; the
bundle's own `jwks` is a convenience copy and proves nothing on its own): the checkpoint's
signature by a published checkpoint key; every record's hash, its link to the one before and
its seq (`audit.verify`); that records 1..N give exactly the checkpoint's root; and, when
`since` is present, the older checkpoint's signature and the RFC 9162 consistency proof from
it to the new one. Reading is streamed; only the leaf hashes are kept for proofs.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from audit import merkle, strict_json
from audit.checkpoint import Checkpoint, parse_checkpoint, verify_checkpoint_jwks
from audit.errors import LedgerError
from audit.records import RecordFilter, StoredRecord
from audit.store import LedgerReader, RawRecord
from audit.strict_json import StrictJSONError
from audit.verify import verify_ledger

BUNDLE_FORMAT = "dharma-ledger-export/1"


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What `write_bundle` wrote: the number of records, the signed size and the old size (if any)."""

    size: int
    root: bytes
    since_size: int | None


@dataclass(frozen=True, slots=True)
class BundleReport:
    """The outcome of `verify_bundle`; `problem` names what failed and where (a line, a seq)."""

    ok: bool
    problem: str
    size: int = 0
    root: bytes = b""
    origin: str = ""
    since_size: int | None = None


def write_bundle(
    reader: LedgerReader,
    out: IO[str],
    *,
    checkpoint: str,
    jwks: dict[str, Any],
    since: str | None = None,
    now: datetime | None = None,
) -> ExportSummary:
    """Write the records covered by `checkpoint`, with proofs, as one bundle to `out`.

    `checkpoint` is a signed note of this ledger (its records 1..size must give its root);
    `since` an older one the auditor holds (its tree must be a prefix of the new one).

    Raises:
        LedgerError: a checkpoint is malformed, or the ledger does not match one of them (it
            was tampered with, or the old checkpoint belongs to another history).
    """
    cp = parse_checkpoint(checkpoint)
    leaves = _leaf_hashes(reader, cp.size)
    if merkle.root_hash(leaves) != cp.root:
        raise LedgerError(f"records 1..{cp.size} do not give the root of the checkpoint at size {cp.size}: "
                          "run `dharma audit verify`; nothing exported")
    since_doc = None
    old_size = None
    if since is not None:
        old = parse_checkpoint(since)
        if old.origin != cp.origin or old.size > cp.size:
            raise LedgerError(f"the old checkpoint ({old.origin} at size {old.size}) is not an earlier checkpoint "
                              f"of this log ({cp.origin} at size {cp.size})")
        if merkle.root_hash(leaves[: old.size]) != old.root:
            raise LedgerError(f"records 1..{old.size} do not give the root of the old checkpoint: this ledger "
                              "is not a continuation of the history it signed (a fork)")
        proof = merkle.consistency_proof(leaves, old.size, cp.size)
        since_doc = {"checkpoint": since, "consistency_proof": [p.hex() for p in proof]}
        old_size = old.size
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    header = {"format": BUNDLE_FORMAT, "origin": cp.origin, "size": cp.size, "checkpoint": checkpoint,
              "since": since_doc, "jwks": jwks, "exported_at": stamp}
    out.write(json.dumps(header, ensure_ascii=False, separators=(",", ":")) + "\n")
    for seq, digest, body in reader.iter_records():
        if seq > cp.size:
            break
        line = {"seq": seq, "hash": bytes(digest).hex(), "record": base64.b64encode(bytes(body)).decode("ascii")}
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
    return ExportSummary(cp.size, cp.root, old_size)


def _leaf_hashes(reader: LedgerReader, size: int) -> list[bytes]:
    leaves = [bytes(digest) for seq, digest, _ in reader.iter_records() if seq <= size]
    if len(leaves) != size:
        raise LedgerError(f"the ledger has {len(leaves)} records up to the checkpoint at size {size}: truncated")
    return leaves


def verify_bundle(path: Path, jwks: dict[str, Any] | None = None) -> BundleReport:
    """Check a bundle offline against `jwks` (the published keys; None: the bundle's own copy)."""
    try:
        with BundleReader(path) as reader:
            return _verify(reader, jwks)
    except LedgerError as exc:
        return BundleReport(False, str(exc))


def _verify(reader: BundleReader, jwks: dict[str, Any] | None) -> BundleReport:
    header = reader.header
    keys = header.get("jwks") if jwks is None else jwks
    where = f"{reader.path} line 1"
    try:
        cp = verify_checkpoint_jwks(_text(header, "checkpoint", where), keys)
    except LedgerError as exc:
        return BundleReport(False, f"{where}: checkpoint: {exc}")
    if header.get("size") != cp.size or header.get("origin") != cp.origin:
        return BundleReport(False, f"{where}: header says {header.get('origin')!r} at size {header.get('size')!r} "
                            f"but the signed checkpoint is {cp.origin!r} at size {cp.size}")
    since_size = None
    if header.get("since") is not None:
        try:
            since_size = _check_since(header["since"], cp, keys, where)
        except LedgerError as exc:
            return BundleReport(False, str(exc))
    report = verify_ledger(reader, cp, stored_checkpoints=False, indexes=False)  # a bundle has no query index
    if reader.problem:
        return BundleReport(False, reader.problem)
    if not report.ok:
        at = f" (line {report.first_bad_seq + 1})" if report.first_bad_seq is not None else ""
        return BundleReport(False, f"{reader.path}{at}: {report.problem}")
    if report.size != cp.size:
        return BundleReport(False, f"{reader.path} line {cp.size + 2}: {report.size - cp.size} record(s) beyond the "
                            f"signed checkpoint at size {cp.size}")
    return BundleReport(True, "", report.size, report.root, cp.origin, since_size)


def _check_since(since: object, cp: Checkpoint, keys: object, where: str) -> int:
    if not isinstance(since, dict) or not isinstance(since.get("consistency_proof"), list):
        raise LedgerError(f"{where}: 'since' must be an object with 'checkpoint' and 'consistency_proof'")
    try:
        old = verify_checkpoint_jwks(_text(since, "checkpoint", where), keys)
    except LedgerError as exc:
        raise LedgerError(f"{where}: since.checkpoint: {exc}") from None
    proof = [_hash(h, f"{where}: since.consistency_proof[{i}]") for i, h in enumerate(since["consistency_proof"])]
    if old.origin != cp.origin or not merkle.verify_consistency(old.size, cp.size, old.root, cp.root, proof):
        raise LedgerError(f"{where}: the consistency proof from the old checkpoint (size {old.size}) to the new one "
                          f"(size {cp.size}) does not verify: the log was rewritten or the proof edited")
    return old.size


def _text(doc: dict[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise LedgerError(f"{where}: {key!r} must be a signed-note string")
    return value


def _hash(value: object, where: str) -> bytes:
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != merkle.HASH_SIZE:
        raise LedgerError(f"{where} is not a 64-digit hex hash")
    return raw


def _strict_object(line: str, where: str) -> dict[str, Any]:
    """One JSON object, read with the one strict decoder (`audit.strict_json`): a line that could
    mean two things (a duplicate key, NaN, a lone surrogate) is refused, naming what."""
    try:
        value = strict_json.loads(line)
    except StrictJSONError as exc:
        raise LedgerError(f"{where}: not a JSON object ({exc})") from None
    if not isinstance(value, dict):
        raise LedgerError(f"{where}: not a JSON object")
    return value


class BundleReader:
    """A bundle read as a `LedgerReader`, streaming its record lines; reading never writes.

    A malformed record line ends the iteration and sets `problem` (naming the line).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.problem = ""
        try:
            self._file = self.path.open("r", encoding="utf-8")
        except OSError as exc:
            raise LedgerError(f"{self.path}: cannot read the bundle ({exc.strerror or exc})") from None
        try:
            self.header = _strict_object(self._file.readline(), f"{self.path} line 1: not a ledger export header")
        except UnicodeDecodeError:
            self._file.close()
            raise LedgerError(f"{self.path}: not a ledger export (not UTF-8 text)") from None
        except LedgerError:
            self._file.close()
            raise
        if self.header.get("format") != BUNDLE_FORMAT:
            self._file.close()
            raise LedgerError(f"{self.path} line 1: format is {self.header.get('format')!r}, expected {BUNDLE_FORMAT!r}")
        self._start = self._file.tell()

    def __enter__(self) -> BundleReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def size(self) -> int:
        return sum(1 for _ in self.iter_records())

    def iter_records(self, start: int = 1) -> Iterator[RawRecord]:
        self._file.seek(self._start)
        self.problem = ""
        number = 1
        try:
            for number, line in enumerate(self._file, start=2):
                if not line.strip():
                    continue
                seq, digest, body = self._record(line, f"{self.path} line {number}")
                if seq >= start:
                    yield seq, digest, body
        except UnicodeDecodeError:
            self.problem = f"{self.path} line {number + 1}: not UTF-8 text"
        except LedgerError as exc:
            self.problem = str(exc)

    @staticmethod
    def _record(line: str, where: str) -> RawRecord:
        doc = _strict_object(line, where)
        seq = doc.get("seq")
        if type(seq) is not int or seq < 1:
            raise LedgerError(f"{where}: 'seq' must be a whole number >= 1")
        digest = _hash(doc.get("hash"), f"{where} (record {seq}): 'hash'")
        try:
            body = base64.b64decode(str(doc.get("record")), validate=True)
        except (binascii.Error, ValueError):
            raise LedgerError(f"{where} (record {seq}): 'record' is not base64") from None
        return seq, digest, body

    def get(self, seq: int) -> StoredRecord | None:
        for found, digest, body in self.iter_records(seq):
            return StoredRecord(found, digest.hex(), body) if found == seq else None
        return None

    def latest_checkpoint(self) -> str | None:
        note = self.header.get("checkpoint")
        return note if isinstance(note, str) else None

    def checkpoints(self) -> list[tuple[int, str]]:
        note = self.latest_checkpoint()
        return [] if note is None else [(int(self.header.get("size") or 0), note)]

    def select_records(self, where: RecordFilter) -> Iterator[RawRecord]:
        raise LedgerError(f"{self.path}: a bundle is not indexed; query the ledger, or read the bundle's records")

