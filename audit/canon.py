"""RFC 8785 canonical JSON and the digests taken over it. The one place both packages hash JSON.

Most values the gateway hashes (ledger entries, arguments, envelopes) hold no floats, so they
take a fast path: msgspec's encoder with sorted keys produces exactly the RFC 8785 bytes when
every number is an integer within ±2**53, every key is a string, no key or string holds a
character beyond the BMP (JCS sorts keys by UTF-16 code units, msgspec by code points: they
differ only there, so any 4-byte UTF-8 sequence in the output sends the value the exact way) and
no string holds a lone surrogate (msgspec refuses it). Anything else goes through the `rfc8785`
package. tests/audit/test_canon.py holds both to the same bytes on generated values.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec
import rfc8785

_SAFE_INT = 2**53 - 1
_LEAVES = frozenset({str, bool, type(None)})
_encode = msgspec.json.Encoder(order="sorted").encode
_beyond_bmp = re.compile(rb"[\xf0-\xf4]").search


class NotCanonicalizable(ValueError):
    """The value is not I-JSON (NaN, infinity, an integer beyond 2**53, a non-JSON type)."""


def plain(value: Any) -> bool:
    """Whether `value` is made only of dicts with string keys, lists, strings, bools, None and
    integers within ±2**53 (exact types: subclasses take the exact path). Leaves are checked
    inline: one call per container, not per item."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            leaf = type(item)
            if leaf in _LEAVES:
                continue
            if leaf is int:
                if -_SAFE_INT <= item <= _SAFE_INT:
                    continue
                return False
            if not plain(item):
                return False
        return True
    if kind is list:
        for item in value:
            leaf = type(item)
            if leaf in _LEAVES:
                continue
            if leaf is int:
                if -_SAFE_INT <= item <= _SAFE_INT:
                    continue
                return False
            if not plain(item):
                return False
        return True
    if kind in _LEAVES:
        return True
    return kind is int and -_SAFE_INT <= value <= _SAFE_INT


def canonical_bytes(value: Any) -> bytes:
    """Return the RFC 8785 (JCS) encoding of `value`."""
    if plain(value):
        try:
            out = _encode(value)
        except UnicodeEncodeError:
            pass  # a lone surrogate: let rfc8785 refuse it with its own message
        else:
            if out.isascii() or _beyond_bmp(out) is None:
                return out
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise NotCanonicalizable(f"not canonical JSON: {exc}") from exc


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """SHA-256 (lowercase hex) of the canonical JSON of `value`."""
    return sha256_hex(canonical_bytes(value))
