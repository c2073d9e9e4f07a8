"""RFC 9162 Merkle tree hashing, the compact range, and inclusion/consistency proofs.

Leaves here are leaf *hashes* (`leaf_hash(record_bytes)`), 32 bytes each. Pure: no I/O.
Proof generation takes a function giving the Merkle Tree Hash of any subtree (`Subtree`), so
a ledger that stores the hashes of complete subtrees (`SUBTREE_STRIDE`) answers in O(log n)
reads; given plain leaf hashes it costs O(n). Verification is O(log n) and follows RFC 9162 §2.1.3.2 and §2.1.4.2 step by step (the inner shift loops
included: leaving them out accepts some forged proofs and rejects good ones).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

SUBTREE_STRIDE = 8
"""Ledgers store the hash of every complete aligned subtree whose height is a positive multiple of
this (256, 65,536, … leaves): a proof then reads O(log n) hashes (like C2SP tlog-tiles' 256-wide tiles)."""

Subtree = Callable[[int, int], bytes]
"""MTH of leaves [lo, hi) of a tree, for the subtrees a proof needs (lo is a multiple of the
largest power of two below hi - lo, as RFC 9162's recursion produces them)."""

CompletedSubtree = tuple[int, int, bytes]
"""(height, index, hash) of the complete subtree over leaves [index * 2**height, (index + 1) * 2**height)."""

_sha256 = hashlib.sha256
_STRIDE_MASK = (1 << SUBTREE_STRIDE) - 1  # a size ending in these bits completes a stored-height subtree on append


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

    __slots__ = ("_nodes", "_size", "completed")

    def __init__(self) -> None:
        self._nodes: list[bytes] = []
        self._size = 0
        self.completed: list[CompletedSubtree] | None = None
        """When a list, every subtree of a height that is a multiple of SUBTREE_STRIDE completed
        by `append` is added to it (what the ledger stores)."""

    @property
    def size(self) -> int:
        return self._size

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash at the right edge."""
        nodes = self._nodes
        nodes.append(leaf)
        s = self._size
        if s & _STRIDE_MASK == _STRIDE_MASK and self.completed is not None:
            self._merge_collecting(s)
        else:
            while s & 1:
                right = nodes.pop()
                nodes[-1] = _sha256(b"\x01" + nodes[-1] + right).digest()
                s >>= 1
        self._size += 1

    def _merge_collecting(self, s: int) -> None:
        """`append`'s merges when they complete a stored-height subtree, noting each such subtree."""
        nodes, height = self._nodes, 0
        while s & 1:
            right = nodes.pop()
            nodes[-1] = _sha256(b"\x01" + nodes[-1] + right).digest()
            s >>= 1
            height += 1
            if not height % SUBTREE_STRIDE:
                self.completed.append((height, s, nodes[-1]))  # type: ignore[union-attr]

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

    @classmethod
    def of(cls, size: int, nodes: Sequence[bytes]) -> CompactRange:
        """The frontier of a tree of `size` leaves given its perfect subtrees' roots, largest first."""
        if len(nodes) != size.bit_count():
            raise ValueError(f"a tree of size {size} has {size.bit_count()} frontier nodes, not {len(nodes)}")
        frontier = cls()
        frontier._nodes = list(nodes)
        frontier._size = size
        return frontier

    def extend_collecting(self, leaves: Sequence[bytes]) -> list[CompletedSubtree]:
        """Append `leaves` and return the stored-height subtrees they complete."""
        self.completed = []
        try:
            self.extend(leaves)
            return self.completed
        finally:
            self.completed = None


def frontier_ranges(size: int) -> list[tuple[int, int]]:
    """The leaf ranges [lo, hi) of the perfect subtrees that make up a tree of `size` leaves, largest first."""
    ranges, lo = [], 0
    for bit in reversed(range(size.bit_length())):
        if size >> bit & 1:
            ranges.append((lo, lo + (1 << bit)))
            lo += 1 << bit
    return ranges


def root_hash(leaves: Sequence[bytes]) -> bytes:
    """Return MTH over `leaves` (leaf hashes)."""
    frontier = CompactRange()
    frontier.extend(leaves)
    return frontier.root()


def _split(n: int) -> int:
    """The largest power of two strictly less than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def leaves_subtree(leaves: Sequence[bytes]) -> Subtree:
    """The `Subtree` function of a tree given all its leaf hashes (O(hi - lo) per call)."""
    return lambda lo, hi: root_hash(leaves[lo:hi])


def inclusion_proof(leaves: Sequence[bytes], index: int, size: int | None = None) -> list[bytes]:
    """Return the audit path for leaf `index` in the tree of the first `size` leaves."""
    n = len(leaves) if size is None else size
    if not n <= len(leaves):
        raise ValueError(f"no leaf {index} in a tree of size {n}")
    return inclusion_path(leaves_subtree(leaves), index, n)


def inclusion_path(mth: Subtree, index: int, size: int) -> list[bytes]:
    """The audit path for leaf `index` in the tree of `size` leaves, reading subtree hashes from `mth`."""
    if not 0 <= index < size:
        raise ValueError(f"no leaf {index} in a tree of size {size}")
    proof: list[bytes] = []
    lo, hi, m = 0, size, index
    while hi - lo > 1:
        k = _split(hi - lo)
        if m < k:
            proof.append(mth(lo + k, hi))
            hi = lo + k
        else:
            proof.append(mth(lo, lo + k))
            lo, m = lo + k, m - k
    proof.reverse()
    return proof


def consistency_proof(leaves: Sequence[bytes], old_size: int, size: int | None = None) -> list[bytes]:
    """Return the proof that the tree of `old_size` leaves is a prefix of the tree of `size`."""
    n = len(leaves) if size is None else size
    if not n <= len(leaves):
        raise ValueError(f"no consistency proof from size {old_size} to size {n}")
    return consistency_path(leaves_subtree(leaves), old_size, n)


def consistency_path(mth: Subtree, old_size: int, size: int) -> list[bytes]:
    """The consistency proof from `old_size` to `size` leaves, reading subtree hashes from `mth`."""
    n = size
    if not 0 <= old_size <= n:
        raise ValueError(f"no consistency proof from size {old_size} to size {n}")
    if old_size in (0, n):
        return []
    proof: list[bytes] = []
    lo, hi, m, complete = 0, n, old_size, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            proof.append(mth(lo + k, hi))
            hi = lo + k
        else:
            proof.append(mth(lo, lo + k))
            lo, m, complete = lo + k, m - k, False
    if not complete:
        proof.append(mth(lo, hi))
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
