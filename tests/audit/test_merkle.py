"""RFC 9162 Merkle tree: reference vectors and an exhaustive property test for n <= 40."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from audit.merkle import (
    EMPTY_ROOT,
    CompactRange,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_hash,
    verify_consistency,
    verify_inclusion,
)

# RFC 6962 reference data (certificate-transparency test vectors).
CT_DATA = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f",
)]
CT_LEAVES = [leaf_hash(d) for d in CT_DATA]
CT_ROOTS = [bytes.fromhex(h) for h in (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
)]
CT_INCLUSION = [
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
]
CT_CONSISTENCY = [
    (2, 8, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
]

N = 40
LEAVES = [leaf_hash(b"record %d" % i) for i in range(N)]


def reference_mth(leaves: list[bytes]) -> bytes:
    """MTH written straight from RFC 9162 §2.1.1, recursively, as an independent oracle."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + reference_mth(leaves[:k]) + reference_mth(leaves[k:])).digest()


ROOTS = [reference_mth(LEAVES[:n]) for n in range(N + 1)]


def flip(h: bytes) -> bytes:
    return bytes([h[0] ^ 1]) + h[1:]


def test_hash_primitives_use_rfc_prefixes() -> None:
    assert EMPTY_ROOT == CT_ROOTS[0]
    assert leaf_hash(b"") == CT_ROOTS[1]
    assert node_hash(b"a" * 32, b"b" * 32) == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()


@pytest.mark.parametrize("n", range(9))
def test_roots_match_the_rfc6962_vectors(n: int) -> None:
    assert root_hash(CT_LEAVES[:n]) == CT_ROOTS[n]
    assert reference_mth(CT_LEAVES[:n]) == CT_ROOTS[n]


@pytest.mark.parametrize(("index", "size", "proof"), CT_INCLUSION)
def test_inclusion_vectors(index: int, size: int, proof: list[str]) -> None:
    expected = [bytes.fromhex(h) for h in proof]
    assert inclusion_proof(CT_LEAVES, index, size) == expected
    assert verify_inclusion(index, size, CT_LEAVES[index], expected, CT_ROOTS[size])


@pytest.mark.parametrize(("old", "new", "proof"), CT_CONSISTENCY)
def test_consistency_vectors(old: int, new: int, proof: list[str]) -> None:
    expected = [bytes.fromhex(h) for h in proof]
    assert consistency_proof(CT_LEAVES, old, new) == expected
    assert verify_consistency(old, new, CT_ROOTS[old], CT_ROOTS[new], expected)


def test_compact_range_matches_the_reference_at_every_size() -> None:
    frontier = CompactRange()
    assert frontier.root() == ROOTS[0]
    for n, leaf in enumerate(LEAVES, start=1):
        frontier.append(leaf)
        assert frontier.size == n
        assert frontier.root() == ROOTS[n]
        assert frontier.copy().root() == ROOTS[n]


def test_every_inclusion_proof_verifies_and_every_mangled_one_fails() -> None:
    for n in range(1, N + 1):
        for i in range(n):
            proof = inclusion_proof(LEAVES, i, n)
            assert verify_inclusion(i, n, LEAVES[i], proof, ROOTS[n]), (i, n)
            assert not verify_inclusion(i, n, flip(LEAVES[i]), proof, ROOTS[n])
            assert not verify_inclusion(i, n, LEAVES[i], proof, flip(ROOTS[n]))
            assert not verify_inclusion(i, n, LEAVES[i], [*proof, b"\xab" * 32], ROOTS[n])
            assert not verify_inclusion(n, n, LEAVES[i], proof, ROOTS[n])
            if n > 1:
                assert not verify_inclusion((i + 1) % n, n, LEAVES[i], proof, ROOTS[n]) or LEAVES[i] == LEAVES[(i + 1) % n]
            for j in range(len(proof)):
                bad = list(proof)
                bad[j] = flip(bad[j])
                assert not verify_inclusion(i, n, LEAVES[i], bad, ROOTS[n]), (i, n, j)
            if proof:
                assert not verify_inclusion(i, n, LEAVES[i], proof[:-1], ROOTS[n])
            for other in range(1, N + 1):
                if other != n and i < other:
                    assert not verify_inclusion(i, other, LEAVES[i], proof, ROOTS[other]) or (
                        inclusion_proof(LEAVES, i, other) == proof
                    )


