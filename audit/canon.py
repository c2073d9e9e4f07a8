"""RFC 8785 canonical JSON and the digests taken over it. The one place both packages hash JSON."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


class NotCanonicalizable(ValueError):
    """The value is not I-JSON (NaN, infinity, an integer beyond 2**53, a non-JSON type)."""


def canonical_bytes(value: Any) -> bytes:
    """Return the RFC 8785 (JCS) encoding of `value`."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise NotCanonicalizable(f"not canonical JSON: {exc}") from exc


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """SHA-256 (lowercase hex) of the canonical JSON of `value`."""
    return sha256_hex(canonical_bytes(value))
