"""Export bundles, verified offline with only a JWKS; periodic checkpoints of the ledger writer.

Each test runs on both backends (`ledger_backend`: a SQLite file, a PostgreSQL database)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import CheckpointSchedule, CheckpointSigner, checkpoint_jwk, parse_checkpoint, sign_checkpoint, verify_checkpoint_jwks
from audit.errors import LedgerError
from audit.export import BUNDLE_FORMAT, verify_bundle, write_bundle
from audit.merkle import leaf_hash, root_hash, verify_consistency, verify_inclusion
from gateway.crypto.receipts import KeyStore
from tests.audit.conftest import Location, attacker, fill, open_ledger, open_reader
from tests.audit.test_tamper import cli

ORIGIN = "test/karma"
NAME = "dharma-gateway"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def jwks_of(key: Ed25519PrivateKey) -> dict[str, Any]:
    return {"keys": [checkpoint_jwk(NAME, key.public_key())]}


def note_at(location: Location, key: Ed25519PrivateKey, size: int | None = None) -> str:
    with open_reader(location) as reader:
        n = reader.size() if size is None else size
        return sign_checkpoint(ORIGIN, n, root_hash(reader.leaf_hashes(n)), key, NAME)


def export(location: Location, out: Path, key: Ed25519PrivateKey, *, since: str | None = None) -> None:
    with open_reader(location) as reader, out.open("w", encoding="utf-8") as fh:
        write_bundle(reader, fh, checkpoint=note_at(location, key), jwks=jwks_of(key), since=since)


async def wait_for_checkpoint(path: Location, size: int, timeout: float = 20.0) -> list[int]:
    """Wait for the positive signal: a stored checkpoint at `size` (never a fixed sleep)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        with open_reader(path) as reader:
            sizes = [s for s, _ in reader.checkpoints()]
        if size in sizes:
            return sizes
        assert asyncio.get_running_loop().time() < deadline, f"no checkpoint at size {size}; stored: {sizes}"
        await asyncio.sleep(0.01)


# ---- periodic checkpoints ------------------------------------------------------------------


async def test_writer_signs_a_checkpoint_once_a_second_passed_and_the_tree_grew(ledger_backend: Location, key: Ed25519PrivateKey) -> None:
    clock = FakeClock()
    ledger = await open_ledger(ledger_backend, checkpoint_signer=CheckpointSigner(key, NAME, ORIGIN), clock=clock)
    try:
        await fill(ledger, 3)
        with open_reader(ledger_backend) as reader:
            assert reader.checkpoints() == []  # under a second on the writer's clock: none yet
        clock.advance(1.0)
        assert await wait_for_checkpoint(ledger_backend, 3) == [3]  # the idle writer notices on its own
        clock.advance(5.0)
        await fill(ledger, 2, start=3)
        assert await wait_for_checkpoint(ledger_backend, 5) == [3, 5]  # signed right after the batch committed
        await fill(ledger, 1, start=5)  # less than a second since: this one waits for the next one (here: close)
    finally:
        await ledger.aclose()
    with open_reader(ledger_backend) as reader:
        notes = dict(reader.checkpoints())
        assert sorted(notes) == [3, 5, 6]
        assert parse_checkpoint(notes[6]).root == root_hash(reader.leaf_hashes(6))


async def test_an_idle_writer_signs_within_the_interval_and_on_close(ledger_backend: Location, key: Ed25519PrivateKey) -> None:
    ledger = await open_ledger(ledger_backend, checkpoint_signer=CheckpointSigner(key, NAME, ORIGIN), checkpoint_interval=0.05)
    try:
        await fill(ledger, 4)
        await wait_for_checkpoint(ledger_backend, 4)  # no further append: the idle writer signed on its own
        clock = FakeClock()
    finally:
        await ledger.aclose()
    slow = await open_ledger(ledger_backend, checkpoint_signer=CheckpointSigner(key, NAME, ORIGIN), clock=clock)
    await fill(slow, 2, start=4)
    await slow.aclose()  # the interval never passed on this clock: only close signs
    with open_reader(ledger_backend) as reader:
        assert [s for s, _ in reader.checkpoints()] == [4, 6]


async def test_a_failing_checkpoint_store_never_fails_the_appends(ledger_backend: Location, key: Ed25519PrivateKey) -> None:
    clock = FakeClock()
    ledger = await open_ledger(ledger_backend, checkpoint_signer=CheckpointSigner(key, "bad name", ORIGIN), clock=clock)
    try:
        clock.advance(2.0)
        await fill(ledger, 3)  # signing fails (a key name with a space): the records are still committed
        assert ledger.size == 3
    finally:
        await ledger.aclose()
    with open_reader(ledger_backend) as reader:
        assert reader.size() == 3 and reader.checkpoints() == []


