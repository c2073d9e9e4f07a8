"""Verified inclusion and consistency proofs of the karma ledger, each anchored to a signed checkpoint.

One implementation for `dharma audit proof` and the auditor's HTTP API (`/v1/audit/records/{seq}`,
`/v1/audit/consistency`): every proof is checked (RFC 9162) before it is handed out, and the
checkpoint it is anchored to is the one stored in the ledger at that size (its signature and root
checked) or, when none is stored, one signed now. Reads only; the reader must be a `LedgerReader`
with `leaf_hashes`.
"""

from __future__ import annotations

from typing import Any

from audit import merkle
from audit.checkpoint import CheckpointSigner, verify_checkpoint
from audit.errors import LedgerError


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


def inclusion(reader: Any, seq: int, size: int) -> dict[str, Any]:
    """The verified inclusion proof of record `seq` in the tree of the first `size` records (1 <= seq <= size).

    Raises:
        LedgerError: the record's bytes do not hash to its stored leaf, so no proof holds.
    """
    leaves = reader.leaf_hashes(size)
    record = reader.get(seq)
    if record is None or len(leaves) != size:
        raise LedgerError(f"record {seq}: the ledger has no records 1..{size} to prove it in (truncated?)")
    leaf = merkle.leaf_hash(record.body)
    root = merkle.root_hash(leaves)
    proof = merkle.inclusion_proof(leaves, seq - 1, size)
    if leaf != leaves[seq - 1] or not merkle.verify_inclusion(seq - 1, size, leaf, proof, root):
        raise LedgerError(f"record {seq}: its bytes do not hash to its stored leaf, so no proof holds")
    return {"type": "inclusion", "seq": seq, "leaf_index": seq - 1, "tree_size": size,
            "leaf_hash": leaf.hex(), "root": root.hex(), "proof": [p.hex() for p in proof]}


def consistency(reader: Any, old: int, size: int) -> dict[str, Any]:
    """The verified consistency proof from the tree of `old` records to that of `size` (0 <= old <= size),
    with the checkpoint stored at `old` (or None).

    Raises:
        LedgerError: the proof does not verify.
    """
    leaves = reader.leaf_hashes(size)
    root, old_root = merkle.root_hash(leaves), merkle.root_hash(leaves[:old])
    proof = merkle.consistency_proof(leaves, old, size)
    if not merkle.verify_consistency(old, size, old_root, root, proof):
        raise LedgerError(f"the consistency proof from {old} to {size} does not verify")
    return {"type": "consistency", "old_size": old, "tree_size": size, "old_root": old_root.hex(),
            "root": root.hex(), "proof": [p.hex() for p in proof], "old_checkpoint": dict(reader.checkpoints()).get(old)}