def test_every_consistency_proof_verifies_and_every_mangled_one_fails() -> None:
    for n in range(0, N + 1):
        for m in range(0, n + 1):
            proof = consistency_proof(LEAVES, m, n)
            assert verify_consistency(m, n, ROOTS[m], ROOTS[n], proof), (m, n)
            if 0 < m < n:
                assert not verify_consistency(m, n, flip(ROOTS[m]), ROOTS[n], proof)
                assert not verify_consistency(m, n, ROOTS[m], flip(ROOTS[n]), proof)
                assert not verify_consistency(m, n, ROOTS[m], ROOTS[n], [])
                assert not verify_consistency(m, n, ROOTS[m], ROOTS[n], proof[:-1])
                assert not verify_consistency(m, n, ROOTS[m], ROOTS[n], [*proof, b"\xcd" * 32])
                assert not verify_consistency(n, m, ROOTS[n], ROOTS[m], proof)
                for j in range(len(proof)):
                    bad = list(proof)
                    bad[j] = flip(bad[j])
                    assert not verify_consistency(m, n, ROOTS[m], ROOTS[n], bad), (m, n, j)


def test_degenerate_consistency_cases() -> None:
    assert verify_consistency(4, 4, ROOTS[4], ROOTS[4], [])
    assert not verify_consistency(4, 4, ROOTS[4], ROOTS[5], [])
    assert not verify_consistency(4, 4, ROOTS[4], ROOTS[4], [ROOTS[4]])
    assert verify_consistency(0, 8, EMPTY_ROOT, ROOTS[8], [])
    assert not verify_consistency(0, 8, ROOTS[1], ROOTS[8], [])
    assert not verify_consistency(0, 8, EMPTY_ROOT, ROOTS[8], [ROOTS[1]])


def test_a_forged_history_is_not_consistent() -> None:
    forged = list(LEAVES[:20])
    forged[3] = leaf_hash(b"forged")
    forged_root = root_hash(forged)
    for m in range(4, 20):
        proof = consistency_proof(forged, m, 20)
        assert not verify_consistency(m, 20, ROOTS[m], forged_root, proof)


def test_short_hashes_are_rejected_and_bad_ranges_raise() -> None:
    proof = inclusion_proof(CT_LEAVES, 5, 8)
    assert not verify_inclusion(5, 8, b"\x00" * 31, proof, CT_ROOTS[8])
    assert not verify_inclusion(5, 8, CT_LEAVES[5], [b"\x00" * 31, *proof[1:]], CT_ROOTS[8])
    assert not verify_inclusion(-1, 8, CT_LEAVES[5], proof, CT_ROOTS[8])
    with pytest.raises(ValueError):
        inclusion_proof(CT_LEAVES, 8, 8)
    with pytest.raises(ValueError):
        inclusion_proof(CT_LEAVES, 0, 9)
    with pytest.raises(ValueError):
        consistency_proof(CT_LEAVES, 5, 3)


# transparency-dev/merkle test vectors (hashes only, copied into tests/audit/data/tlog_vectors.json)
TLOG = json.loads((Path(__file__).parent / "data" / "tlog_vectors.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", TLOG["inclusion"], ids=lambda c: c["desc"])
def test_tlog_inclusion_vectors(case: dict[str, Any]) -> None:
    proof = [base64.b64decode(p) for p in case["proof"]]
    ok = verify_inclusion(case["leafIdx"], case["treeSize"], base64.b64decode(case["leafHash"]), proof,
                          base64.b64decode(case["root"]))
    assert ok is not case["wantErr"]
    if not case["wantErr"] and case["treeSize"] <= len(CT_LEAVES):  # the vectors' leaves are the RFC 6962 data
        assert inclusion_proof(CT_LEAVES[: case["treeSize"]], case["leafIdx"]) == proof


@pytest.mark.parametrize("case", TLOG["consistency"], ids=lambda c: c["desc"])
def test_tlog_consistency_vectors(case: dict[str, Any]) -> None:
    proof = [base64.b64decode(p) for p in case["proof"]]
    root1, root2 = base64.b64decode(case["root1"]), base64.b64decode(case["root2"])
    assert verify_consistency(case["size1"], case["size2"], root1, root2, proof) is not case["wantErr"]
    if not case["wantErr"]:
        assert consistency_proof(CT_LEAVES[: case["size2"]], case["size1"]) == proof
        assert root_hash(CT_LEAVES[: case["size1"]]) == root1 and root_hash(CT_LEAVES[: case["size2"]]) == root2
