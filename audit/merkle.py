"""RFC 9162 Merkle tree hashing, the compact range, and inclusion/consistency proofs.

Leaves here are leaf *hashes* (`leaf_hash(record_bytes)`), 32 bytes each. Pure: no I/O.
Proof generation takes the leaf hashes of the tree and costs O(n); verification is
O(log n) and follows RFC 9162 §2.1.3.2 and §2.1.4.2 step by step (the inner shift loops
included: leaving them out accepts some forged proofs and rejects good ones).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

_sha256 = hashlib.sha256


def leaf_hash(data: bytes) -> bytes:
    """Hash one leaf: SHA-256(0x00 || data)."""
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Hash an interior node: SHA-256(0x01 || left || right)."""
    return _sha256(b"\x01" + left + right).digest()


class CompactRange:
    """The right frontier of a growing tree: O(1) amortised append, O(log n) root.

    `nodes` holds the roots of the perfect subtrees that make up the tree, largest first,
    one per set bit of `size`.
    """

    __slots__ = ("_nodes", "_size")

    def __init__(self) -> None:
        self._nodes: list[bytes] = []
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash at the right edge."""
        nodes = self._nodes
        nodes.append(leaf)
        s = self._size
        while s & 1:
            right = nodes.pop()
            nodes[-1] = _sha256(b"\x01" + nodes[-1] + right).digest()
            s >>= 1
        self._size += 1

    def extend(self, leaves: Sequence[bytes]) -> None:
        for leaf in leaves:
            self.append(leaf)

    def root(self) -> bytes:
        """Return the Merkle Tree Hash of every leaf appended so far."""
        nodes = self._nodes
        if not nodes:
            return EMPTY_ROOT
        acc = nodes[-1]
        for node in reversed(nodes[:-1]):
            acc = node_hash(node, acc)
        return acc

    def copy(self) -> CompactRange:
        other = CompactRange()
        other._nodes = list(self._nodes)
        other._size = self._size
        return other


def root_hash(leaves: Sequence[bytes]) -> bytes:
    """Return MTH over `leaves` (leaf hashes)."""
    frontier = CompactRange()
    frontier.extend(leaves)
    return frontier.root()


def _split(n: int) -> int:
    """The largest power of two strictly less than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def _mth(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    return root_hash(leaves[lo:hi])


def inclusion_proof(leaves: Sequence[bytes], index: int, size: int | None = None) -> list[bytes]:
    """Return the audit path for leaf `index` in the tree of the first `size` leaves."""
    n = len(leaves) if size is None else size
    if not 0 <= index < n <= len(leaves):
        raise ValueError(f"no leaf {index} in a tree of size {n}")
    proof: list[bytes] = []
    lo, hi, m = 0, n, index
    while hi - lo > 1:
        k = _split(hi - lo)
        if m < k:
            proof.append(_mth(leaves, lo + k, hi))
            hi = lo + k
        else:
            proof.append(_mth(leaves, lo, lo + k))
            lo, m = lo + k, m - k
    proof.reverse()
    return proof


def consistency_proof(leaves: Sequence[bytes], old_size: int, size: int | None = None) -> list[bytes]:
    """Return the proof that the tree of `old_size` leaves is a prefix of the tree of `size`."""
    n = len(leaves) if size is None else size
    if not 0 <= old_size <= n <= len(leaves):
        raise ValueError(f"no consistency proof from size {old_size} to size {n}")
    if old_size in (0, n):
        return []
    proof: list[bytes] = []
    lo, hi, m, complete = 0, n, old_size, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            proof.append(_mth(leaves, lo + k, hi))
            hi = lo + k
        else:
            proof.append(_mth(leaves, lo, lo + k))
            lo, m, complete = lo + k, m - k, False
    if not complete:
        proof.append(_mth(leaves, lo, hi))
    proof.reverse()
    return proof


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    """Check an audit path (RFC 9162 §2.1.3.2)."""
    if not (0 <= index < size) or not _is_hash(leaf) or not _is_hash(root):
        return False
    if not all(_is_hash(p) for p in proof):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(
    old_size: int, size: int, old_root: bytes, root: bytes, proof: Sequence[bytes]
) -> bool:
    """Check a consistency proof (RFC 9162 §2.1.4.2, plus the trivial m = n and m = 0 cases)."""
    if not (0 <= old_size <= size) or not _is_hash(old_root) or not _is_hash(root):
        return False
    if not all(_is_hash(p) for p in proof):
        return False
    if old_size == size:
        return not proof and old_root == root
    if old_size == 0:
        return not proof and old_root == EMPTY_ROOT
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == root and sn == 0