def test_the_schedule_counts_the_interval_from_when_a_checkpoint_fell_due(key: Ed25519PrivateKey) -> None:
    """A slow store must not push the next periodic checkpoint back: the interval runs from the
    moment the writer decided to sign. Nothing is due while the tree did not grow."""
    clock = FakeClock()
    schedule = CheckpointSchedule(CheckpointSigner(key, NAME, ORIGIN), 1.0, clock)
    assert schedule.wait_for(0) is None and not schedule.due(0, final=True)  # an empty tree: nothing to sign
    assert schedule.wait_for(3) == 1.0 and not schedule.due(3, final=False)
    assert schedule.due(3, final=True)  # close signs whatever the clock says
    clock.advance(1.0)
    assert schedule.due(3, final=False)
    clock.advance(5.0)  # the store took five seconds
    schedule.signed(3)
    assert schedule.wait_for(3) is None and not schedule.due(3, final=True)
    assert schedule.due(5, final=False)  # one interval after it fell due, not after the store returned
    schedule.failed()
    assert not schedule.due(5, final=False) and schedule.wait_for(5) == 1.0


# ---- bundles -------------------------------------------------------------------------------


@pytest.fixture
async def bundle(ledger_backend: Location, key: Ed25519PrivateKey, tmp_path: Path) -> Path:
    ledger = await open_ledger(ledger_backend)
    await fill(ledger, 9)
    await ledger.aclose()
    out = tmp_path / "export.jsonl"
    export(ledger_backend, out, key)
    return out


def edit(src: Path, dst: Path, change: Any) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()
    change(lines)
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst


def record_line(lines: list[str], seq: int) -> dict[str, Any]:
    return json.loads(lines[seq])


def test_a_bundle_verifies_with_only_the_published_key(bundle: Path, key: Ed25519PrivateKey) -> None:
    lines = bundle.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["format"] == BUNDLE_FORMAT and header["size"] == 9 and len(lines) == 10
    body = base64.b64decode(record_line(lines, 1)["record"])
    assert body.startswith(b'{"entry":') and body.endswith(b',"seq":1}')
    report = verify_bundle(bundle, jwks_of(key))
    assert report.ok and report.size == 9 and report.root == parse_checkpoint(header["checkpoint"]).root, report.problem
    stranger = verify_bundle(bundle, jwks_of(Ed25519PrivateKey.generate()))
    assert not stranger.ok and "line 1: checkpoint" in stranger.problem and "signed by none" in stranger.problem


def _set_record(seq: int, **fields: Any) -> Any:
    def change(lines: list[str]) -> None:
        doc = json.loads(lines[seq])
        doc.update(fields)
        lines[seq] = json.dumps(doc)
    return change


def _edit_body(seq: int) -> Any:
    def change(lines: list[str]) -> None:
        doc = json.loads(lines[seq])
        doc["record"] = base64.b64encode(base64.b64decode(doc["record"]).replace(b"req-", b"REQ-", 1)).decode()
        lines[seq] = json.dumps(doc)
    return change


def _header(**fields: Any) -> Any:
    def change(lines: list[str]) -> None:
        lines[0] = json.dumps({**json.loads(lines[0]), **fields})
    return change


@pytest.mark.parametrize(("name", "change", "words"), [
    ("edited record", _edit_body(4), "line 5): record 4 was modified"),
    ("edited hash", _set_record(4, hash="00" * 32), "line 5): record 4 was modified"),
    ("deleted record", lambda lines: lines.pop(3), "record 3 is missing"),
    ("reordered records", lambda lines: lines.insert(3, lines.pop(4)), "record 3 is missing"),
    ("truncated", lambda lines: lines.pop(), "truncated"),
    ("extra record", lambda lines: lines.append(lines[9]), "record 10 is missing"),
    ("not JSON", lambda lines: lines.__setitem__(6, "{oops"), "line 7: not a JSON object"),
    ("bad base64", _set_record(2, record="***"), "line 3 (record 2): 'record' is not base64"),
    ("forged root", _header(checkpoint="x\n9\n" + base64.b64encode(b"\0" * 32).decode() + "\n\n\u2014 dharma-gateway AAAAAAAA\n"),
     "line 1: checkpoint"),
    ("header size", _header(size=8), "line 1: header says"),
])
def test_an_edited_bundle_fails_naming_what_and_where(bundle: Path, key: Ed25519PrivateKey, tmp_path: Path,
                                                      name: str, change: Any, words: str) -> None:
    edited = edit(bundle, tmp_path / "edited.jsonl", change)
    report = verify_bundle(edited, jwks_of(key))
    assert not report.ok, name
    assert words in report.problem and str(edited) in report.problem, report.problem


