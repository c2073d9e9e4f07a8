"""RFC 8785 canonical JSON and the digests taken over it. The one place both packages hash JSON.

Most values the gateway hashes (ledger entries, arguments, envelopes) hold no floats, so they
take a fast path: `json.dumps` with sorted keys produces exactly the RFC 8785 bytes when every
number is an integer within ±2**53, every key is a string without characters beyond the BMP
(JCS sorts keys by UTF-16 code units, Python by code points: they differ only there), and no
string holds a lone surrogate. Anything else goes through the `rfc8785` package.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

_SAFE_INT = 2**53 - 1
_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")).encode


class NotCanonicalizable(ValueError):
    """The value is not I-JSON (NaN, infinity, an integer beyond 2**53, a non-JSON type)."""


def _plain(value: Any) -> bool:
    """Whether `json.dumps(sort_keys=True)` gives the RFC 8785 bytes for `value`."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -_SAFE_INT <= value <= _SAFE_INT
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or max(key) < "\U00010000"):
                return False
            if not _plain(item):
                return False
        return True
    if kind is list:
        return all(_plain(item) for item in value)
    return False


def canonical_bytes(value: Any) -> bytes:
    """Return the RFC 8785 (JCS) encoding of `value`."""
    if _plain(value):
        try:
            return _dumps(value).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: let rfc8785 refuse it with its own message
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise NotCanonicalizable(f"not canonical JSON: {exc}") from exc


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """SHA-256 (lowercase hex) of the canonical JSON of `value`."""
    return sha256_hex(canonical_bytes(value))
