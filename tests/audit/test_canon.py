"""The fast canonical-JSON path must give byte-for-byte the RFC 8785 encoding."""

from __future__ import annotations

import random

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.canon import NotCanonicalizable, plain, canonical_bytes

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


#: Every code point class the fast path must encode as RFC 8785 does: controls, escapes, DEL,
#: line separators, BMP private use and the top of the BMP, astral characters and lone surrogates.
_text = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=12) | st.sampled_from(
    ["\x00", "\x1f", "\x7f", "\u2028", "\ud800", "\udfff", "\ue000", "\uffff", "\U0001f600", '"\\/'])
_safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
_json = st.recursive(
    st.none() | st.booleans() | _safe_ints | _text | st.integers(min_value=2**53 - 3, max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=24,
)


def _reference(value):
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError):
        return None


@settings(max_examples=600, deadline=None)
@given(_json)
def test_canonical_bytes_is_rfc8785_on_generated_values(value):
    """Byte-identical to the rfc8785 package wherever it encodes, and refused wherever it refuses."""
    expected = _reference(value)
    if expected is None:
        with pytest.raises(NotCanonicalizable):
            canonical_bytes(value)
    else:
        assert canonical_bytes(value) == expected


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | _safe_ints | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=16))
def test_plain_values_take_the_fast_path(value):
    """Values of only JSON types and safe integers are recognised as plain (so the fast encoder runs)."""
    assert plain(value)


@pytest.mark.parametrize("value", [{"a": (1, 2)}, [1.0], {"k": 2**53}, [-(2**53)], {"s": True, 3: 1}, [[[{"x": 0.5}]]]])
def test_values_with_other_types_leave_the_fast_path(value):
    assert not plain(value)