async def test_consistency_from_an_old_checkpoint_is_proven_and_a_fork_refused(ledger_backend: Location, key: Ed25519PrivateKey, tmp_path: Path) -> None:
    ledger = await open_ledger(ledger_backend)
    await fill(ledger, 5)
    await ledger.aclose()
    old = note_at(ledger_backend, key)
    ledger = await open_ledger(ledger_backend)
    await fill(ledger, 8, start=5)
    await ledger.aclose()
    out = tmp_path / "since.jsonl"
    export(ledger_backend, out, key, since=old)
    report = verify_bundle(out, jwks_of(key))
    assert report.ok and report.since_size == 5 and report.size == 13, report.problem

    def bad_proof(lines: list[str]) -> None:
        header = json.loads(lines[0])
        header["since"]["consistency_proof"][0] = "11" * 32
        lines[0] = json.dumps(header)
    broken = verify_bundle(edit(out, tmp_path / "proof.jsonl", bad_proof), jwks_of(key))
    assert not broken.ok and "line 1: the consistency proof from the old checkpoint (size 5)" in broken.problem

    conn = attacker(ledger_backend)  # rewrite history below the old checkpoint
    conn.execute("UPDATE records SET hash = ? WHERE seq = 2", (bytes(32),))
    conn.close()
    rewritten = note_at(ledger_backend, key)  # a checkpoint signed over the rewritten history
    with open_reader(ledger_backend) as reader, (tmp_path / "fork.jsonl").open("w") as fh:
        with pytest.raises(LedgerError, match=r"not a continuation of the history it signed \(a fork\)"):
            write_bundle(reader, fh, checkpoint=rewritten, jwks=jwks_of(key), since=old)
        with pytest.raises(LedgerError, match="records 1..5 do not give the root"):
            write_bundle(reader, fh, checkpoint=old, jwks=jwks_of(key))


# ---- the auditor's CLI on either backend ---------------------------------------------------


async def test_cli_proof_and_export_of_a_ledger_on_either_backend(ledger_backend: Location, state_root: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`audit proof` and `audit export --ledger LOCATION` give proofs and a bundle an outsider checks with the
    JWKS alone; a tampered ledger is refused with a message naming it, never a traceback."""
    keys = KeyStore.open(state_root, create=True)
    jwks = keys.jwks()
    signer = CheckpointSigner(keys.checkpoint_key, keys.checkpoint_key_name, ORIGIN)
    ledger = await open_ledger(ledger_backend, checkpoint_signer=signer)
    await fill(ledger, 6)
    await ledger.aclose()  # close signs the checkpoint at 6
    with open_reader(ledger_backend) as reader:
        [(size, old_note)] = reader.checkpoints()
        leaf2 = leaf_hash(reader.get(2).body)  # type: ignore[union-attr]
    assert size == 6

    code, out = cli(capsys, "audit", "proof", "--ledger", ledger_backend, "--inclusion", "2")
    assert code == 0, out
    doc = json.loads(out)
    anchor = verify_checkpoint_jwks(doc["checkpoint"], jwks)
    assert (doc["tree_size"], anchor.size, doc["leaf_hash"]) == (6, 6, leaf2.hex())
    assert verify_inclusion(1, 6, leaf2, [bytes.fromhex(h) for h in doc["proof"]], anchor.root)
    code, out = cli(capsys, "audit", "proof", "--ledger", ledger_backend, "--consistency", "2", "6")
    assert code == 0, out
    doc = json.loads(out)
    anchor = verify_checkpoint_jwks(doc["checkpoint"], jwks)
    assert verify_consistency(2, 6, bytes.fromhex(doc["old_root"]), anchor.root, [bytes.fromhex(h) for h in doc["proof"]])

    old = tmp_path / "old.txt"
    old.write_text(old_note, encoding="utf-8")
    grown = await open_ledger(ledger_backend)  # grows with no checkpoint: export signs the head itself
    await fill(grown, 3, start=6)
    await grown.aclose()
    bundle = tmp_path / "export.jsonl"
    code, out = cli(capsys, "audit", "export", "--ledger", ledger_backend, "--out", bundle, "--since-checkpoint", old,
                    "--origin", ORIGIN)
    assert code == 0 and "exported 9 records" in out, out
    report = verify_bundle(bundle, jwks)
    assert report.ok and report.size == 9 and report.since_size == 6, report.problem

    conn = attacker(ledger_backend)
    conn.execute("UPDATE records SET body = ? WHERE seq = 8", (b'{"entry":{},"prev":"00","seq":8}',))
    conn.close()
    refused = tmp_path / "refused.jsonl"
    code, out = cli(capsys, "audit", "export", "--ledger", ledger_backend, "--out", refused)
    assert code == 1 and out.startswith("FAIL") and "record 8" in out and "nothing exported" in out, out
    assert not refused.exists()
