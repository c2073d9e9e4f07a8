"""Verified inclusion and consistency proofs of the karma ledger, each anchored to a signed checkpoint.

One implementation for `dharma audit proof` and the auditor's HTTP API (`/v1/audit/records/{seq}`,
`/v1/audit/consistency`). Proofs read the stored hashes of complete subtrees (`subtrees`, heights
8, 16, …), so they cost O(log n) reads; a ledger that stores none (or a missing row) falls back to
the record hashes. Stored subtree hashes are derived data outside the chain, so none is trusted on
its own: every proof is checked (RFC 9162) against a root that a signature vouches for, namely the
newest stored checkpoint at or below the tree size whose signature by the checkpoint key verifies
(its frontier, read from the stored hashes, must give its signed root), extended with the record
hashes after it. A proof that fails that check is recomputed from the record hashes alone, and the
bad stored hashes are logged and named in the proof's `warning`: a bad stored hash never yields a
wrong proof. Without the key (or a checkpoint) the root comes from every record hash. Reads only;
the reader must be a `LedgerReader` with `leaf_range`, `subtree_hashes` and `checkpoints`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from audit import merkle
from audit.checkpoint import CheckpointSigner, verify_checkpoint
from audit.errors import LedgerError
from audit.merkle import SUBTREE_STRIDE, CompactRange

log = structlog.get_logger()
_T = TypeVar("_T")


def anchor_checkpoint(reader: Any, signer: CheckpointSigner, size: int, root: bytes) -> str:
    """The signed checkpoint at `size`: the stored one, else one signed now by `signer`.

    Raises:
        LedgerError: the stored checkpoint's signature fails, or its root is not `root` (recomputed
            from the records): the ledger was tampered with.
    """
    stored = dict(reader.checkpoints()).get(size)
    if stored is None:
        return signer.sign(size, root)
    try:
        cp = verify_checkpoint(stored, signer.private_key.public_key(), signer.key_name)
    except LedgerError as exc:
        raise LedgerError(f"stored checkpoint at size {size}: {exc}") from None
    if cp.root != root:
        raise LedgerError(f"records 1..{size} do not give the root of the stored checkpoint at size {size}: "
                          "run `dharma audit verify`")
    return str(stored)


def inclusion(reader: Any, seq: int, size: int, signer: CheckpointSigner | None = None) -> dict[str, Any]:
    """The verified inclusion proof of record `seq` in the tree of the first `size` records (1 <= seq <= size).

    `signer`'s public key lets a stored checkpoint vouch for the root (see the module docstring).

    Raises:
        LedgerError: the record's bytes do not hash to its stored leaf, records are missing, or the
            records do not give the root of a stored signed checkpoint: no proof holds.
    """
    record = reader.get(seq)
    if record is None or not 1 <= seq <= size:
        raise LedgerError(f"record {seq}: the ledger has no records 1..{size} to prove it in (truncated?)")
    leaf = merkle.leaf_hash(record.body)
    if reader.leaf_range(seq - 1, seq) != [leaf]:
        raise LedgerError(f"record {seq}: its bytes do not hash to its stored leaf, so no proof holds")

    def build(tree: _Tree) -> tuple[bytes, list[bytes]] | None:
        root = _trusted_root(reader, tree, size, signer)
        proof = merkle.inclusion_path(tree.mth, seq - 1, size)
        return (root, proof) if root is not None and merkle.verify_inclusion(seq - 1, size, leaf, proof, root) else None

    (root, proof), warning = _checked(reader, build, f"the inclusion proof of record {seq} in {size} records")
    doc = {"type": "inclusion", "seq": seq, "leaf_index": seq - 1, "tree_size": size,
           "leaf_hash": leaf.hex(), "root": root.hex(), "proof": [p.hex() for p in proof]}
    return doc | ({"warning": warning} if warning else {})


def consistency(reader: Any, old: int, size: int, signer: CheckpointSigner | None = None) -> dict[str, Any]:
    """The verified consistency proof from the tree of `old` records to that of `size` (0 <= old <= size),
    with the checkpoint stored at `old` (or None).

    Raises:
        LedgerError: the proof does not verify even from the record hashes alone.
    """
    def build(tree: _Tree) -> tuple[bytes, bytes, list[bytes]] | None:
        # Only the new root needs a voucher: a consistency proof that verifies against it proves the
        # old root (RFC 9162 §2.1.4), so that one may come from the stored hashes.
        root, old_root = _trusted_root(reader, tree, size, signer), tree.mth(0, old) if old else merkle.EMPTY_ROOT
        if root is None:
            return None
        proof = merkle.consistency_path(tree.mth, old, size)
        return (root, old_root, proof) if merkle.verify_consistency(old, size, old_root, root, proof) else None

    (root, old_root, proof), warning = _checked(reader, build, f"the consistency proof from {old} to {size} records")
    doc = {"type": "consistency", "old_size": old, "tree_size": size, "old_root": old_root.hex(),
           "root": root.hex(), "proof": [p.hex() for p in proof], "old_checkpoint": dict(reader.checkpoints()).get(old)}
    return doc | ({"warning": warning} if warning else {})


def _checked(reader: Any, build: Callable[[_Tree], _T | None], what: str) -> tuple[_T, str]:
    """`build` over the stored subtree hashes; when its proof does not check out, again over the
    record hashes alone, with a warning naming the bad stored hashes."""
    built = build(_Tree(reader, stored=True))
    if built is not None:
        return built, ""
    built = build(_Tree(reader, stored=False))
    if built is None:
        raise LedgerError(f"{what} does not verify: the records do not give the root of the stored signed "
                          "checkpoint; run `dharma audit verify`")
    warning = (f"the ledger's stored subtree hashes do not match its records (tampered?): {what} was "
               "recomputed from the record hashes; run `dharma audit verify` to find the bad row")
    log.error("ledger.subtree_hashes_tampered", proof=what)
    return built, warning


def _trusted_root(reader: Any, tree: _Tree, size: int, signer: CheckpointSigner | None) -> bytes | None:
    """The root of the first `size` records from the newest stored checkpoint at or below `size` that
    `signer`'s key signed, extended with the record hashes after it (EMPTY_ROOT and every record hash
    without one); None when `tree` does not give that checkpoint's signed root."""
    base, base_root = 0, merkle.EMPTY_ROOT
    if signer is not None:
        public_key = signer.private_key.public_key()
        for cp_size, note in reversed(reader.checkpoints()):
            if cp_size > size:
                continue
            try:
                checkpoint = verify_checkpoint(note, public_key, signer.key_name)
            except LedgerError:
                continue  # another key's, or not a checkpoint at all: it vouches for nothing
            if checkpoint.size == cp_size:
                base, base_root = checkpoint.size, checkpoint.root
                break
    frontier = CompactRange.of(base, [tree.mth(lo, hi) for lo, hi in merkle.frontier_ranges(base)])
    if frontier.root() != base_root:
        return None
    tail = reader.leaf_range(base, size)
    if len(tail) != size - base or not all(_is_hash(h) for h in tail):
        raise LedgerError(f"records {base + 1}..{size} are missing or their hashes damaged (truncated?)")
    frontier.extend(tail)
    return frontier.root()


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == merkle.HASH_SIZE


