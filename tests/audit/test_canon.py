"""The fast canonical-JSON path must give byte-for-byte the RFC 8785 encoding."""

from __future__ import annotations

import random

import pytest
import rfc8785

from audit.canon import NotCanonicalizable, canonical_bytes

ALPHABET = ["a", "Z", "é", "\u2028", "\n", "\t", "\x01", "\x7f", '"', "\\", "😀", "\ue000", "\uffff", "/", " ", "ß"]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 2**53 - 1, -(2**53 - 1), rng.randrange(-10**6, 10**6)])
    if kind in (2, 3):
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(6)))
    if kind == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {"".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 4))): random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_fast_path_matches_rfc8785_on_random_values():
    rng = random.Random(8785)
    for _ in range(3000):
        value = random_value(rng)
        assert canonical_bytes(value) == rfc8785.dumps(value), value


@pytest.mark.parametrize(
    "value",
    [
        {"\U0001f600": 1, "\ue000": 2},  # astral vs BMP-private keys: UTF-16 order differs from code points
        {"n": 1.5, "m": 1.0, "big": 1e21},
        {"a": [0.1, -0.0]},
    ],
)
def test_values_off_the_fast_path_still_match(value):
    assert canonical_bytes(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("value", [float("nan"), 2**60, {"s": "\ud800"}, {1: "int key"}, object()])
def test_non_canonical_values_are_refused(value):
    with pytest.raises(NotCanonicalizable):
        canonical_bytes(value)