class _Tree:
    """Merkle Tree Hashes of one ledger's subtrees (memoised): from the stored hashes of complete
    subtrees when `stored` and present, else from the record hashes."""

    def __init__(self, reader: Any, *, stored: bool) -> None:
        self._reader = reader
        self._stored = stored
        self._memo: dict[tuple[int, int], bytes] = {}

    def mth(self, lo: int, hi: int) -> bytes:
        """MTH of leaves [lo, hi), a subtree as RFC 9162's recursion names them."""
        known = self._memo.get((lo, hi))
        if known is None:
            n = hi - lo
            if n & (n - 1):
                k = 1 << ((n - 1).bit_length() - 1)
                known = merkle.node_hash(self.mth(lo, lo + k), self.mth(lo + k, hi))
            else:
                known = self._complete(lo, n.bit_length() - 1)
            self._memo[lo, hi] = known
        return known

    def _complete(self, lo: int, height: int) -> bytes:
        """MTH of the complete subtree of `height` starting at leaf `lo`: from at most 2**(STRIDE-1)
        stored hashes one stored level down, else from its record hashes."""
        level = height - height % SUBTREE_STRIDE
        if self._stored and level:
            wanted = 1 << (height - level)
            hashes = self._reader.subtree_hashes(level, lo >> level, (lo >> level) + wanted)
            if len(hashes) == wanted and all(_is_hash(h) for h in hashes):
                return merkle.root_hash(hashes)
        leaves = self._reader.leaf_range(lo, lo + (1 << height))
        if len(leaves) != 1 << height or not all(_is_hash(h) for h in leaves):
            raise LedgerError(f"records {lo + 1}..{lo + (1 << height)} are missing or their hashes damaged (truncated?)")
        return merkle.root_hash(leaves)


def check_inclusion(body: bytes, doc: dict[str, Any], note: str, public_key: Any, key_name: str) -> str:
    """Check an inclusion proof as an auditor would, trusting only the checkpoint key: the note's
    signature, its size and root, and the audit path from the record's own bytes to that root.
    Returns what was proven; raises LedgerError naming the first check that fails."""
    checkpoint = verify_checkpoint(note, public_key, key_name)
    seq, size = int(doc["seq"]), int(doc["tree_size"])
    if checkpoint.size != size or checkpoint.root.hex() != doc["root"]:
        raise LedgerError(f"the proof is for {size} records and root {doc['root']}, not the signed checkpoint's "
                          f"{checkpoint.size} records and root {checkpoint.root.hex()}")
    path = [bytes.fromhex(p) for p in doc["proof"]]
    if not merkle.verify_inclusion(seq - 1, size, merkle.leaf_hash(body), path, checkpoint.root):
        raise LedgerError(f"record {seq}: its bytes and the audit path do not give the signed root")
    return f"record {seq} is leaf {seq - 1} of the {size}-record tree whose root the checkpoint signed by {key_name!r} vouches for"
